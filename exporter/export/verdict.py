"""Render the verdict per GPU: one-hot verdict, every reason as 0/1, and the roofline gauges."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import Metric

from exporter.catalogue import gauge
from exporter.snapshot import Snapshot
from exporter.snapshot.verdict import REASONS, VERDICTS


def render(snap: Snapshot) -> Iterator[Metric]:
    """Yield boundwatch_bound, boundwatch_bound_reason and the roofline gauges.

    boundwatch_bound{gpu="0",verdict="host"} 1
    boundwatch_bound_reason{gpu="0",reason="api_server_saturated"} 1
    boundwatch_bound_busy_ratio{gpu="0",source="gpm"} 0.27
    boundwatch_roofline_step_floor_seconds{gpu="0"} 0.0206
    """
    bound = gauge("boundwatch_bound")
    reason = gauge("boundwatch_bound_reason")
    floor = gauge("boundwatch_roofline_step_floor_seconds")
    achieved = gauge("boundwatch_roofline_achieved_ratio")
    used = gauge("boundwatch_bound_busy_ratio")
    for v in sorted(snap.verdicts, key=lambda x: x.gpu):
        gpu = str(v.gpu)
        for name in VERDICTS:
            bound.add_metric([gpu, name], 1.0 if v.verdict == name else 0.0)
        for name in REASONS:
            reason.add_metric([gpu, name], 1.0 if name in v.reasons else 0.0)
        if v.busy_ratio is not None and v.busy_source:
            used.add_metric([gpu, v.busy_source], float(v.busy_ratio))
        for fam, key in ((floor, "roofline_floor_seconds"), (achieved, "roofline_achieved_ratio")):
            value = v.get(key)
            if isinstance(value, int | float):
                fam.add_metric([gpu], float(value))
    yield from (bound, reason, used, floor, achieved)
