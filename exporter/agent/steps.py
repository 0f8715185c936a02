"""Engine steps counted and timed inside the engine, with the scheduler's counts and the step's graph mode.

Steps are keyed by (engine, DP rank) inside one process, and the process's pid names the engine
core on the wire, so two engines never merge. Running and waiting requests are integrated between
steps by the left rule (the counts read after one step hold until the next), so the sidecar gets
request-seconds exactly. Where a step's CUDA-graph mode is decided in another process (vLLM's GPU
workers), that process sends mode counts alone, owned by its parent (the engine core).
"""

from __future__ import annotations

import bisect
import collections
import os
import threading
import time
from collections.abc import Generator
from typing import Any

from exporter import wire
from exporter.agent.switch import Carry
from exporter.analysis.intervals import WindowSummary

STEP_BOUNDS_NS = tuple(round(b * 1e9) for b in wire.STEP_BUCKETS_SECONDS)
MAX_STEPS = 100_000
MAX_KEYS = 16  # (engine, dp) pairs one process reports at most
# Raw steps are folded in chunks this long, one chunk a tick phase (exporter.agent.light): on the
# engine's thread each phase is one pause, and the agent's thread hands the GIL back between phases.
FOLD_CHUNK = 8

# step list slots
_ENGINE, _T0, _T1, _TOKENS, _GPU, _SEQS, _RUN, _WAIT, _RUNNING, _WAITING, _MAXSEQS, _DP, _MODE = range(13)
MODE_UNKNOWN, MODE_GRAPH, MODE_EAGER = 0, 1, 2


