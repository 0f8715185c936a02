"""Render NVML readings: identity, power, energy, clocks, clock-event reasons, utilization, GPM, memory."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.metrics_core import Metric

from exporter import catalogue as c
from exporter.export.families import Family
from exporter.snapshot import Snapshot
from exporter.snapshot.gpu import CLOCK_EVENT_REASONS, GpuReading


def info(snap: Snapshot) -> Metric:
    """Render boundwatch_gpu_info{gpu,uuid,name,driver} 1."""
    fam = c.gauge(c.GPU_INFO)
    for g in snap.gpus:
        fam.add_metric([str(g.index), g.uuid, g.name, g.driver], 1)
    return fam


def _per_gpu(spec: c.MetricSpec, value: Callable[[GpuReading], float | None]) -> Family:
    """Return a family of one sample per GPU whose value is known, e.g. boundwatch_gpu_power_watts{gpu="0"} 412.5."""

    def render(snap: Snapshot) -> Metric:
        fam = c.number(spec)
        for g in snap.gpus:
            v = value(g)
            if v is not None:
                fam.add_metric([str(g.index)], float(v))
        return fam

    return Family(spec, render)


def clock_event_reasons(snap: Snapshot) -> Metric:
    """Render every clock-event reason of every GPU as 0 or 1."""
    fam = c.gauge(c.GPU_CLOCK_EVENT_REASON)
    for g in snap.gpus:
        if g.clock_event_mask is None:
            continue
        for bit, reason in CLOCK_EVENT_REASONS:
            fam.add_metric([str(g.index), reason], 1.0 if g.clock_event_mask & bit else 0.0)
    return fam


def _gpm(spec: c.MetricSpec, attr: str) -> Family:
    return _per_gpu(spec, lambda g: getattr(g.gpm, attr) if g.gpm is not None else None)


FAMILIES: tuple[Family, ...] = (
    Family(c.GPU_INFO, info),
    _per_gpu(c.GPU_POWER_WATTS, lambda g: g.power_watts),
    _per_gpu(c.GPU_POWER_LIMIT_WATTS, lambda g: g.power_limit_watts),
    _per_gpu(c.GPU_SM_CLOCK_HERTZ, lambda g: g.sm_clock_hz),
    _per_gpu(c.GPU_SM_CLOCK_MAX_HERTZ, lambda g: g.sm_clock_max_hz),
    _per_gpu(c.GPU_UTILIZATION_RATIO, lambda g: g.utilization),
    _per_gpu(c.GPU_MEMORY_USED_BYTES, lambda g: g.memory_used_bytes),
    _per_gpu(c.GPU_MEMORY_TOTAL_BYTES, lambda g: g.memory_total_bytes),
    _per_gpu(c.GPU_ENERGY_JOULES_TOTAL, lambda g: g.energy_joules),
    Family(c.GPU_CLOCK_EVENT_REASON, clock_event_reasons),
    _gpm(c.GPU_GRAPHICS_ACTIVE_RATIO, "graphics"),
    _per_gpu(
        c.GPU_GRAPHICS_ACTIVE_ESTIMATED,
        lambda g: (
            float(g.gpm.graphics_estimated) if g.gpm is not None and g.gpm.graphics is not None else None
        ),
    ),
    _gpm(c.GPU_SM_ACTIVE_RATIO, "sm"),
    _gpm(c.GPU_SM_OCCUPANCY_RATIO, "sm_occupancy"),
    _gpm(c.GPU_TENSOR_ACTIVE_RATIO, "tensor"),
    _gpm(c.GPU_DRAM_ACTIVE_RATIO, "dram"),
)
INTEGRATED: tuple[Family, ...] = ()
