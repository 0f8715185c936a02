"""Turn one tick's readings and the recent history into the next Snapshot (pure).

The order is the data flow: resolve agent GPUs to NVML indices, pick each GPU's busy ratio
(CUPTI where an agent reports, else GPM GRAPHICS_UTIL, else NVML utilization), add every
area's counter increments, then classify.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from types import MappingProxyType
from typing import Protocol

from exporter.analysis import activity, engine, verdict
from exporter.analysis.increments import Increments, apply
from exporter.config import Config
from exporter.snapshot import Snapshot
from exporter.snapshot.agent import AgentReading
from exporter.snapshot.gpu import GpuReading


class Accumulate(Protocol):
    """An area's contribution to the integrated counters for one tick."""

    def __call__(self, snap: Snapshot, cfg: Config, prev: Snapshot | None = None) -> Increments: ...


def resolve_agent_gpus(snap: Snapshot) -> Snapshot:
    """Map each agent GPU (CUDA ordinal, UUID) onto its NVML index by UUID."""
    if snap.agent is None or not snap.gpus:
        return snap
    by_uuid = {g.uuid: g.index for g in snap.gpus}
    activity_ = tuple(
        dataclasses.replace(a, gpu=by_uuid[a.uuid]) if a.uuid in by_uuid and a.gpu != by_uuid[a.uuid] else a
        for a in snap.agent.activity
    )
    agents = tuple(
        dataclasses.replace(s, gpu=by_uuid[s.uuid]) if getattr(s, "uuid", "") in by_uuid else s
        for s in snap.agent.agents
    )
    graphs = tuple(
        dataclasses.replace(g, gpu=by_uuid[g.uuid]) if g.uuid in by_uuid and g.gpu != by_uuid[g.uuid] else g
        for g in snap.agent.graphs
    )
    agent: AgentReading = dataclasses.replace(snap.agent, activity=activity_, agents=agents, graphs=graphs)
    return dataclasses.replace(snap, agent=agent)


def _visible(spec: str, gpus: Sequence[GpuReading]) -> tuple[int, ...]:
    """Map a CUDA_VISIBLE_DEVICES value (indices or UUIDs) to NVML indices."""
    out = []
    for item in (part.strip() for part in spec.split(",")):
        if item.isdigit():
            out.append(int(item))
        else:
            out.extend(g.index for g in gpus if item and g.uuid.startswith(item))
    return tuple(sorted(set(out)))


def resolve_engine_gpus(snap: Snapshot) -> Snapshot:
    """Tell which GPUs each engine drives: its processes on NVML's process lists, else CUDA_VISIBLE_DEVICES."""
    if not snap.engines or not snap.gpus:
        return snap
    engines = []
    for e in snap.engines:
        gpus = e.gpus
        if not gpus and e.pids:
            own = set(e.pids)
            gpus = tuple(g.index for g in snap.gpus if own & set(g.pids))
        if not gpus and e.cuda_visible_devices:
            gpus = _visible(e.cuda_visible_devices, snap.gpus)
        engines.append(dataclasses.replace(e, gpus=gpus) if gpus != e.gpus else e)
    return dataclasses.replace(snap, engines=tuple(engines))


def pick_busy(snap: Snapshot) -> dict[int, tuple[float, str]]:
    """Return each GPU's busy ratio and its source: cupti, else gpm, else nvml."""
    busy: dict[int, tuple[float, str]] = {}
    for g in snap.gpus:
        if g.utilization is not None:
            busy[g.index] = (g.utilization, "nvml")
        if g.gpm is not None and g.gpm.graphics is not None:
            busy[g.index] = (g.gpm.graphics, "gpm")
    for gpu, ratio in activity.cupti_busy_ratio(snap).items():
        busy[gpu] = (ratio, "cupti")
    return busy


def device_busy_increments(snap: Snapshot) -> Increments:
    """Integrate the NVML and GPM busy ratios over the tick (CUPTI is integrated exactly elsewhere)."""
    inc = Increments()
    if snap.dt <= 0:
        return inc
    for g in snap.gpus:
        gpu = str(g.index)
        sources: list[tuple[str, float | None]] = [("nvml", g.utilization)]
        if g.gpm is not None:
            sources.append(("gpm", g.gpm.graphics))
        for source, ratio in sources:
            if ratio is None:
                continue
            inc.count("boundwatch_gpu_busy_seconds_total", (gpu, source), ratio * snap.dt)
            inc.count("boundwatch_gpu_observed_seconds_total", (gpu, source), snap.dt)
    return inc


ACCUMULATORS: tuple[Accumulate, ...] = (activity.accumulate, engine.accumulate, verdict.accumulate)


def advance(history: Sequence[Snapshot], raw: Snapshot, cfg: Config) -> Snapshot:
    """Return the next Snapshot from this tick's raw readings and the snapshots before it."""
    prev = history[-1] if history else None
    snap = resolve_engine_gpus(resolve_agent_gpus(raw))
    if prev is not None:
        snap = dataclasses.replace(snap, counters=prev.counters, histograms=prev.histograms, probe=prev.probe)
    snap = dataclasses.replace(snap, busy=MappingProxyType(pick_busy(snap)))
    snap = verdict.classify_tick(history, snap, cfg)
    inc = device_busy_increments(snap)
    for acc in ACCUMULATORS:
        inc.merge(acc(snap, cfg, prev))
    counters, histograms = apply(snap.counters, snap.histograms, inc)
    return dataclasses.replace(
        snap, counters=MappingProxyType(counters), histograms=MappingProxyType(histograms)
    )
