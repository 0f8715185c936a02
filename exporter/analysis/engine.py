"""Integrate the engines' scheduler state and API-server saturation over ticks; count engine steps.

Running and waiting requests are integrated by the left (zero-order hold) rule: the value read
at the previous tick is held until this tick, so each tick adds `prev.running * snap.dt`. A
gauge is a step function that changes between reads, and the value read is the one in force
from then on; the trapezoid rule would invent a linear ramp that never happened. The last value
read is integrated on the next tick, and an interval whose start was not read adds nothing.

API-server saturation uses this tick's reading, since its CPU figure already covers the tick
that just ended: a server is saturated while its busiest thread's demand (time running plus
time waiting to run, from schedstat; its CPU where schedstat is missing) reaches
`engine.api_server_saturated` of a core. Demand, not CPU: a thread that a crowded host or a CPU
quota lets run 60% of the time still wanted the whole core.

What each read of an engine's page lost (values refused, budgets hit, labels cut, bytes that
did not decode) is added to boundwatch_engine_page_refused_total by reason, every reason of
every engine from its first reading on, failed reads included. A tick that reused the engine
source's last reading (the read outlasted the tick) adds nothing: that read was counted.
"""

from __future__ import annotations

from collections.abc import Sequence

from exporter.analysis.dedup import counter_delta, step_increments
from exporter.analysis.increments import Increments
from exporter.analysis.verdict import once, owned_steps
from exporter.config import Config
from exporter.snapshot import Snapshot
from exporter.snapshot.engine import PAGE_REFUSED_REASONS, EngineReading, demand

RUNNING = "boundwatch_engine_running_request_seconds_total"
WAITING = "boundwatch_engine_waiting_request_seconds_total"
STEPS = "boundwatch_engine_steps_total"
SATURATED = "boundwatch_api_server_saturated_seconds_total"
PAGE_REFUSED = "boundwatch_engine_page_refused_total"


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


def _agent_steps(snap: Snapshot, name: str) -> float | None:
    """Return the agent's steps for an engine: those joined to it (by pid, name, or the only engine of its kind)."""
    reading = next((e for e in snap.engines if e.name == name), None)
    found = once(reading, owned_steps(snap).get(name, ())) if reading is not None else ()
    return float(sum(s.steps for s in found)) if found else None


def accumulate(snap: Snapshot, cfg: Config, prev: Snapshot | None = None) -> Increments:
    """Return this tick's running/waiting request-seconds, engine steps, saturated seconds and page losses."""
    inc = Increments()
    reused = any(s.name == "engine" and s.late for s in snap.sources)
    for reading in snap.engines:
        before = _previous(prev, reading.name)
        labels = (reading.name,)
        lost = {} if reused else dict(reading.page_refused)
        for reason in PAGE_REFUSED_REASONS:  # every reason's series from the start, 0 until one is lost
            inc.count(PAGE_REFUSED, (reading.name, reason), lost.get(reason, 0))
        if before is not None and snap.dt > 0:
            if before.running is not None:
                inc.count(RUNNING, labels, before.running * snap.dt)
            if before.waiting is not None:
                inc.count(WAITING, labels, before.waiting * snap.dt)
        if not reading.error:
            for method, steps in step_increments(before, reading, _agent_steps(snap, reading.name)).items():
                inc.count(STEPS, (reading.name, method), steps)
        for server, proc in reading.servers():
            saturated = (demand(proc) or 0.0) >= cfg.engine.api_server_saturated
            inc.count(SATURATED, (reading.name, server), snap.dt if saturated else 0.0)
    return inc
