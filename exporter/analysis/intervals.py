"""Interval arithmetic for GPU busy time: union, windows with carry-over, idle gaps, cross-process union.

Pure and stdlib only: both the sidecar and the in-process agent import it (the agent must not pull
in prometheus_client, so the gap buckets are duplicated here; a test checks they match the
catalogue). All times are integer nanoseconds on CUPTI's clock (CLOCK_REALTIME).

A window [t0, t1) closes only once it is older than the flush lag: records reach the agent up to
one flush period after the activity ends, so closing earlier would lose them. Intervals that cross
a window edge count in each window for the part inside it; idle gaps are attributed to the window
in which they end and may span several windows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from exporter.wire import IDLE_GAP_BUCKETS_SECONDS

IDLE_GAP_BUCKETS_NS: tuple[int, ...] = tuple(round(b * 1e9) for b in IDLE_GAP_BUCKETS_SECONDS)
GAP_MIN_NS = 1_000_000  # idle gaps of 1 ms or less are launch jitter, not starvation

Interval = tuple[int, int]
# record kinds: kernel, memcpy, memset, graph (one launch of a whole graph, GRAPH_TRACE) and
# graph_kernel (a kernel node inside a graph, when GRAPH_TRACE is off); both graph kinds add to graph busy
GRAPH_KINDS = ("graph", "graph_kernel")
# Kernel nodes of a graph run back to back on the device, with launch gaps of 0.1-0.4 us between them
# (measured on the H200, ~760-node decode graphs: bench/agent_graph_truth.py). Those gaps are part of
# the graph's execution, as a GRAPH_TRACE span or CUDA events around the replay count them, so gaps
# between kernel nodes up to this length are filled; host gaps between replays are far longer.
GRAPH_GAP_FILL_NS = 10_000


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Return the union of intervals as sorted, disjoint (start, end) pairs; empty ones vanish."""
    out: list[Interval] = []
    for s, e in sorted(iv for iv in intervals if iv[1] > iv[0]):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def bridge(merged: Sequence[Interval], fill_ns: int) -> list[Interval]:
    """Return merged intervals with the gaps of at most fill_ns between neighbours filled."""
    out: list[Interval] = []
    for s, e in merged:
        if out and s - out[-1][1] <= fill_ns:
            out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def clip(intervals: Iterable[Interval], t0: int, t1: int) -> list[Interval]:
    """Return the parts of intervals inside [t0, t1)."""
    return [(max(s, t0), min(e, t1)) for s, e in intervals if e > t0 and s < t1]


def total(merged: Iterable[Interval]) -> int:
    """Return the summed length of disjoint intervals, ns."""
    return sum(e - s for s, e in merged)


def gaps(merged: Sequence[Interval], last_end: int | None) -> tuple[list[int], int | None]:
    """Return the idle gaps longer than GAP_MIN_NS before and between merged intervals, and the new last end.

    last_end is where activity last ended before these intervals (None when nothing ran yet), so a
    gap that spans window edges is counted once, in the window where it ends.
    """
    found: list[int] = []
    for s, e in merged:
        if last_end is not None and s - last_end > GAP_MIN_NS:
            found.append(s - last_end)
        if last_end is None or e > last_end:
            last_end = e
    return found, last_end


def gap_histogram(gap_ns: Iterable[int]) -> tuple[tuple[int, ...], int]:
    """Return non-cumulative counts per IDLE_GAP_BUCKETS (+Inf last) and the sum of the gaps, ns."""
    counts = [0] * (len(IDLE_GAP_BUCKETS_NS) + 1)
    s = 0
    for g in gap_ns:
        s += g
        for i, bound in enumerate(IDLE_GAP_BUCKETS_NS):
            if g <= bound:
                counts[i] += 1
                break
        else:
            counts[-1] += 1
    return tuple(counts), s


def window_start(t: int, window_ns: int) -> int:
    """Return the start of the aligned window holding t (windows align across processes)."""
    return t - t % window_ns


@dataclass(frozen=True)
class WindowSummary:
    """One device's activity over one closed window."""

    t0: int
    t1: int
    busy_ns: int
    graph_busy_ns: int = 0
    counts: tuple[tuple[str, int], ...] = ()  # (kind, records starting in this window)
    gap_counts: tuple[int, ...] = (0,) * (len(IDLE_GAP_BUCKETS_NS) + 1)
    gap_sum_ns: int = 0
    late: int = 0  # records that arrived after their window had closed
    intervals: tuple[Interval, ...] = ()  # the merged busy intervals, for cross-process unions
    iv: tuple[int, ...] = ()  # the same, packed for the wire (exporter.wire.pack_intervals)
    slack_ns: int = 0  # idle ns the packing filled

    def count(self, kind: str) -> int:
        """Return the records of one kind."""
        return dict(self.counts).get(kind, 0)


