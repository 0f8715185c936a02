"""One metric family's renderer: the catalogue entry it renders and a function of the Snapshot.

Every `exporter/export/<area>.py` lists its families in `FAMILIES` (the figures read this tick)
and `INTEGRATED` (the totals analysis added up); the collector renders each one in its own guard.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric

from exporter import catalogue as c
from exporter.snapshot import Snapshot
from exporter.snapshot.totals import HistogramValue, Totals


@dataclass(frozen=True)
class Family:
    """A catalogue entry and the function that renders it from a Snapshot."""

    spec: c.MetricSpec
    render: Callable[[Snapshot], Metric]


def labels_of(key: object) -> tuple[str, ...]:
    """Return a totals key (an int, a str, or a named tuple of them) as label values."""
    if isinstance(key, tuple):
        return tuple(str(part) for part in key)
    return (str(key),)


def counter_family(spec: c.MetricSpec, series: Mapping[object, float]) -> CounterMetricFamily:
    """Return a counter family with one sample per series, ordered by label values."""
    fam = c.counter(spec)
    for labels, value in sorted((labels_of(k), v) for k, v in series.items()):
        fam.add_metric(list(labels), value)
    return fam


def scalar_counter(spec: c.MetricSpec, value: float | None) -> CounterMetricFamily:
    """Return a counter family without labels: one sample, or none while value is None."""
    fam = c.counter(spec)
    if value is not None:
        fam.add_metric([], value)
    return fam


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


def histogram_buckets(value: HistogramValue) -> list[tuple[str, float]]:
    """Return cumulative (le, count) pairs ending with +Inf."""
    out, running = [], 0.0
    for bound, count in zip((*value.bounds, float("inf")), value.counts, strict=True):
        running += count
        out.append((_le(bound), running))
    return out


def histogram_family(spec: c.MetricSpec, series: Mapping[object, HistogramValue]) -> HistogramMetricFamily:
    """Return a histogram family with one series per key, ordered by label values."""
    fam = c.histogram(spec)
    for labels, hist in sorted(((labels_of(k), h) for k, h in series.items()), key=lambda item: item[0]):
        fam.add_metric(list(labels), histogram_buckets(hist), hist.total)
    return fam


def counters(spec: c.MetricSpec, field: Callable[[Totals], Mapping[Any, float]]) -> Family:
    """Return the family of a totals field that holds a counter per label key."""
    return Family(spec, lambda snap: counter_family(spec, field(snap.totals)))


def counter(spec: c.MetricSpec, field: Callable[[Totals], float | None]) -> Family:
    """Return the family of a totals field that holds one counter without labels."""
    return Family(spec, lambda snap: scalar_counter(spec, field(snap.totals)))


def histograms(spec: c.MetricSpec, field: Callable[[Totals], Mapping[Any, HistogramValue]]) -> Family:
    """Return the family of a totals field that holds a histogram per label key."""
    return Family(spec, lambda snap: histogram_family(spec, field(snap.totals)))


def render(families: Iterable[Family], snap: Snapshot) -> list[Metric]:
    """Return every family of a list rendered from one Snapshot, without a guard (for tools and tests)."""
    return [f.render(snap) for f in families]
