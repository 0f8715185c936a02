"""Render the preferred busy ratio per GPU with its source, and busy time integrated by source."""

from __future__ import annotations

from prometheus_client.metrics_core import Metric

from exporter import catalogue as c
from exporter.export.families import Family, counters
from exporter.snapshot import Snapshot


def busy_ratio(snap: Snapshot) -> Metric:
    """Render boundwatch_gpu_busy_ratio, e.g. {gpu="0",source="cupti"} 0.27."""
    fam = c.gauge(c.GPU_BUSY_RATIO)
    for gpu, (ratio, source) in sorted(snap.busy.items()):
        fam.add_metric([str(gpu), source], ratio)
    return fam


FAMILIES: tuple[Family, ...] = (Family(c.GPU_BUSY_RATIO, busy_ratio),)
INTEGRATED: tuple[Family, ...] = (
    counters(c.GPU_BUSY_SECONDS_TOTAL, lambda t: t.busy.busy_seconds),
    counters(c.GPU_OBSERVED_SECONDS_TOTAL, lambda t: t.busy.observed_seconds),
)
