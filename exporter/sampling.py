"""The sampler: every tick, read all sources concurrently and build one immutable Snapshot.

A source that fails or times out marks itself down in that tick's Snapshot (and logs once per
change of state); the others carry on. History is a bounded ring of Snapshots: those the
verdict's windows still read are whole, older ones are compact records (`compact`), so memory
per GPU stays small and flat however long the history. Only the newest Snapshot keeps its totals,
its engines' raw pages and its agents' raw windows (`retire`).
"""

from __future__ import annotations

import asyncio
import collections
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import structlog

from exporter.analysis.pipeline import advance
from exporter.config import Config
from exporter.probe.scheduled import ProbeScheduler
from exporter.snapshot import EngineReading, GpuReading, Snapshot, SourceStatus
from exporter.snapshot.frozen import replace
from exporter.snapshot.totals import EMPTY
from exporter.sources.base import AsyncClosable, Handoff, Source, SourceUnavailable, Startable

log = structlog.get_logger("boundwatch.sampler")

# Which Snapshot field each source's reading fills.
SOURCE_FIELDS: Mapping[str, str] = {"nvml": "gpus", "host": "host", "engine": "engines", "agent": "agent"}


_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _shape(message: str) -> str:
    """Return an error text with its numbers blanked, so a failure whose figures vary logs once."""
    return _NUMBER.sub("#", message)


class CompactGpus:
    """Compact GPU readings shared by their fields, for one history (its Sampler owns it).

    From one tick to the next a GPU's compact reading is most often the one it had (utilization moves
    in whole percent), so history records share it. Bounded: past `size` kinds it starts afresh.
    """

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._kept: dict[tuple[int, str, str, str, type, float | None], GpuReading] = {}

    def __call__(self, g: GpuReading) -> GpuReading:
        """Return what a compact record keeps of a GPU reading: index, UUID, name, driver and utilization."""
        u = g.utilization
        if u == 0:  # 0.0 and -0.0 are one key but not one value: not shared
            return GpuReading(g.index, g.uuid, g.name, g.driver, utilization=u)
        key = (g.index, g.uuid, g.name, g.driver, type(u), u)  # 1 and 1.0 are one key too: typed
        kept = self._kept.get(key)
        if kept is None:
            if len(self._kept) >= self.size:
                self._kept.clear()
            kept = self._kept[key] = GpuReading(g.index, g.uuid, g.name, g.driver, utilization=u)
        return kept


def compact(snap: Snapshot, gpus: CompactGpus | None = None) -> Snapshot:
    """Return what an older Snapshot keeps: what is read of it once the verdict's windows passed it.

    Kept: the tick's times, the source statuses, the picked busy ratios, each GPU's index, UUID,
    name and utilization, each engine's running and waiting requests (the scheduled probe's idle
    check) and spec-decode counters (the acceptance window, analysis.engine), and the verdicts
    without their evidence (a timeline). Readings, agent windows, counters and evidence are
    dropped: they are read from the newest Snapshots only. `gpus`: the history's shared GPU records.
    """
    share = gpus or CompactGpus()
    return Snapshot(
        seq=snap.seq,
        at=snap.at,
        mono=snap.mono,
        interval=snap.interval,
        dt=snap.dt,
        gpus=tuple(share(g) for g in snap.gpus),
        engines=tuple(
            EngineReading(
                e.name,
                e.kind,
                running=e.running,
                waiting=e.waiting,
                error=e.error,
                spec_draft_tokens_total=e.spec_draft_tokens_total,
                spec_accepted_tokens_total=e.spec_accepted_tokens_total,
                page_read=e.page_read,
            )
            for e in snap.engines
        ),
        verdicts=tuple(v.without_evidence() for v in snap.verdicts),
        busy=snap.busy,
        sources=snap.sources,
        probe=snap.probe,
        gpu_uuids=snap.gpu_uuids,
    )


def retire(snap: Snapshot) -> Snapshot:
    """Return what the Snapshot before the newest keeps: no totals, no engine's raw page and no agent's
    raw windows (analysis read them: the page into the engine's figures, the windows into each GPU's
    activity and the union state the next tick carries). The agent reading's other parts are kept
    as they are (the same objects), so what analysis found from them is found again by identity.
    """
    engines = snap.engines
    if any(e.raw is not None for e in engines):
        engines = tuple(replace(e, raw=None) if e.raw is not None else e for e in engines)
    agent = snap.agent
    if agent is not None and agent.windows:
        agent = replace(agent, windows=())
    return replace(snap, totals=EMPTY, engines=engines, agent=agent)


