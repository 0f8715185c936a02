"""Merge the agents' raw per-process windows into one activity per GPU (pure).

Several processes on one GPU each send their own window for the same aligned [t0, t1); the feed
hands them out once every running process on that GPU has sent it, or once it waited long
enough (`exporter.sources.agent_feed`). Here the windows of one GPU are merged: a lone window is
taken as its process measured it (its own idle gaps), several are unioned
(`intervals.union_busy`: two processes' kernels that overlap count once) and their idle gaps
found again in the union. What the next tick needs (where activity last ended, the newest
window's busy share, kept as the gauge while the agents live) is carried in `UnionState`, read
from the previous Snapshot, so `replay` recomputes the union from a recording's raw windows.
"""

from __future__ import annotations

from collections.abc import Sequence

from exporter import wire
from exporter.analysis import intervals
from exporter.snapshot import Snapshot
from exporter.snapshot.agent import AgentReading, AgentWindow, GpuActivity, GpuWindows, UnionState
from exporter.snapshot.frozen import replace

MAX_STATES = 64  # GPUs whose union state is carried (the feed indexes 64 GPU keys at most)
COUNTS = ("kernels", "memcpys", "memsets", "graphs", "dropped")


def _public_uuid(uuid: str) -> str:
    """Return the UUID an activity carries: a GPU's (a MIG or other key is left out, as the feed did)."""
    return uuid if uuid.startswith("GPU-") else ""


def _by_t0(windows: Sequence[AgentWindow]) -> list[tuple[int, list[AgentWindow]]]:
    """Return the windows grouped by their start, oldest first (each process's order kept)."""
    if len(windows) == 1:  # one process, one window this tick: the usual case
        return [(windows[0].t0, [windows[0]])]
    groups: dict[int, list[AgentWindow]] = {}
    for w in windows:
        groups.setdefault(w.t0, []).append(w)
    return sorted(groups.items(), key=lambda item: item[0])


def _union(
    t0: int, windows: Sequence[AgentWindow], span: int, last_end: int | None
) -> tuple[int, tuple[int, ...], int, int | None]:
    """Return busy ns, the gap histogram, the gap sum and the new last end of several processes' window."""
    pw = [
        intervals.ProcessWindow(w.busy_ns, tuple(wire.unpack_intervals(w.iv, t0)), w.slack_ns)
        for w in windows
    ]
    busy, merged = intervals.union_busy(pw, span)
    found, last_end = intervals.gaps(intervals.clip(merged, t0, t0 + span), last_end)
    hist, gap_sum = intervals.gap_histogram(found)
    return busy, hist, gap_sum, last_end


def merge_gpu(g: GpuWindows, state: UnionState | None) -> tuple[GpuActivity, UnionState]:
    """Return one GPU's activity over its ready windows, and the state the next tick carries."""
    last_end = state.last_end_ns if state is not None else None
    last_busy = state.last_window_busy_ns if state is not None else 0
    last_span = state.last_window_ns if state is not None else 0
    observed = busy = graph = gap_sum = 0
    counts = dict.fromkeys(COUNTS, 0)
    hist = [0] * (len(intervals.IDLE_GAP_BUCKETS_NS) + 1)
    processes = 1
    for t0, windows in _by_t0(g.windows):
        span = (windows[0].t1 if len(windows) == 1 else max(w.t1 for w in windows)) - t0
        processes = max(processes, len(windows))
        if len(windows) == 1:
            w = windows[0]
            wbusy, wgraph = min(w.busy_ns, span), w.graph_busy_ns
            if any(w.gap_counts):
                for i, c in enumerate(w.gap_counts):
                    hist[i] += c
                gap_sum += w.gap_sum_ns
            end = wire.intervals_end(w.iv, t0)
            if end is not None:
                last_end = max(last_end or 0, end)
        else:
            wbusy, whist, wsum, last_end = _union(t0, windows, span, last_end)
            for i, c in enumerate(whist):
                hist[i] += c
            gap_sum += wsum
            wgraph = min(sum(w.graph_busy_ns for w in windows), wbusy)  # graph spans carry no intervals
        observed, busy, graph = observed + span, busy + wbusy, graph + wgraph
        for w in windows:
            for k in COUNTS:
                counts[k] += getattr(w, k)
        last_busy, last_span = wbusy, span
    activity = GpuActivity(
        gpu=g.gpu,
        uuid=_public_uuid(g.uuid),
        observed_ns=observed,
        busy_ns=busy,
        graph_busy_ns=graph,
        idle_gap_counts=tuple(hist),
        idle_gap_sum_ns=gap_sum,
        last_window_busy_ns=last_busy,
        last_window_ns=last_span,
        processes=processes,
        **counts,
    )
    return activity, UnionState(g.gpu, g.uuid, last_end, last_busy, last_span)


def carried(g: GpuWindows, state: UnionState) -> GpuActivity:
    """Return a GPU's activity on a tick without windows: nothing observed, the newest window's ratio kept."""
    return GpuActivity(
        gpu=g.gpu,
        uuid=_public_uuid(g.uuid),
        observed_ns=0,
        busy_ns=0,
        last_window_busy_ns=state.last_window_busy_ns,
        last_window_ns=state.last_window_ns,
        processes=g.running,
    )


def merge(reading: AgentReading, prev: AgentReading | None) -> AgentReading:
    """Return the reading with its windows merged per GPU into `activity`, and the union state updated.

    A reading without raw windows (nothing ready and no agent running, or a recording made before
    the feed handed them out) keeps its activity; the previous state is carried on.
    """
    states = {(s.gpu, s.uuid): s for s in (prev.union if prev is not None else ())}
    if not reading.windows:
        return reading if not states else replace(reading, union=tuple(states.values()))
    activity: list[GpuActivity] = []
    touched: dict[tuple[int, str], UnionState] = {}
    for g in reading.windows:
        state = states.get((g.gpu, g.uuid))
        if g.windows:
            act, touched[(g.gpu, g.uuid)] = merge_gpu(g, state)
            activity.append(act)
        elif g.running and state is not None and state.last_window_ns:
            activity.append(carried(g, state))
    kept = [*touched.values(), *(s for k, s in states.items() if k not in touched)][:MAX_STATES]
    return replace(
        reading,
        activity=tuple(sorted(activity, key=lambda a: (a.uuid, a.gpu))),
        union=tuple(sorted(kept, key=lambda s: (s.uuid, s.gpu))),
    )


def merge_snapshot(snap: Snapshot, prev: Snapshot | None) -> Snapshot:
    """Return a raw Snapshot with its agents' windows merged (see merge)."""
    if snap.agent is None:
        return snap
    merged = merge(snap.agent, prev.agent if prev is not None else None)
    return snap if merged is snap.agent else replace(snap, agent=merged)
