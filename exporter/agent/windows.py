"""Per-device window accumulation with numpy: the agent's fast twin of intervals.WindowAccumulator.

Sorting and merging run inside numpy (which releases the GIL for them), so closing a window with
100k records never holds the application's interpreter for long. Same results as the stdlib
reference (tests/agent/test_windows.py feeds both the same records).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from exporter.analysis.intervals import (
    GAP_MIN_NS,
    GRAPH_GAP_FILL_NS,
    IDLE_GAP_BUCKETS_NS,
    WindowSummary,
    window_start,
)

KINDS = ("kernel", "memcpy", "memset", "graph")
KERNEL, MEMCPY, MEMSET, GRAPH, GRAPH_KERNEL = range(5)  # GRAPH_KERNEL: a kernel node inside a graph
_BOUNDS = np.asarray(IDLE_GAP_BUCKETS_NS, dtype=np.int64)
_EMPTY_I64 = np.zeros(0, dtype=np.int64)
_EMPTY_I8 = np.zeros(0, dtype=np.int8)


def pack_np(bs: np.ndarray, be: np.ndarray, t0: int, limit: int) -> tuple[tuple[int, ...], int]:
    """Return merged intervals packed for the wire (see exporter.wire.pack_intervals) and the ns filled."""
    slack = 0
    if bs.size > limit:
        gaps = bs[1:] - be[:-1]
        n_fill = bs.size - limit
        fill_idx = np.argpartition(gaps, n_fill - 1)[:n_fill]
        slack = int(gaps[fill_idx].sum())
        keep = np.ones(bs.size, dtype=bool)
        keep[fill_idx + 1] = False  # interval i+1 joins interval i
        starts = np.flatnonzero(keep)
        ends_idx = np.empty(starts.size, dtype=np.intp)
        ends_idx[:-1] = starts[1:] - 1
        ends_idx[-1] = bs.size - 1
        bs, be = bs[starts], be[ends_idx]
    if bs.size == 0:
        return (), slack
    s_us = (bs - t0) // 1000
    e_us = -((t0 - be) // 1000)
    prev = np.maximum.accumulate(np.maximum(e_us, s_us))  # ends never move backwards
    s_us = np.maximum(s_us, np.concatenate(([0], prev[:-1])))
    e_us = np.maximum(e_us, s_us)
    gap = s_us - np.concatenate(([0], e_us[:-1]))
    out = np.empty(2 * bs.size, dtype=np.int64)
    out[0::2] = gap
    out[1::2] = e_us - s_us
    return tuple(out.tolist()), slack


def merge_np(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return the union of intervals (s, e) as sorted disjoint start and end arrays."""
    keep = e > s
    if not keep.all():
        s, e = s[keep], e[keep]
    if s.size == 0:
        return _EMPTY_I64, _EMPTY_I64
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    cm = np.maximum.accumulate(e)
    brk = np.empty(s.size, dtype=bool)
    brk[0] = True
    np.greater(s[1:], cm[:-1], out=brk[1:])
    idx = np.flatnonzero(brk)
    last = np.empty(idx.size, dtype=np.intp)
    last[:-1] = idx[1:] - 1
    last[-1] = s.size - 1
    return s[idx], cm[last]


def bridge_np(bs: np.ndarray, be: np.ndarray, fill_ns: int) -> tuple[np.ndarray, np.ndarray]:
    """Return merged intervals with the gaps of at most fill_ns between neighbours filled."""
    if bs.size < 2:
        return bs, be
    brk = np.empty(bs.size, dtype=bool)
    brk[0] = True
    np.greater(bs[1:] - be[:-1], fill_ns, out=brk[1:])
    idx = np.flatnonzero(brk)
    last = np.empty(idx.size, dtype=np.intp)
    last[:-1] = idx[1:] - 1
    last[-1] = bs.size - 1
    return bs[idx], be[last]