def _over_bound(source: Any) -> int:
    """Return what a source left unread beyond its bound (a source may say so in `over_bound`; else 0)."""
    return int(getattr(source, "over_bound", 0))


class _SourceState:
    def __init__(self) -> None:
        self.up: bool | None = None
        self.errors_total = 0
        self.last_error = ""
        self.pending: asyncio.Future[Any] | None = None
        self.started = 0.0
        self.ended: float | None = None  # when the pending read finished (perf_counter)
        self.handoff: Handoff | None = None  # the tick's handoff the pending read started under
        self.last_reading: Any = None
        self.last_ok: float | None = None
        self.start_read: Callable[[], asyncio.Future[Any]] | None = None  # the source's, if it has one

    def finished(self, _future: asyncio.Future[Any]) -> None:
        """Note when the pending read finished, so its duration does not count the wait for the others."""
        self.ended = time.perf_counter()


class Sampler:
    """Read the sources each tick and keep the latest Snapshots."""

    def __init__(
        self,
        cfg: Config,
        sources: Sequence[Source],
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        on_tick: Callable[[Snapshot], None] | None = None,
        probes: ProbeScheduler | None = None,
    ) -> None:
        self.cfg = cfg
        self.sources = list(sources)
        self._clock = clock
        self._wall = wall
        self._state = {s.name: _SourceState() for s in self.sources}
        for s in self.sources:
            self._state[s.name].start_read = getattr(s, "start_read", None)
        # the sources whose reads run in a reader thread of theirs (NVML, the engine): `run` starts
        # them a tick ahead, their threads running them when it is due (see Handoff)
        self._ahead = [s for s in self.sources if getattr(s, "reads_in_thread", False)]
        size = max(2, int(cfg.history_seconds / cfg.tick_seconds) + 1)
        self._history: collections.deque[Snapshot] = collections.deque(maxlen=size)
        self._compact_gpus = CompactGpus()  # what the compacted history shares
        self._seq = 0
        self._on_tick = on_tick
        self.probes = probes or (ProbeScheduler(cfg) if cfg.probe.enabled else None)
        self._budget = 0.8 * cfg.tick_seconds
        v = cfg.verdict  # how far back the verdict's windows read, with two ticks to spare
        self._reach = max(v.window_seconds, v.busy_window_seconds, v.offered_window_seconds)
        self._reach += 2 * cfg.tick_seconds
        self._compacted_seq = 0  # Snapshots up to this seq are compact
        self._stale = max(2.0, 4 * cfg.tick_seconds)
        self.tick_cpu_seconds = 0.0
        self._closed = False

    def now(self) -> float:
        """Return the sampler's monotonic clock reading."""
        return self._clock()

    def latest(self, max_age: float | None = None) -> Snapshot | None:
        """Return the newest Snapshot, or None if there is none younger than max_age seconds."""
        if not self._history:
            return None
        snap = self._history[-1]
        if max_age is not None and self._clock() - snap.mono > max_age:
            return None
        return snap

    def history(self) -> tuple[Snapshot, ...]:
        """Return the kept Snapshots, oldest first."""
        return tuple(self._history)

    def _start(
        self, source: Source, handoff: Handoff | None = None, delay: float = 0.0
    ) -> asyncio.Future[Any]:
        """Return the source's read in flight, starting one unless the last is still running (due in `delay` s)."""
        state = self._state[source.name]
        if state.pending is None:
            state.started, state.ended, state.handoff = time.perf_counter() + delay, None, handoff
            start = state.start_read  # a read that is one call in a thread, or none: no task around it
            try:
                state.pending = start() if start is not None else asyncio.ensure_future(source.read())
            except Exception as exc:  # a start that raises fails this read, as a read's task would
                state.pending = asyncio.get_running_loop().create_future()
                state.pending.set_exception(exc)
            if state.pending.done():
                state.ended = time.perf_counter()
            else:
                state.pending.add_done_callback(state.finished)
        return state.pending

    def _result(self, source: Source) -> tuple[Any, SourceStatus]:
        """Return one source's reading and status once the tick's wait is over.

        A read still running at the end of the budget goes on in the background and is awaited
        again next tick (never started twice); meanwhile the tick uses the source's last reading
        while it is younger than the stale limit. So a saturated API server that answers in 1.5 s
        slows its own figures, not the tick, and integrals stay exact through each tick's dt.
        """
        state = self._state[source.name]
        future = state.pending
        assert future is not None
        if not future.done():
            duration = time.perf_counter() - state.started
            age = None if state.last_ok is None else self._clock() - state.last_ok
            if age is not None and age <= self._stale:
                return state.last_reading, SourceStatus(
                    source.name,
                    True,
                    state.errors_total,
                    "",
                    duration,
                    late=True,
                    over_bound=_over_bound(source),
                )
            return None, self._down(
                source.name, state, f"read still running after {duration:.1f}s", duration, False
            )
        ended = state.handoff.ended.get(future) if state.handoff is not None else None
        ended = ended or state.ended or time.perf_counter()  # in its thread, else when the loop saw it
        duration = ended - state.started
        state.pending, state.handoff = None, None
        exc = future.exception()
        if exc is not None:
            counted = getattr(exc, "counted", True)  # an absent engine is a state; a driver down counts
            return None, self._down(
                source.name, state, str(exc) or type(exc).__name__, duration, counted, exc
            )
        reading = future.result()
        if state.up is False:
            log.info("source_up", source=source.name)
        state.up, state.last_error = True, ""
        state.last_reading, state.last_ok = reading, self._clock()
        return reading, SourceStatus(
            source.name, True, state.errors_total, "", duration, over_bound=_over_bound(source)
        )

    def _down(
        self,
        name: str,
        state: _SourceState,
        message: str,
        duration: float,
        counted: bool,
        exc: BaseException | None = None,
    ) -> SourceStatus:
        if counted:
            state.errors_total += 1
        if state.up is not False or _shape(message) != _shape(state.last_error):
            level = log.info if isinstance(exc, SourceUnavailable) else log.warning
            level("source_down", source=name, error=message)
        state.up, state.last_error = False, message
        return SourceStatus(name, False, state.errors_total, message, duration)

    async def tick(self, budget: float | None = None, due: float | None = None) -> Snapshot:
        """Read every source once and return the new Snapshot.

        A source whose read `run` started ahead is awaited, not started again; `budget` is what is
        left of the wait for late reads (the tick's own budget, 0.8 of a tick, by default). `due`:
        when those reads were due (the sampler's clock), which times the tick, as a tick that starts
        its reads itself is timed by its start: rates read over `dt` then span what the reads span,
        however long one of them took.
        """
        cpu0 = time.process_time()
        mono, at = self._clock(), self._wall()
        if due is not None and due < mono:
            mono, at = due, at - (mono - due)
        # The reads that run in reader threads come back together: the last to finish wakes the loop once.
        handoff = Handoff(asyncio.get_running_loop())
        with handoff.opened():
            started = [self._start(s, handoff) for s in self.sources]
        running = {f for f in started if not f.done()}
        if running:  # one wait for all the reads (each has the same budget), not a task per source
            await asyncio.wait(running, timeout=self._budget if budget is None else budget)
            if handoff.take():  # past the budget with a read still running: the others' outcomes, now,
                await asyncio.sleep(0)  # and their callbacks (an engine's change of state logged) first
        results = [self._result(s) for s in self.sources]
        prev = self._history[-1] if self._history else None
        fields: dict[str, Any] = {}
        statuses = []
        for source, (reading, status) in zip(self.sources, results, strict=True):
            statuses.append(status)
            field = SOURCE_FIELDS.get(source.name)
            if field is not None and reading is not None:
                fields[field] = reading
        self._seq += 1
        raw = Snapshot(
            seq=self._seq,
            at=at,
            mono=mono,
            interval=self.cfg.tick_seconds,
            dt=(mono - prev.mono) if prev is not None else 0.0,
            sources=tuple(statuses),
            **fields,
        )
        snap = advance(tuple(self._history), raw, self.cfg)
        if self.probes is not None:  # the self-test runs in a subprocess, only while all is idle
            snap = replace(snap, probe=self.probes.tick((*self._history, snap)))
        if self._history:  # only the newest Snapshot's counters and pages are read: older ones keep none
            self._history[-1] = retire(self._history[-1])
        self._history.append(snap)
        for source in self.sources:  # a source that reads by what the last tick found (engine pages)
            follow = getattr(source, "follow", None)
            if follow is not None:
                follow(snap)
        self._compact_old()
        self.tick_cpu_seconds += time.process_time() - cpu0
        if self._on_tick is not None:
            self._on_tick(snap)
        return snap

    def _compact_old(self) -> None:
        """Replace the Snapshots no window reads any more (a newer one is also past its edge) by compact ones."""
        h = self._history
        edge = h[-1].mono - self._reach
        top = len(h) - 2
        while top >= 0 and h[top + 1].mono > edge:
            top -= 1
        if top < 0 or h[top].seq <= self._compacted_seq:
            return
        done, self._compacted_seq = self._compacted_seq, h[top].seq
        while top >= 0 and h[top].seq > done:
            h[top] = compact(h[top], self._compact_gpus)
            top -= 1

    async def run(self, stop: asyncio.Event) -> None:
        """Tick on a fixed schedule until stop is set; a late tick skips, never bunches.

        Once a tick is done, the next one's reads in reader threads are started at once, due at its
        time (`_ahead_of`): the loop then sleeps until they are all back (or the budget is spent),
        so it wakes once a tick rather than also at the tick's start to hand them out.
        """
        interval = self.cfg.tick_seconds
        next_at = self._clock()
        stopped = asyncio.ensure_future(stop.wait())  # one waiter for the whole run, not a task per tick
        budget: float | None = None
        due: float | None = None
        try:
            while not stop.is_set():
                try:
                    await self.tick(budget, due)
                except Exception:  # a bug in analysis must not stop sampling
                    log.exception("tick_failed")
                next_at += interval
                now = self._clock()
                if next_at < now:
                    next_at = now + interval - ((now - next_at) % interval)
                budget = await self._ahead_of(next_at - now, stopped)
                due = next_at if budget is not None else None  # the reads started ahead were due then
        finally:
            stopped.cancel()

    async def _ahead_of(self, delay: float, stopped: asyncio.Future[Any]) -> float | None:
        """Start the next tick's threaded reads, due in `delay` s, and wait until they are back or it is time.

        Returns what is left of the tick's budget for its reads still running (None: the whole budget,
        when nothing was started ahead). Returns early once stop is set.
        """
        delay = max(0.0, delay)
        loop = asyncio.get_running_loop()
        handoff = Handoff(loop, not_before=time.monotonic() + delay, period=self.cfg.tick_seconds)
        with handoff.opened():
            started = [self._start(s, handoff, delay) for s in self._ahead]
        running = {f for f in started if not f.done()}
        if not running:
            await asyncio.wait({stopped}, timeout=delay)
            return None
        due = loop.time() + delay
        end = due + self._budget
        while running and not stopped.done() and (left := end - loop.time()) > 0:
            _, running = await asyncio.wait(
                running | {stopped}, timeout=left, return_when=asyncio.FIRST_COMPLETED
            )
            running.discard(stopped)
        if running and not stopped.done():
            if handoff.take():  # past the budget with a read still running: the others' outcomes now
                await asyncio.sleep(0)
        wait = due - loop.time()
        if wait > 0 and not stopped.done():  # every read back before its time (none runs early): wait for it
            await asyncio.wait({stopped}, timeout=wait)
        return max(0.0, end - loop.time())

    async def start(self) -> None:
        """Start every source that has a start(); one that cannot start reports itself down each tick."""
        for source in self.sources:
            if isinstance(source, Startable):
                try:
                    await source.start()
                except Exception as exc:
                    log.warning("source_start_failed", source=source.name, error=str(exc))

    async def aclose(self) -> None:
        """Stop a probe still running, then close every source once (aclose() where it has one)."""
        if self.probes is not None:
            await self.probes.close()
        for source in self._closing():
            try:
                if isinstance(source, AsyncClosable):
                    await source.aclose()
                else:
                    source.close()
            except Exception:
                log.exception("source_close_failed", source=source.name)

    def close(self) -> None:
        """Close every source once with its close(), without awaiting (outside an event loop)."""
        for source in self._closing():
            try:
                source.close()
            except Exception:
                log.exception("source_close_failed", source=source.name)

    def _closing(self) -> list[Source]:
        """Drop reads still in flight and return the sources to close: all of them, the first time only."""
        for state in self._state.values():
            if state.pending is not None:
                state.pending.cancel()
        if self._closed:
            return []
        self._closed = True
        return self.sources