class StepTracker:
    """Collect steps per (engine, DP rank); add GPU busy ns as windows close; hand out totals."""

    def __init__(self) -> None:
        self._steps: collections.deque[list[Any]] = collections.deque(maxlen=MAX_STEPS)
        self._lock = threading.Lock()
        self._ready_until = 0
        self._gpu_seen = False  # a window of a device closed here: step GPU time is measured
        self.lag_ns = 1_500_000_000  # when no window of this process closes (GPU work elsewhere)
        self._last: dict[tuple[str, int], tuple[int, int, int]] = {}  # key -> (t, running, waiting)
        self._modes: dict[tuple[str, int], list[int]] = {}  # key -> [graph, eager], counted elsewhere
        self.engine_here = False  # this process runs an engine core's steps (mode counts are its own)
        # per_step: keep every step until this process's windows close (CUPTI attaches GPU time to it);
        # else (the light agent) fold each step into cumulative totals at once: O(1) on the engine's
        # thread, written only there, and read as differences on the agent's thread (no lock)
        self.per_step = True
        self._cum: dict[tuple[str, int], tuple[int, ...]] = {}
        self._hist: dict[tuple[str, int], list[int]] = {}
        self._taken: dict[tuple[str, int], tuple[tuple[int, ...], list[int]]] = {}
        self._modes_taken: dict[tuple[str, int], tuple[int, int]] = {}
        self._raw: collections.deque[tuple[Any, ...]] = collections.deque(maxlen=MAX_STEPS)
        self._carry = Carry()  # sampled counts scaled to the tick (exporter.agent.switch)

    def record(
        self,
        engine: str,
        t0: int,
        t1: int,
        tokens: int = 0,
        seqs: int = 0,
        running: int = -1,
        waiting: int = -1,
        max_seqs: int = 0,
        dp: int = -1,
        mode: int = MODE_UNKNOWN,
        n: int = 1,
    ) -> None:
        """Record n steps ending at t1 (CLOCK_REALTIME ns, t1 - t0 their wall time together) with the counts read after them.

        The light path only appends the raw figures (one tuple, ~0.2 us): the agent's thread folds
        them into totals, integrals and the histogram (each step at their mean wall time) when it
        takes them. The per-step path (CUPTI) keeps each step and takes n = 1.
        """
        if not self.per_step:
            self._raw.append((engine, t0, t1, tokens, seqs, running, waiting, max_seqs, dp, mode, max(1, n)))
            return
        run_ns, wait_ns = self._integrate(engine, dp, t1, running, waiting)
        self._steps.append(
            [engine, t0, t1, tokens, 0, seqs, run_ns, wait_ns, running, waiting, max_seqs, dp, mode]
        )

    def _integrate(self, engine: str, dp: int, t1: int, running: int, waiting: int) -> tuple[int, int]:
        """Return the request-ns since the previous step of this engine (left rule), and remember this one."""
        run_ns = wait_ns = 0
        if running >= 0 or waiting >= 0:
            key = (engine, dp)
            prev = self._last.get(key)
            if prev is not None:
                dt = t1 - prev[0]
                if dt > 0:
                    if prev[1] > 0:
                        run_ns = prev[1] * dt
                    if prev[2] > 0:
                        wait_ns = prev[2] * dt
                self._last[key] = (t1, running, waiting)
            elif len(self._last) < MAX_KEYS:
                self._last[key] = (t1, running, waiting)
        return run_ns, wait_ns

    def fold(self, limit: int = FOLD_CHUNK) -> bool:
        """Fold at most limit raw steps into the cumulative totals; return whether more are left."""
        self._fold(limit)
        return bool(self._raw)

    def _fold(self, limit: int = MAX_STEPS) -> None:
        """Fold the raw steps the engine's thread appended into the cumulative totals (at most limit)."""
        raw = self._raw
        while raw and limit > 0:
            limit -= 1
            engine, t0, t1, tokens, seqs, running, waiting, max_seqs, dp, mode, n = raw.popleft()
            run_ns, wait_ns = self._integrate(engine, dp, t1, running, waiting)
            key = (engine, dp)
            c = self._cum.get(key)
            if c is None:
                if len(self._cum) >= MAX_KEYS:
                    continue
                c = (0, 0, 0, 0, 0, 0, 0, 0, t0, t1, -1, -1, 0)
                self._hist[key] = [0] * (len(STEP_BOUNDS_NS) + 1)
            wall = t1 - t0
            self._hist[key][bisect.bisect_left(STEP_BOUNDS_NS, wall // n)] += n
            self._cum[key] = (
                c[0] + n, c[1] + wall, c[2] + tokens, c[3] + seqs, c[4] + run_ns, c[5] + wait_ns,
                c[6] + (mode == MODE_GRAPH) * n, c[7] + (mode == MODE_EAGER) * n, c[8], t1,
                running, waiting, max_seqs or c[12],
            )  # fmt: skip

    def count_mode(self, engine: str, dp: int, graph: bool) -> None:
        """Count one step's CUDA-graph mode where the step itself is counted elsewhere (a GPU worker)."""
        key = (engine, dp)
        m = self._modes.get(key)
        if m is None:
            if len(self._modes) >= MAX_KEYS:
                return
            m = self._modes[key] = [0, 0]
        m[0 if graph else 1] += 1  # written on this thread only; the agent's thread reads differences

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
                a, b = max(step[_T0], summary.t0), min(step[_T1], summary.t1)
                if b > a:
                    step[_GPU] += busy_before(b) - busy_before(a)

    def take(self, final: bool = False, scale: float = 1.0) -> list[wire.Steps]:
        """Return per-(engine, DP rank) totals of the steps whose windows have closed (all when final).

        scale: what the light path's counts since the last take stand for (the tick's span over the
        time the hooks were in: exporter.agent.switch); counts of steps, tokens, sequences, wall
        time, modes and the histogram are multiplied by it, request-seconds (read every tick) not.
        """
        modes = self._take_modes(scale)
        self._fold()
        totals: dict[tuple[str, int], dict[str, Any]] = {}
        if self._steps:
            ready_until = self._ready_until or (time.time_ns() - self.lag_ns)
            with self._lock:
                while self._steps and (final or self._steps[0][_T1] <= ready_until):
                    self._add(totals, self._steps.popleft())
        out = [self._steps_of(key, t) for key, t in totals.items()]
        out += self._take_cumulative(scale)
        return self._merge_modes(out, modes)

    def take_phased(self, scale: float = 1.0) -> Generator[None, None, list[wire.Steps]]:
        """take(final=True, scale) of the light path in parts, yielding between them; returns the steps.

        On the engine's thread (the light agent's tick) each part is one pause: the mode counts, the raw
        steps FOLD_CHUNK at a time, the totals' differences scaled, the records built.
        """
        modes = self._take_modes(scale)
        yield
        while self._raw:
            self.fold()
            yield
        gains = self._cumulative_gains(scale)
        yield
        out = [self._light_steps(*gain) for gain in gains]
        return self._merge_modes(out, modes)

    def _merge_modes(
        self, out: list[wire.Steps], modes: dict[tuple[str, int], tuple[int, int]]
    ) -> list[wire.Steps]:
        """Add each key's mode counts to its steps (or as a record of their own, owned by the engine core)."""
        owner = 0 if self.engine_here else os.getppid()
        for key, (graph, eager) in modes.items():
            i = next((j for j, st in enumerate(out) if (st.engine, st.dp) == key), -1)
            if owner == 0 and i >= 0:
                out[i] = _with_modes(out[i], graph, eager)
            else:
                out.append(
                    wire.Steps(engine=key[0], n=0, wall=0, dp=key[1], graph=graph, eager=eager, owner=owner)
                )
        return out

    def _take_modes(self, scale: float = 1.0) -> dict[tuple[str, int], tuple[int, int]]:
        out: dict[tuple[str, int], tuple[int, int]] = {}
        for key, m in list(self._modes.items()):
            graph, eager = m[0], m[1]
            g0, e0 = self._modes_taken.get(key, (0, 0))
            if graph > g0 or eager > e0:
                self._modes_taken[key] = (graph, eager)
                out[key] = (
                    self._carry((*key, "mg"), graph - g0, scale),
                    self._carry((*key, "me"), eager - e0, scale),
                )
        return out

    def _take_cumulative(self, scale: float = 1.0) -> list[wire.Steps]:
        """Return what the cumulative totals gained since the last take (the light path), scaled."""
        return [self._light_steps(*gain) for gain in self._cumulative_gains(scale)]

    def _cumulative_gains(
        self, scale: float
    ) -> list[tuple[tuple[str, int], tuple[int, ...], tuple[int, ...], list[int]]]:
        """Return (key, totals now, totals at the last take, scaled gains) for each key that stepped since."""
        out = []
        for key, c in list(self._cum.items()):
            hist = list(self._hist[key])
            prev, prev_hist = self._taken.get(key, ((0,) * 13, [0] * len(hist)))
            if c[0] == prev[0]:
                continue
            self._taken[key] = (c, hist)
            # wall, tokens, seqs, graph and eager steps, then the buckets: each scaled with its own carry
            got = [c[1] - prev[1], c[2] - prev[2], c[3] - prev[3], c[6] - prev[6], c[7] - prev[7]]
            got += [max(0, a - b) for a, b in zip(hist, prev_hist, strict=True)]
            out.append((key, c, prev, self._carry.vector(key, got, scale)))
        return out

    def _light_steps(
        self, key: tuple[str, int], c: tuple[int, ...], prev: tuple[int, ...], gains: list[int]
    ) -> wire.Steps:
        wall, tokens, seqs, graph, eager, *buckets = gains
        return wire.Steps(
            engine=key[0],
            n=sum(buckets),  # the histogram counts n steps (the wire checks it)
            wall=wall,
            tokens=tokens,
            seqs=seqs,
            run_ns=c[4] - prev[4],
            wait_ns=c[5] - prev[5],
            graph=graph,
            eager=eager,
            hist=tuple(buckets),
            t0=prev[9] if prev[0] else c[8],  # from the previous take's newest step end
            t1=c[9],
            running=c[10],
            waiting=c[11],
            max_seqs=c[12],
            dp=key[1],
            measured=1 if self._gpu_seen else 0,
        )

    @staticmethod
    def _add(totals: dict[tuple[str, int], dict[str, Any]], step: list[Any]) -> None:
        key = (step[_ENGINE], step[_DP])
        t = totals.get(key)
        if t is None:
            t = totals[key] = {
                "n": 0, "wall": 0, "gpu": 0, "tokens": 0, "seqs": 0, "run": 0, "wait": 0, "graph": 0,
                "eager": 0, "hist": [0] * (len(STEP_BOUNDS_NS) + 1), "t0": step[_T0], "t1": step[_T1],
                "running": -1, "waiting": -1, "max_seqs": 0,
            }  # fmt: skip
        wall = step[_T1] - step[_T0]
        t["n"] += 1
        t["wall"] += wall
        t["gpu"] += step[_GPU]
        t["tokens"] += step[_TOKENS]
        t["seqs"] += step[_SEQS]
        t["run"] += step[_RUN]
        t["wait"] += step[_WAIT]
        t["graph"] += step[_MODE] == MODE_GRAPH
        t["eager"] += step[_MODE] == MODE_EAGER
        t["hist"][bisect.bisect_left(STEP_BOUNDS_NS, wall)] += 1
        t["t0"] = min(t["t0"], step[_T0])
        if step[_T1] >= t["t1"]:
            t["t1"] = step[_T1]
            if step[_RUNNING] >= 0 or step[_WAITING] >= 0:
                t["running"], t["waiting"] = step[_RUNNING], step[_WAITING]
        if step[_MAXSEQS]:
            t["max_seqs"] = step[_MAXSEQS]

    def _steps_of(self, key: tuple[str, int], t: dict[str, Any]) -> wire.Steps:
        return wire.Steps(
            engine=key[0],
            n=t["n"],
            wall=t["wall"],
            gpu=t["gpu"],
            tokens=t["tokens"],
            seqs=t["seqs"],
            hist=tuple(t["hist"]),
            t0=t["t0"],
            t1=t["t1"],
            measured=1 if self._gpu_seen else 0,
            graph=t["graph"],
            eager=t["eager"],
            run_ns=t["run"],
            wait_ns=t["wait"],
            running=t["running"],
            waiting=t["waiting"],
            max_seqs=t["max_seqs"],
            dp=key[1],
        )


def _with_modes(s: wire.Steps, graph: int, eager: int) -> wire.Steps:
    import dataclasses

    return dataclasses.replace(s, graph=s.graph + graph, eager=s.eager + eager)
