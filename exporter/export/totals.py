"""Render every integrated counter and histogram held in the Snapshot."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric

from exporter import catalogue as c
from exporter.snapshot import HistogramValue, Snapshot


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))


def histogram_buckets(value: HistogramValue) -> list[tuple[str, float]]:
    """Return cumulative (le, count) pairs ending with +Inf."""
    out, running = [], 0.0
    for bound, count in zip((*value.bounds, math.inf), value.counts, strict=True):
        running += count
        out.append((_le(bound), running))
    return out


def render(snap: Snapshot) -> Iterator[Metric]:
    """Yield a family per counter or histogram name found in the Snapshot."""
    counters: dict[str, list[tuple[tuple[str, ...], float]]] = defaultdict(list)
    for (name, labels), value in snap.counters.items():
        counters[name].append((labels, value))
    for name in sorted(counters):
        fam = c.counter(name)
        for labels, value in sorted(counters[name]):
            fam.add_metric(list(labels), value)
        yield fam
    hists: dict[str, list[tuple[tuple[str, ...], HistogramValue]]] = defaultdict(list)
    for (name, labels), hist in snap.histograms.items():
        hists[name].append((labels, hist))
    for name in sorted(hists):
        hfam = c.histogram(name)
        for labels, hist in sorted(hists[name], key=lambda item: item[0]):
            hfam.add_metric(list(labels), histogram_buckets(hist), hist.total)
        yield hfam


__all__ = ["CounterMetricFamily", "HistogramMetricFamily", "histogram_buckets", "render"]
