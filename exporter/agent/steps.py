"""Engine steps counted and timed inside the engine, with the GPU busy time inside each step."""

from __future__ import annotations

import bisect
import collections
import threading
import time
from typing import Any

from exporter import wire
from exporter.analysis.intervals import WindowSummary

STEP_BOUNDS_NS = tuple(round(b * 1e9) for b in wire.STEP_BUCKETS_SECONDS)
MAX_STEPS = 100_000


class StepTracker:
    """Collect (engine, start, end, tokens) per step; add GPU busy ns as windows close; hand out totals."""

    def __init__(self) -> None:
        self._steps: collections.deque[list[Any]] = collections.deque(maxlen=MAX_STEPS)
        self._lock = threading.Lock()
        self._ready_until = 0
        self._gpu_seen = False  # a window of a device closed here: step GPU time is measured
        self.lag_ns = 1_500_000_000  # when no window of this process closes (GPU work elsewhere)

    def record(self, engine: str, t0: int, t1: int, tokens: int = 0, seqs: int = 0) -> None:
        """Record one step (CLOCK_REALTIME ns, CUPTI's clock); cheap, called on the engine's thread."""
        self._steps.append([engine, t0, t1, tokens, 0, seqs])

    def attach_gpu(self, summary: WindowSummary, dev: int) -> None:
        """Add the busy time of one closed window to the steps that overlap it."""
        self._gpu_seen = True
        if summary.t1 > self._ready_until:
            self._ready_until = summary.t1
        if not self._steps or not summary.iv:
            return
        starts: list[int] = []
        ends: list[int] = []
        for s, e in wire.unpack_intervals(summary.iv, summary.t0):
            starts.append(s)
            ends.append(e)
        cum = [0]
        for s, e in zip(starts, ends, strict=True):
            cum.append(cum[-1] + e - s)

        def busy_before(t: int) -> int:
            i = bisect.bisect_right(starts, t) - 1
            if i < 0:
                return 0
            return cum[i] + min(max(t - starts[i], 0), ends[i] - starts[i])

        with self._lock:
            for step in self._steps:
                a, b = max(step[1], summary.t0), min(step[2], summary.t1)
                if b > a:
                    step[4] += busy_before(b) - busy_before(a)

    def take(self, final: bool = False) -> list[wire.Steps]:
        """Return per-engine totals of the steps whose windows have closed (all of them when final)."""
        if not self._steps:
            return []
        ready_until = self._ready_until or (time.time_ns() - self.lag_ns)
        totals: dict[str, list[Any]] = {}
        with self._lock:
            while self._steps and (final or self._steps[0][2] <= ready_until):
                engine, t0, t1, tokens, gpu, seqs = self._steps.popleft()
                tot = totals.setdefault(engine, [0, 0, 0, 0, [0] * (len(STEP_BOUNDS_NS) + 1), t0, t1, 0])
                wall = t1 - t0
                tot[0] += 1
                tot[1] += wall
                tot[2] += gpu
                tot[3] += tokens
                tot[4][bisect.bisect_left(STEP_BOUNDS_NS, wall)] += 1
                tot[5] = min(tot[5], t0)
                tot[6] = max(tot[6], t1)
                tot[7] += seqs
        return [
            wire.Steps(
                engine=e,
                n=t[0],
                wall=t[1],
                gpu=t[2],
                tokens=t[3],
                seqs=t[7],
                hist=tuple(t[4]),
                t0=t[5],
                t1=t[6],
                measured=1 if self._gpu_seen else 0,
            )
            for e, t in totals.items()
        ]
