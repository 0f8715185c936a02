"""Integrate the engines' scheduler state and API-server saturation over ticks; count engine steps.

Running and waiting requests are integrated by the left (zero-order hold) rule: the value read
at the previous tick is held until this tick, so each tick adds `prev.running * snap.dt`. A
gauge is a step function that changes between reads, and the value read is the one in force
from then on; the trapezoid rule would invent a linear ramp that never happened. The last value
read is integrated on the next tick, and an interval whose start was not read adds nothing.

Where an agent reports an engine's scheduler counts (`serve_counts`: its engine cores' running
and waiting after every step, joined to the engine by pid), those serve the engine's running and
waiting, held per engine core while its agent lives, and the integrals are the agent's own
request-seconds, integrated between steps inside the engine by the same left rule: exact, and
independent of how often the page is read. Otherwise the page's gauges serve them, read every tick.

API-server saturation uses this tick's reading, since its CPU figure already covers the tick
that just ended: a server is saturated while its busiest thread's demand (time running plus
time waiting to run, from schedstat; its CPU where schedstat is missing) reaches
`engine.api_server_saturated` of a core. Demand, not CPU: a thread that a crowded host or a CPU
quota lets run 60% of the time still wanted the whole core.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from exporter.analysis.dedup import counter_delta, step_increments
from exporter.analysis.verdict import once, owned_steps
from exporter.config import Config
from exporter.snapshot import Snapshot
from exporter.snapshot.agent import EngineSteps
from exporter.snapshot.engine import CoreCounts, EngineReading, demand
from exporter.snapshot.totals import EngineMethod, EngineServer, EngineTotals, Tally, Totals

# An agent in these states has stopped reporting: the counts it last sent are no longer held.
GONE = frozenset({"stale", "stopped"})


def window_acceptance(history: Sequence[tuple[float, float | None, float | None]]) -> float | None:
    """Return accepted over proposed draft tokens across a window of (time, accepted, drafted) readings."""
    rows = [(t, a, d) for t, a, d in history if a is not None and d is not None]
    if len(rows) < 2:
        return None
    accepted = counter_delta(rows[0][1], rows[-1][1])
    drafted = counter_delta(rows[0][2], rows[-1][2])
    if not drafted or accepted is None:
        return None
    return min(1.0, accepted / drafted)


def _previous(prev: Snapshot | None, name: str) -> EngineReading | None:
    if prev is None:
        return None
    return next((e for e in prev.engines if e.name == name and not e.error), None)


def _owned(snap: Snapshot, reading: EngineReading) -> tuple[EngineSteps, ...]:
    """Return the agent steps of an engine this tick (joined by pid, name, or the only engine of its kind)."""
    return once(reading, owned_steps(snap).get(reading.name, ()))


def _counted(snap: Snapshot, reading: EngineReading) -> tuple[EngineSteps, ...]:
    """Return the agent steps of an engine this tick that came from one of its own processes (joined by pid)."""
    return tuple(st for st in _owned(snap, reading) if st.pid and st.pid in reading.pids)


def _agent_steps(snap: Snapshot, name: str) -> float | None:
    """Return the agent's steps for an engine this tick, None without any."""
    reading = next((e for e in snap.engines if e.name == name), None)
    found = _owned(snap, reading) if reading is not None else ()
    return float(sum(s.steps for s in found)) if found else None


def _core_key(e: EngineReading, c: CoreCounts | EngineSteps) -> tuple[int, int | None]:
    """Return the key of one engine core: its pid and DP rank (SGLang: the DP rank, shared by its TP schedulers)."""
    return (0 if e.kind == "sglang" else c.pid, c.dp_rank)


def _total(values: Sequence[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return float(sum(got)) if got else None


def served_counts(
    e: EngineReading, steps: Sequence[EngineSteps], before: EngineReading | None, alive: set[int]
) -> EngineReading:
    """Return an engine reading with running / waiting from its agent where one reports them, else the page's.

    Each engine core's newest counts are held (from `before`) while its agent lives; a core whose
    steps arrive without counts, or whose agent went stale or stopped, drops out. Without any
    core left the page serves the counts, and a page carried from an earlier read serves none.
    """
    held: dict[tuple[int, int | None], CoreCounts] = {}
    if before is not None and before.counts_source == "agent":
        held = {_core_key(e, c): c for c in before.core_counts if c.pid in alive}
    for st in steps:
        key = _core_key(e, st)
        if st.running is None and st.waiting is None:
            if st.steps > 0:  # the core steps but its counts are no longer read
                held.pop(key, None)
            continue
        limit = st.max_num_seqs or (held[key].max_num_seqs if key in held else None)
        held[key] = CoreCounts(st.pid, st.dp_rank, st.running, st.waiting, limit)
    if held:
        cores = tuple(sorted(held.values(), key=lambda c: (c.pid, -1 if c.dp_rank is None else c.dp_rank)))
        return dataclasses.replace(
            e,
            counts_source="agent",
            core_counts=cores,
            running=_total([c.running for c in cores]),
            waiting=_total([c.waiting for c in cores]),
        )
    if not e.page_read:
        return dataclasses.replace(e, running=None, waiting=None)
    return e


def serve_counts(snap: Snapshot, prev: Snapshot | None = None) -> Snapshot:
    """Return the Snapshot with each engine's running / waiting served by its agent or its page (served_counts)."""
    if not snap.engines:
        return snap
    alive = {a.pid for a in snap.agent.agents if a.state not in GONE} if snap.agent is not None else set()
    engines = tuple(
        e if e.error else served_counts(e, _counted(snap, e), _previous(prev, e.name), alive)
        for e in snap.engines
    )
    return dataclasses.replace(snap, engines=engines)


def accumulate(snap: Snapshot, cfg: Config, prev: Snapshot | None = None) -> Totals:
    """Return this tick's running/waiting request-seconds, engine steps and API-server saturated seconds.

    Served by the agent: the request-seconds its steps integrated. Served by the page: the value
    read at the previous tick held over this one; nothing across a change of source.
    """
    running, waiting, steps = Tally[str](), Tally[str](), Tally[EngineMethod]()
    saturated_s = Tally[EngineServer]()
    for reading in snap.engines:
        before = _previous(prev, reading.name)
        if reading.counts_source == "agent" and not reading.error:
            counted = _counted(snap, reading)
            running.count(reading.name, sum(st.running_seconds for st in counted))
            waiting.count(reading.name, sum(st.waiting_seconds for st in counted))
        elif before is not None and before.counts_source == "page" and snap.dt > 0:
            if before.running is not None:
                running.count(reading.name, before.running * snap.dt)
            if before.waiting is not None:
                waiting.count(reading.name, before.waiting * snap.dt)
        if not reading.error:
            for method, n in step_increments(before, reading, _agent_steps(snap, reading.name)).items():
                steps.count(EngineMethod(reading.name, method), n)
        for server, proc in reading.servers():
            saturated = (demand(proc) or 0.0) >= cfg.engine.api_server_saturated
            saturated_s.count(EngineServer(reading.name, server), snap.dt if saturated else 0.0)
    return Totals(
        engine=EngineTotals(
            running_request_seconds=running,
            waiting_request_seconds=waiting,
            steps=steps,
            api_server_saturated_seconds=saturated_s,
        )
    )
