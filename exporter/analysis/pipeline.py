"""Turn one tick's readings and the recent history into the next Snapshot (pure).

The order is the data flow: normalise each engine's raw page into its figures and step count
(engine_page.normalise_engines), merge the agents' raw windows per GPU (agent_union), name agent GPUs
by UUID (NVML's index, else one of their own), place each engine on its GPUs, serve each engine's
running/waiting from its agent's counts (else its page), pick each GPU's busy ratio (CUPTI where
an agent reports, else GPM GRAPHICS_UTIL, else NVML utilization), add every area's counter
increments, then classify.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType
from typing import Protocol

from exporter.analysis import activity, agent_union, busy, engine, engine_page, verdict
from exporter.config import Config
from exporter.snapshot import Snapshot
from exporter.snapshot.agent import AgentReading
from exporter.snapshot.engine import EngineReading, ascii_int
from exporter.snapshot.frozen import replace
from exporter.snapshot.totals import (
    EMPTY,
    BusyTotals,
    EngineServer,
    GpuKeys,
    GpuSource,
    Tally,
    Totals,
    bounded_engines,
)


class Accumulate(Protocol):
    """An area's contribution to the integrated counters for one tick."""

    def __call__(self, snap: Snapshot, cfg: Config, prev: Snapshot | None = None) -> Totals: ...


# GPUs known by UUID alone (no NVML, or a UUID NVML does not list: a MIG instance, another host's view).
MAX_UUID_INDICES = 64


def uuid_indices(snap: Snapshot, known: Sequence[str] = ()) -> tuple[str, ...]:
    """Return the UUIDs outside NVML in first-seen order: `known` (the previous tick's), then new ones.

    Such a UUID gets the index (highest NVML index + 1) + its position, so it never collides with
    an NVML GPU and keeps its index while any agent names it. With MAX_UUID_INDICES taken, a new
    UUID takes the first place whose UUID no agent names any more (the feed forgets a silent agent),
    so UUIDs that came and went (made up, say) cannot keep a GPU that comes later out for good; with
    every place named now, it gets none (the feed bounds the GPUs it keeps, and counts the rest).
    """
    nvml = {g.uuid for g in snap.gpus}
    table = [u for u in known if u not in nvml][:MAX_UUID_INDICES]
    seen = set(table)
    if snap.agent is not None:
        found = [a.uuid for a in snap.agent.activity] + [s.device_uuid for s in snap.agent.agents]
        found += [u.uuid for u in snap.agent.graphs]
        named = set(found)
        for uuid in found:
            if not uuid or uuid in nvml or uuid in seen:
                continue
            if len(table) < MAX_UUID_INDICES:
                table.append(uuid)
            else:
                free = next((i for i, u in enumerate(table) if u not in named), None)
                if free is None:
                    continue
                seen.discard(table[free])
                table[free] = uuid
            seen.add(uuid)
    return tuple(table)


def gpu_index(snap: Snapshot, uuid: str) -> int | None:
    """Return the GPU index of a UUID: NVML's, else its place among `Snapshot.gpu_uuids` past NVML's."""
    return gpu_indices(snap).get(uuid)


def gpu_indices(snap: Snapshot) -> dict[str, int]:
    """Return the GPU index of every UUID the Snapshot knows: NVML's (its first GPU with that UUID),
    else its first place among `Snapshot.gpu_uuids`, counted past NVML's highest index."""
    out: dict[str, int] = {}
    for g in snap.gpus:
        out.setdefault(g.uuid, g.index)
    base = max((g.index for g in snap.gpus), default=-1) + 1
    for i, uuid in enumerate(snap.gpu_uuids):
        out.setdefault(uuid, base + i)
    return out


def resolve_agent_gpus(snap: Snapshot, known: Sequence[str] = ()) -> Snapshot:
    """Name each agent GPU by its UUID: NVML's index, else a stable index of its own (see uuid_indices).

    An agent's UUID is its windows' device, else (a light agent, which sends no windows) the device its
    graph counts name (`device_uuid`): every reader of an agent's GPU (its metrics' label, the engine
    placed by its agents, the verdict's steps no engine owns) reads `gpu`, resolved here once.
    Two agents that each call their device CUDA ordinal 0 are two GPUs when their UUIDs differ.
    Activity whose UUID gets no index (past the bound) is dropped; without a UUID the ordinal stays.
    """
    snap = replace(snap, gpu_uuids=uuid_indices(snap, known or snap.gpu_uuids))
    if snap.agent is None:
        return snap
    indices = gpu_indices(snap)  # each UUID's gpu_index, looked up once per GPU rather than searched
    activity_ = []
    for a in snap.agent.activity:
        index = indices.get(a.uuid) if a.uuid else a.gpu
        if index is not None:
            activity_.append(a if index == a.gpu else replace(a, gpu=index))
    agents = []
    for s in snap.agent.agents:  # a light agent sends no windows: the device its graph counts name
        index = indices.get(s.device_uuid) if s.device_uuid else None
        agents.append(replace(s, gpu=index) if index is not None and index != s.gpu else s)
    by_pid = {s.pid: s.gpu for s in agents if s.device_uuid}
    graphs = []
    for u in snap.agent.graphs:  # by its own UUID, else by its agent's
        index = indices.get(u.uuid) if u.uuid else by_pid.get(u.pid)
        graphs.append(replace(u, gpu=index) if index is not None and index != u.gpu else u)
    agent: AgentReading = replace(
        snap.agent, activity=tuple(activity_), agents=tuple(agents), graphs=tuple(graphs)
    )
    return replace(snap, agent=agent)


