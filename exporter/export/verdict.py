"""Render the verdict per GPU: one-hot verdict, every reason as 0/1, the busy it used, the roofline, the totals."""

from __future__ import annotations

from prometheus_client.metrics_core import Metric

from exporter import catalogue as c
from exporter.export.families import Family, counters
from exporter.snapshot import Snapshot
from exporter.snapshot.verdict import REASONS, VERDICTS


def bound(snap: Snapshot) -> Metric:
    """Render boundwatch_bound{gpu="0",verdict="host"} 1 and every other verdict at 0."""
    fam = c.gauge(c.BOUND)
    for v in sorted(snap.verdicts, key=lambda x: x.gpu):
        for name in VERDICTS:
            fam.add_metric([str(v.gpu), name], 1.0 if v.verdict == name else 0.0)
    return fam


def reasons(snap: Snapshot) -> Metric:
    """Render boundwatch_bound_reason{gpu="0",reason="api_server_saturated"} 1 and every other reason at 0."""
    fam = c.gauge(c.BOUND_REASON)
    for v in sorted(snap.verdicts, key=lambda x: x.gpu):
        for name in REASONS:
            fam.add_metric([str(v.gpu), name], 1.0 if name in v.reasons else 0.0)
    return fam


def busy_used(snap: Snapshot) -> Metric:
    """Render the busy share the verdict used, e.g. boundwatch_bound_busy_ratio{gpu="0",source="gpm"} 0.27."""
    fam = c.gauge(c.BOUND_BUSY_RATIO)
    for v in sorted(snap.verdicts, key=lambda x: x.gpu):
        if v.busy_ratio is not None and v.busy_source:
            fam.add_metric([str(v.gpu), v.busy_source], float(v.busy_ratio))
    return fam


def _evidence(spec: c.MetricSpec, key: str) -> Family:
    """Return a family of one number from each verdict's evidence, e.g. boundwatch_roofline_step_floor_seconds."""

    def render(snap: Snapshot) -> Metric:
        fam = c.gauge(spec)
        for v in sorted(snap.verdicts, key=lambda x: x.gpu):
            value = v.get(key)
            if isinstance(value, int | float):
                fam.add_metric([str(v.gpu)], float(value))
        return fam

    return Family(spec, render)


FAMILIES: tuple[Family, ...] = (
    Family(c.BOUND, bound),
    Family(c.BOUND_REASON, reasons),
    Family(c.BOUND_BUSY_RATIO, busy_used),
    _evidence(c.BOUND_GRAPH_STEP_RATIO, "graph_step_share"),
    _evidence(c.ROOFLINE_STEP_FLOOR_SECONDS, "roofline_floor_seconds"),
    _evidence(c.ROOFLINE_ACHIEVED_RATIO, "roofline_achieved_ratio"),
)
INTEGRATED: tuple[Family, ...] = (
    counters(c.BOUND_SECONDS_TOTAL, lambda t: t.verdict.bound_seconds),
    counters(c.HOST_BOUND_SECONDS_TOTAL, lambda t: t.verdict.host_bound_seconds),
)
