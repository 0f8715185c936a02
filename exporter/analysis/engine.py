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

What each read of an engine's page lost (values refused, budgets hit, labels cut, bytes that
did not decode) is added to boundwatch_engine_page_refused_total by reason, every reason of
every engine from its first reading on, failed reads included. A tick that reused the engine
source's last reading (the read outlasted the tick) adds nothing: that read was counted.

vLLM's pages give speculative decoding as counters (draft and accepted tokens); their ratio over
the last SPEC_WINDOW_SECONDS of the Snapshots' history is its acceptance (`with_acceptance`), so
a replay recomputes it. SGLang gives its own ratio, kept as read.
"""

from __future__ import annotations

from collections.abc import Sequence

from exporter.analysis.dedup import counter_delta, step_increments
from exporter.analysis.verdict import once, owned_steps
from exporter.config import Config
from exporter.snapshot import Snapshot
from exporter.snapshot.agent import EngineSteps
from exporter.snapshot.engine import PAGE_REFUSED_REASONS, CoreCounts, EngineReading, demand
from exporter.snapshot.frozen import replace
from exporter.snapshot.totals import EngineMethod, EngineReason, EngineServer, EngineTotals, Tally, Totals

SPEC_WINDOW_SECONDS = 10.0  # the spec-decode acceptance window over vLLM's counters

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


def _spec_row(snap: Snapshot, name: str) -> tuple[float, float | None, float | None] | None:
    """Return (tick time, accepted, drafted) of an engine whose page was read this tick, else None.

    A carried page (not read this tick) and a reading the Sampler reused (the read outlasted the
    tick) are no new reading of the counters.
    """
    status = snap.source("engine")
    if status is not None and status.late:
        return None
    e = next((x for x in snap.engines if x.name == name), None)
    if e is None or e.error or not e.page_read or e.spec_draft_tokens_total is None:
        return None
    return (snap.mono, e.spec_accepted_tokens_total, e.spec_draft_tokens_total)


def acceptance_over(history: Sequence[Snapshot], snap: Snapshot, name: str) -> float | None:
    """Return an engine's acceptance from the newest reading at least SPEC_WINDOW_SECONDS old to this tick's."""
    now = _spec_row(snap, name)
    if now is None:
        return None
    rows = [now]
    for past in reversed(history):
        row = _spec_row(past, name)
        if row is not None:
            rows.append(row)
            if now[0] - row[0] >= SPEC_WINDOW_SECONDS:
                break
    return window_acceptance(rows[::-1])


def with_acceptance(history: Sequence[Snapshot], snap: Snapshot) -> Snapshot:
    """Fill each vLLM engine's spec-decode acceptance over the window; one not read this tick keeps the last."""
    engines, changed = [], False
    for e in snap.engines:
        if e.error or e.spec_draft_tokens_total is None:  # SGLang's own ratio, or no speculation
            engines.append(e)
            continue
        if _spec_row(snap, e.name) is not None:
            value = acceptance_over(history, snap, e.name)
        else:
            last = _previous(history[-1] if history else None, e.name)
            value = last.spec_acceptance if last is not None else None
        if value != e.spec_acceptance:
            e, changed = replace(e, spec_acceptance=value), True
        engines.append(e)
    return replace(snap, engines=tuple(engines)) if changed else snap


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
        return replace(
            e,
            counts_source="agent",
            core_counts=cores,
            running=_total([c.running for c in cores]),
            waiting=_total([c.waiting for c in cores]),
        )
    if not e.page_read:
        return replace(e, running=None, waiting=None)
    return e


def serve_counts(
    snap: Snapshot, prev: Snapshot | None = None, only: frozenset[str] | None = None
) -> Snapshot:
    """Return the Snapshot with each engine's running / waiting served by its agent or its page (served_counts).

    `only`: the engines to serve (a replay serves those whose page it normalised again), else all.
    """
    if not snap.engines:
        return snap
    alive = {a.pid for a in snap.agent.agents if a.state not in GONE} if snap.agent is not None else set()
    engines = tuple(
        e
        if e.error or (only is not None and e.name not in only)
        else served_counts(e, _counted(snap, e), _previous(prev, e.name), alive)
        for e in snap.engines
    )
    return replace(snap, engines=engines)


def accumulate(snap: Snapshot, cfg: Config, prev: Snapshot | None = None) -> Totals:
    """Return this tick's running/waiting request-seconds, engine steps, saturated seconds and page losses.

    Served by the agent: the request-seconds its steps integrated. Served by the page: the value
    read at the previous tick held over this one; nothing across a change of source.
    """
    running, waiting, steps = Tally[str](), Tally[str](), Tally[EngineMethod]()
    saturated_s, refused = Tally[EngineServer](), Tally[EngineReason]()
    reused = any(s.name == "engine" and s.late for s in snap.sources)
    for reading in snap.engines:
        before = _previous(prev, reading.name)
        # a reused late read, or a page carried from an earlier read, was counted when it was read
        lost = {} if reused or not reading.page_read else dict(reading.page_refused)
        for reason in PAGE_REFUSED_REASONS:  # every reason's series from the start, 0 until one is lost
            refused.count(EngineReason(reading.name, reason), lost.get(reason, 0))
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
            page_refused=refused,
        )
    )