def _device(token: str, snap: Snapshot) -> int | None:
    """Return the GPU index of one CUDA_VISIBLE_DEVICES entry: an NVML index, or a UUID (prefix)."""
    token = token.strip()
    if (index := ascii_int(token, 6)) is not None:
        return index if any(g.index == index for g in snap.gpus) else None
    if not token.startswith(("GPU-", "MIG-")):
        return None
    for g in snap.gpus:
        if g.uuid.startswith(token):
            return g.index
    for uuid in snap.gpu_uuids:
        if uuid.startswith(token):
            return gpu_index(snap, uuid)
    return None


def _visible(spec: str, snap: Snapshot) -> tuple[int, ...]:
    """Map a CUDA_VISIBLE_DEVICES value (indices or UUIDs) to GPU indices."""
    found = (_device(item, snap) for item in spec.split(",")[:64])
    return tuple(sorted({i for i in found if i is not None}))


def _process_gpus(e: EngineReading, snap: Snapshot) -> tuple[str, dict[int, set[int]]]:
    """Return how an engine's processes were placed and each one's GPUs: NVML's process lists, else
    each process's CUDA_VISIBLE_DEVICES and ordinal, else the UUIDs its agents report (a CUPTI
    agent's windows' devices; a light agent's CUDA device, the one its graph counts name)."""
    on_nvml: dict[int, set[int]] = {}
    own = set(e.pids)
    for g in snap.gpus:
        for pid in own.intersection(g.pids):
            on_nvml.setdefault(pid, set()).add(g.index)
    if on_nvml:
        return "nvml_pids", on_nvml
    placed: dict[int, set[int]] = {}
    for p in e.placements:
        if p.visible is not None and p.ordinal is not None:
            tokens = p.visible.split(",")
            index = _device(tokens[p.ordinal], snap) if p.ordinal < len(tokens) else None
            if index is not None:
                placed.setdefault(p.pid, set()).add(index)
    if placed:
        return "placement", placed
    agents: dict[int, set[int]] = {}
    for s in snap.agent.agents if snap.agent is not None else ():  # their GPUs named (resolve_agent_gpus)
        if s.pid in own and s.device_uuid and s.gpu >= 0:
            agents.setdefault(s.pid, set()).add(s.gpu)
    return ("agent", agents) if agents else ("", {})


def place_engine(e: EngineReading, snap: Snapshot) -> EngineReading:
    """Return an engine with the GPUs it drives, how they were found, and each engine core's GPUs.

    GPUs the reading already names (a recording, a configured engine) stay, as `reading`. Else, in
    order: its processes on NVML's process lists, each process's CUDA_VISIBLE_DEVICES and
    ordinal, the UUIDs its agents report, the engine's CUDA_VISIBLE_DEVICES, the host's only GPU.
    Else it stays unplaced (gpus ()): the verdict says `no_gpu_mapping` rather than guess.
    """
    if e.gpus:
        return e if e.gpus_from else replace(e, gpus_from="reading")
    how, per_pid = _process_gpus(e, snap)
    gpus = tuple(sorted(set().union(*per_pid.values()))) if per_pid else ()
    cores: dict[int, set[int]] = {}
    for p in e.placements:
        if p.core and p.pid in per_pid:
            cores.setdefault(p.core, set()).update(per_pid[p.pid])
    if not gpus and e.cuda_visible_devices:
        gpus, how = _visible(e.cuda_visible_devices, snap), "cuda_visible_devices"
    if not gpus and (lone := verdict.lone_gpu(snap)) is not None:
        gpus, how = (lone,), "lone_gpu"
    if not gpus:
        return e
    core_gpus = tuple((core, tuple(sorted(g))) for core, g in sorted(cores.items()))
    return replace(e, gpus=gpus, gpus_from=how, core_gpus=core_gpus)


