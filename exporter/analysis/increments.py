"""Counter and histogram increments one tick adds, keyed by (metric name, label values)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from exporter.snapshot import HistogramValue, SeriesKey


@dataclass
class Increments:
    """What one area adds to the integrated counters and histograms in one tick."""

    counters: dict[SeriesKey, float] = field(default_factory=dict)
    histograms: dict[SeriesKey, HistogramValue] = field(default_factory=dict)

    def count(self, name: str, labels: Sequence[str], value: float) -> None:
        """Add value to a counter series (negative values are a bug and are ignored)."""
        if value <= 0:
            key = (name, tuple(labels))
            self.counters.setdefault(key, 0.0)
            return
        key = (name, tuple(labels))
        self.counters[key] = self.counters.get(key, 0.0) + value

    def observe(
        self,
        name: str,
        labels: Sequence[str],
        bounds: Sequence[float],
        counts: Sequence[float],
        total: float,
    ) -> None:
        """Add per-bucket counts (non-cumulative, +Inf last) and their sum to a histogram series."""
        key = (name, tuple(labels))
        value = HistogramValue(tuple(bounds), tuple(float(c) for c in counts), float(total))
        prev = self.histograms.get(key)
        self.histograms[key] = value if prev is None else prev.add(value.counts, value.total)

    def merge(self, other: Increments) -> None:
        """Add another area's increments to these."""
        for key, value in other.counters.items():
            self.counters[key] = self.counters.get(key, 0.0) + value
        for key, hist in other.histograms.items():
            prev = self.histograms.get(key)
            self.histograms[key] = hist if prev is None else prev.add(hist.counts, hist.total)


def apply(
    counters: Mapping[SeriesKey, float],
    histograms: Mapping[SeriesKey, HistogramValue],
    inc: Increments,
) -> tuple[dict[SeriesKey, float], dict[SeriesKey, HistogramValue]]:
    """Return new totals with one tick's increments added."""
    new_counters = dict(counters)
    for key, value in inc.counters.items():
        new_counters[key] = new_counters.get(key, 0.0) + value
    new_hist = dict(histograms)
    for key, hist in inc.histograms.items():
        prev = new_hist.get(key)
        new_hist[key] = hist if prev is None else prev.add(hist.counts, hist.total)
    return new_counters, new_hist