@dataclass
class WindowAccumulator:
    """Collect activity intervals of one device and close aligned windows once they are final.

    `add()` takes records in any order; `close(now)` returns the windows that ended at least
    `lag_ns` before now. This is the reference implementation; the agent has a numpy one with the
    same results (tests/agent/test_windows.py compares them).
    """

    window_ns: int = 500_000_000
    lag_ns: int = 1_000_000_000
    start_ns: int | None = None  # first window opens here (agent start); None: at the first record
    graph_gap_fill_ns: int = GRAPH_GAP_FILL_NS
    _pending: list[tuple[int, int, str]] = field(default_factory=list)
    _next_t0: int | None = None
    _last_end: int | None = None
    _late: int = 0

    def add(self, start: int, end: int, kind: str) -> None:
        """Add one record's interval; a record wholly inside a closed window counts as late."""
        if end <= start:
            return
        if self._next_t0 is None:
            first = self.start_ns if self.start_ns is not None else start
            self._next_t0 = window_start(first, self.window_ns)
        if end <= self._next_t0:
            self._late += 1
            return
        self._pending.append((start, end, kind))

    def close(self, now: int) -> list[WindowSummary]:
        """Return every window that ended at least lag_ns before now, oldest first."""
        if self._next_t0 is None:
            if self.start_ns is None:
                return []
            self._next_t0 = window_start(self.start_ns, self.window_ns)
        out: list[WindowSummary] = []
        while self._next_t0 + self.window_ns <= now - self.lag_ns:
            t0 = self._next_t0
            t1 = t0 + self.window_ns
            inside = [r for r in self._pending if r[0] < t1]
            nodes = bridge(
                merge(clip(((s, e) for s, e, k in inside if k == "graph_kernel"), t0, t1)),
                self.graph_gap_fill_ns,
            )
            rest = clip(((s, e) for s, e, k in inside if k != "graph_kernel"), t0, t1)
            busy = merge([*rest, *nodes])
            graph = merge([*clip(((s, e) for s, e, k in inside if k == "graph"), t0, t1), *nodes])
            counts: dict[str, int] = {}
            for s, _, k in inside:
                if s >= t0:
                    name = "kernel" if k == "graph_kernel" else k
                    counts[name] = counts.get(name, 0) + 1
            found, self._last_end = gaps(busy, self._last_end)
            hist, gsum = gap_histogram(found)
            out.append(
                WindowSummary(
                    t0=t0,
                    t1=t1,
                    busy_ns=total(busy),
                    graph_busy_ns=total(graph),
                    counts=tuple(sorted(counts.items())),
                    gap_counts=hist,
                    gap_sum_ns=gsum,
                    late=self._late,
                    intervals=tuple(busy),
                )
            )
            self._late = 0
            self._pending = [r for r in self._pending if r[1] > t1]
            self._next_t0 = t1
        return out


@dataclass(frozen=True)
class ProcessWindow:
    """One process's report of one window on one GPU, as the sidecar unions them."""

    busy_ns: int
    intervals: tuple[Interval, ...]  # possibly coarsened busy intervals (absolute ns)
    slack_ns: int = 0  # idle ns the coarsening filled in `intervals`


def union_busy(windows: Sequence[ProcessWindow], span_ns: int) -> tuple[int, list[Interval]]:
    """Return the busy ns of several processes on one GPU over one window, and their merged intervals.

    Exact when no list was coarsened; otherwise the union of the lists, less the filled slack,
    bounded below by the busiest process and above by the sum of all of them and by the span.
    """
    if not windows:
        return 0, []
    if len(windows) == 1:
        return min(windows[0].busy_ns, span_ns), merge(windows[0].intervals)
    merged = merge(iv for w in windows for iv in w.intervals)
    union = total(merged) - sum(w.slack_ns for w in windows)
    lo = max(w.busy_ns for w in windows)
    hi = min(sum(w.busy_ns for w in windows), span_ns)
    return max(lo, min(union, hi)), merged