def resolve_engine_gpus(snap: Snapshot) -> Snapshot:
    """Tell which GPUs each engine drives (see place_engine)."""
    if not snap.engines:
        return snap
    return replace(snap, engines=tuple(place_engine(e, snap) for e in snap.engines))


def pick_busy(snap: Snapshot) -> dict[int, tuple[float, str]]:
    """Return each GPU's shown busy ratio and its source (analysis.busy.shown)."""
    return busy.shown(snap)


DEVICE_KEYS = GpuKeys(GpuSource, ("nvml", "gpm"))  # each GPU's keys, made once


def device_busy_increments(snap: Snapshot, cfg: Config | None = None, prev: Snapshot | None = None) -> Totals:
    """Integrate the NVML and GPM busy ratios over the tick (CUPTI is integrated exactly elsewhere)."""
    busy_s, observed_s = Tally[GpuSource](), Tally[GpuSource]()
    dt = snap.dt
    if dt > 0:
        for g in snap.gpus:
            nvml, gpm = DEVICE_KEYS(g.index)
            if g.utilization is not None:
                key = nvml
                busy_s.count(key, g.utilization * dt)
                observed_s.count(key, dt)
            if g.gpm is not None and g.gpm.graphics is not None:
                key = gpm
                busy_s.count(key, g.gpm.graphics * dt)
                observed_s.count(key, dt)
    return Totals(busy=BusyTotals(busy_seconds=busy_s, observed_seconds=observed_s))


ACCUMULATORS: tuple[Accumulate, ...] = (
    device_busy_increments,
    activity.accumulate,
    engine.accumulate,
    verdict.accumulate,
)


def rederive(raw: Snapshot, prev: Snapshot | None) -> Snapshot:
    """Return a raw Snapshot with its agents' windows merged and every agent and engine placed on its GPUs."""
    snap = agent_union.merge_snapshot(raw, prev)
    return resolve_engine_gpus(resolve_agent_gpus(snap, prev.gpu_uuids if prev is not None else ()))


def replay(snapshots: Sequence[Snapshot], cfg: Config) -> list[Snapshot]:
    """Return recorded Snapshots with the engines' pages, the agents' union, spec-decode acceptance and verdicts recomputed.

    A recording made before the feed handed out raw windows keeps its recorded activity; one made
    before the engine source handed out raw pages keeps its recorded engine figures.
    """
    out: list[Snapshot] = []
    for snap in snapshots:
        prev = out[-1] if out else None
        snap, paged = _normalised_again(snap, cfg)
        snap = engine_page.hold_models(snap, prev)
        snap = agent_union.merge_snapshot(snap, prev)
        if snap.agent is not None and snap.agent.windows:  # merged again: placed again
            snap = resolve_agent_gpus(snap, prev.gpu_uuids if prev is not None else ())
        snap = engine.with_acceptance(out, snap)
        out.append(engine.serve_counts(snap, prev, only=paged) if paged else snap)
    return verdict.replay(out, cfg)


def _normalised_again(snap: Snapshot, cfg: Config) -> tuple[Snapshot, frozenset[str]]:
    """Return a recorded Snapshot with its engines' raw pages normalised again, and those engines' names.

    Their running / waiting are served again too (by the caller), so they start from the page's.
    """
    paged = frozenset(e.name for e in snap.engines if e.raw is not None)
    if not paged:
        return snap, paged
    engines = tuple(
        replace(e, counts_source="page", core_counts=()) if e.name in paged else e for e in snap.engines
    )
    snap = replace(snap, engines=engines)
    return engine_page.normalise_engines(snap, cfg.engine.max_label_chars), paged


def advance(history: Sequence[Snapshot], raw: Snapshot, cfg: Config) -> Snapshot:
    """Return the next Snapshot from this tick's raw readings and the snapshots before it."""
    prev = history[-1] if history else None
    raw = engine_page.hold_models(engine_page.normalise_engines(raw, cfg.engine.max_label_chars), prev)
    snap = engine.with_acceptance(history, rederive(raw, prev))
    snap = engine.serve_counts(snap, prev)
    shown = MappingProxyType(pick_busy(snap))
    if prev is not None:  # one copy, not two
        snap = replace(snap, totals=prev.totals, probe=prev.probe, busy=shown)
    else:
        snap = replace(snap, busy=shown)
    snap = verdict.classify_tick(history, snap, cfg)
    inc = EMPTY
    for acc in ACCUMULATORS:
        inc = inc.plus(acc(snap, cfg, prev))
    totals = snap.totals.plus(inc)
    kept = bounded_engines(
        totals.engine,
        lambda: [e.name for e in snap.engines],
        servers=lambda: [EngineServer(e.name, server) for e in snap.engines for server, _ in e.servers()],
    )
    if kept is not totals.engine:
        totals = replace(totals, engine=kept)
    return replace(snap, totals=totals)
