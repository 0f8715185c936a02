"""Render NVML readings: identity, power, energy, clocks, clock-event reasons, utilization, GPM, memory."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import Metric

from exporter import catalogue as c
from exporter.snapshot import Snapshot
from exporter.snapshot.gpu import CLOCK_EVENT_REASONS

_GAUGES = (
    ("boundwatch_gpu_power_watts", "power_watts"),
    ("boundwatch_gpu_power_limit_watts", "power_limit_watts"),
    ("boundwatch_gpu_sm_clock_hertz", "sm_clock_hz"),
    ("boundwatch_gpu_sm_clock_max_hertz", "sm_clock_max_hz"),
    ("boundwatch_gpu_utilization_ratio", "utilization"),
    ("boundwatch_gpu_memory_used_bytes", "memory_used_bytes"),
    ("boundwatch_gpu_memory_total_bytes", "memory_total_bytes"),
)
_GPM = (
    ("boundwatch_gpu_graphics_active_ratio", "graphics"),
    ("boundwatch_gpu_sm_active_ratio", "sm"),
    ("boundwatch_gpu_sm_occupancy_ratio", "sm_occupancy"),
    ("boundwatch_gpu_tensor_active_ratio", "tensor"),
    ("boundwatch_gpu_dram_active_ratio", "dram"),
)


def render(snap: Snapshot) -> Iterator[Metric]:
    """Yield the NVML families of one Snapshot.

    boundwatch_gpu_power_watts{gpu="0"} 412.5
    """
    if not snap.gpus:
        return
    info = c.gauge("boundwatch_gpu_info")
    for g in snap.gpus:
        info.add_metric([str(g.index), g.uuid, g.name, g.driver], 1)
    yield info
    for name, attr in _GAUGES:
        fam = c.gauge(name)
        for g in snap.gpus:
            value = getattr(g, attr)
            if value is not None:
                fam.add_metric([str(g.index)], float(value))
        yield fam
    energy = c.counter("boundwatch_gpu_energy_joules_total")
    for g in snap.gpus:
        if g.energy_joules is not None:
            energy.add_metric([str(g.index)], g.energy_joules)
    yield energy
    reasons = c.gauge("boundwatch_gpu_clock_event_reason")
    for g in snap.gpus:
        if g.clock_event_mask is None:
            continue
        for bit, reason in CLOCK_EVENT_REASONS:
            reasons.add_metric([str(g.index), reason], 1.0 if g.clock_event_mask & bit else 0.0)
    yield reasons
    for name, attr in _GPM:
        fam = c.gauge(name)
        for g in snap.gpus:
            value = getattr(g.gpm, attr) if g.gpm is not None else None
            if value is not None:
                fam.add_metric([str(g.index)], value)
        yield fam
