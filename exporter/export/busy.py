"""Render the preferred busy ratio per GPU, labelled with the source it came from."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import Metric

from exporter import catalogue as c
from exporter.snapshot import Snapshot


def render(snap: Snapshot) -> Iterator[Metric]:
    """Yield boundwatch_gpu_busy_ratio.

    boundwatch_gpu_busy_ratio{gpu="0",source="cupti"} 0.27
    """
    fam = c.gauge("boundwatch_gpu_busy_ratio")
    for gpu, (ratio, source) in sorted(snap.busy.items()):
        fam.add_metric([str(gpu), source], ratio)
    yield fam