@dataclass
class DeviceWindows:
    """Collect one device's records as arrays and close aligned windows once they are final."""

    window_ns: int = 500_000_000
    lag_ns: int = 1_000_000_000
    start_ns: int | None = None
    iv_limit: int = 600  # busy intervals kept per window for the wire
    max_pending: int = 2_000_000  # records held at most; beyond, the oldest chunk is dropped and counted
    graph_gap_fill_ns: int = GRAPH_GAP_FILL_NS  # in-graph launch gaps between kernel nodes count as busy
    _chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)
    _n: int = 0
    _next_t0: int | None = None
    _last_end: int | None = None
    _late: int = 0
    dropped: int = 0

    def add(self, s: np.ndarray, e: np.ndarray, k: np.ndarray) -> None:
        """Add records (start ns, end ns, kind code); records wholly inside closed windows count as late."""
        if s.size == 0:
            return
        if self._next_t0 is None:
            first = self.start_ns if self.start_ns is not None else int(s.min())
            self._next_t0 = window_start(first, self.window_ns)
        ok = e > s
        late = ok & (e <= self._next_t0)
        n_late = int(late.sum())
        if n_late:
            self._late += n_late
            ok &= ~late
        if not ok.all():
            s, e, k = s[ok], e[ok], k[ok]
        if s.size == 0:
            return
        self._chunks.append((s.astype(np.int64, copy=False), e.astype(np.int64, copy=False), k))
        self._n += s.size
        while self._n > self.max_pending and len(self._chunks) > 1:
            old = self._chunks.pop(0)
            self._n -= old[0].size
            self.dropped += old[0].size

    def reset(self, start_ns: int) -> None:
        """Forget everything and open the first window at start_ns (after a pause)."""
        self._chunks.clear()
        self._n = 0
        self.start_ns = start_ns
        self._next_t0 = window_start(start_ns, self.window_ns)
        self._last_end = None
        self._late = 0

    def forget_gap(self) -> None:
        """Forget where activity last ended (collection paused: a gap across the pause is unknown)."""
        self._last_end = None

    def pending(self) -> int:
        """Return the number of records held."""
        return self._n

    def close(self, now: int, max_windows: int | None = None) -> list[WindowSummary]:
        """Return the windows that ended at least lag_ns before now, oldest first (at most max_windows)."""
        if self._next_t0 is None:
            if self.start_ns is None:
                return []
            self._next_t0 = window_start(self.start_ns, self.window_ns)
        if self._next_t0 + self.window_ns > now - self.lag_ns:
            return []
        if len(self._chunks) > 1:
            s_all = np.concatenate([c[0] for c in self._chunks])
            e_all = np.concatenate([c[1] for c in self._chunks])
            k_all = np.concatenate([c[2] for c in self._chunks])
        elif self._chunks:
            s_all, e_all, k_all = self._chunks[0]
        else:
            s_all, e_all, k_all = _EMPTY_I64, _EMPTY_I64, _EMPTY_I8
        out: list[WindowSummary] = []
        while self._next_t0 + self.window_ns <= now - self.lag_ns and (
            max_windows is None or len(out) < max_windows
        ):
            t0 = self._next_t0
            t1 = t0 + self.window_ns
            inside = s_all < t1
            s = np.maximum(s_all[inside], t0)
            e = np.minimum(e_all[inside], t1)
            k = k_all[inside]
            nodes = k == GRAPH_KERNEL
            if nodes.any():
                ns, ne = bridge_np(*merge_np(s[nodes], e[nodes]), self.graph_gap_fill_ns)
                rest = ~nodes
                tr = k == GRAPH
                bs, be = merge_np(np.concatenate((s[rest], ns)), np.concatenate((e[rest], ne)))
                gs, ge = merge_np(np.concatenate((s[tr], ns)), np.concatenate((e[tr], ne)))
            else:
                bs, be = merge_np(s, e)
                g = k == GRAPH
                gs, ge = merge_np(s[g], e[g]) if g.any() else (_EMPTY_I64, _EMPTY_I64)
            starting = k[s_all[inside] >= t0]
            counts = np.bincount(starting, minlength=5) if starting.size else np.zeros(5, dtype=np.int64)
            counts[KERNEL] += counts[GRAPH_KERNEL]
            gap_counts, gap_sum = self._gaps(bs, be)
            iv, slack = pack_np(bs, be, t0, self.iv_limit)
            out.append(
                WindowSummary(
                    t0=t0,
                    t1=t1,
                    busy_ns=int((be - bs).sum()),
                    graph_busy_ns=int((ge - gs).sum()),
                    counts=tuple((KINDS[i], int(counts[i])) for i in range(4) if counts[i]),
                    gap_counts=gap_counts,
                    gap_sum_ns=gap_sum,
                    late=self._late,
                    iv=iv,
                    slack_ns=slack,
                )
            )
            self._late = 0
            carry = e_all > t1
            s_all, e_all, k_all = s_all[carry], e_all[carry], k_all[carry]
            self._next_t0 = t1
        self._chunks = [(s_all, e_all, k_all)] if s_all.size else []
        self._n = int(s_all.size)
        return out

    def _gaps(self, bs: np.ndarray, be: np.ndarray) -> tuple[tuple[int, ...], int]:
        if bs.size == 0:
            return (0,) * (len(IDLE_GAP_BUCKETS_NS) + 1), 0
        prev = np.empty(bs.size, dtype=np.int64)
        prev[1:] = be[:-1]
        if self._last_end is None:
            prev[0] = bs[0]  # nothing ran before: no gap
        else:
            prev[0] = self._last_end
        gaps = bs - prev
        gaps = gaps[gaps > GAP_MIN_NS]
        last = int(be[-1])
        self._last_end = last if self._last_end is None else max(self._last_end, last)
        if gaps.size == 0:
            return (0,) * (len(IDLE_GAP_BUCKETS_NS) + 1), 0
        idx = np.searchsorted(_BOUNDS, gaps, side="left")
        counts = np.bincount(idx, minlength=len(IDLE_GAP_BUCKETS_NS) + 1)
        return tuple(int(c) for c in counts), int(gaps.sum())
