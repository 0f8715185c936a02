"""De-duplicate what several vLLM API servers report: pid-labelled gauges and engine steps.

vLLM's `iteration_tokens_total` gains one observation per engine step for every API server that
had output in that step; a step without output (a partial prefill, a step whose requests all
belong to other servers) adds nothing anywhere. So for S_o steps with output out of S engine
steps, and per tick Δc_i the count delta of API server i, ΔC = Σ Δc_i, N servers:

* each step with output adds 1 to at least one c_i and to at most N of them, so
  S >= S_o >= max_i Δc_i and S_o >= ceil(ΔC / N) (steps are whole), S_o <= ΔC;
* with one API server ΔC = S_o, still only a lower bound of S.

A page therefore bounds engine steps from below only (method lower_bound); ΔC, with several
servers, is an upper bound of the steps with output (method upper_bound), not of all steps.
Summing the per-tick lower bounds gives a lower bound of the total that is tighter than the
same bound taken once over the whole run. An exact count only comes from inside the engine
(the agent's EngineSteps), which wins when present.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence

from exporter.snapshot.engine import EngineReading, StepCount

Series = tuple[Mapping[str, str], float]

# Where an API-server count may come from to bound steps below by ΔC / N. The number of pid
# series of vLLM <= 0.11.0 kv_cache_usage_perc only counts servers that ever received scheduler
# stats, so it can be short of N, and ΔC / (too small an N) would overshoot the truth.
COUNT_SOURCES_FOR_BOUNDS = frozenset({"processes", "cmdline", "multiproc_files", "page"})


def _servers(reading: EngineReading) -> int | None:
    """Return the API-server count when it is sound enough to bound steps with."""
    if reading.api_server_count_source in COUNT_SOURCES_FOR_BOUNDS:
        return reading.api_server_count
    return None


def collapse_pid_series(
    series: Iterable[Series], how: str = "max"
) -> tuple[list[tuple[dict[str, str], float]], int]:
    """Drop the `pid` label, combining series that differ only in it; return them and the most pids per group.

    vLLM up to 0.11.0 exposes `kv_cache_usage_perc` once per API-server pid (multiprocess mode
    'all'; 'mostrecent' from 0.11.2); only the series written last is current and the others keep a stale value, and the
    files carry no timestamp for this mode, so "max" is the best figure (flag it approximate).
    """
    groups: dict[tuple[tuple[str, str], ...], list[float]] = {}
    for labels, value in series:
        key = tuple(sorted((k, v) for k, v in labels.items() if k != "pid"))
        groups.setdefault(key, []).append(value)
    combines: dict[str, Callable[[list[float]], float]] = {"max": max, "sum": sum, "min": min}
    combine = combines[how]
    out = [(dict(key), float(combine(values))) for key, values in groups.items()]
    pids = max((len(v) for v in groups.values()), default=0)
    return out, pids


def _whole_lower(count: float, n: int | None, busiest: float | None) -> float | None:
    """Return the whole-number lower bound of steps with output: max(busiest server, ceil(count / N))."""
    bounds = [] if busiest is None else [busiest]
    if n:
        bounds.append(float(math.ceil(count / n - 1e-9)))
    return float(math.floor(min(max(bounds), count) + 1e-9)) if bounds else None


def step_count(reading: EngineReading) -> StepCount | None:
    """Return the cumulative step figure a reading supports, with how it was derived.

    vLLM: method "output_steps"; `lower` bounds the engine's steps from below (None when neither
    the API-server count nor per-server counts are known), `upper` bounds the steps with output
    from above and is given only with several servers, so a page never claims lower == upper.
    `total` is the lower bound, else the raw count.
    """
    if reading.kind == "sglang":
        if reading.dp_attention_steps_total is not None:
            return StepCount("dp_attention_steps", reading.dp_attention_steps_total)
        return (
            StepCount("forward_passes", reading.forward_passes)
            if reading.forward_passes is not None
            else None
        )
    count = reading.iteration_count
    if count is None:
        return None
    n = _servers(reading)
    busiest = max((c for _, c in reading.iteration_count_by_pid), default=None)
    lower = _whole_lower(count, n, busiest)
    one_server = n == 1 and len(reading.iteration_count_by_pid) <= 1
    upper = None if one_server else count
    return StepCount("output_steps", count if lower is None else lower, lower=lower, upper=upper)


def counter_delta(prev: float | None, cur: float | None) -> float | None:
    """Return a counter's increase between two readings (a reset counts from zero)."""
    if prev is None or cur is None:
        return None
    return cur - prev if cur >= prev else cur


def step_increments(
    prev: EngineReading | None, cur: EngineReading, agent_steps: float | None = None
) -> dict[str, float]:
    """Return this tick's engine steps by method label (see STEP_METHODS)."""
    if agent_steps is not None:
        return {"agent": float(agent_steps)}
    if prev is None:
        return {}
    if cur.kind == "sglang":
        if cur.dp_attention_steps_total is not None:
            d = counter_delta(prev.dp_attention_steps_total, cur.dp_attention_steps_total)
            return {} if d is None else {"dp_attention_steps": d}
        d = counter_delta(prev.forward_passes, cur.forward_passes)
        return {} if d is None else {"forward_passes": d}
    total = counter_delta(prev.iteration_count, cur.iteration_count)
    if total is None:
        return {}
    n = _servers(cur)
    per_pid = _per_pid_deltas(prev.iteration_count_by_pid, cur.iteration_count_by_pid)
    if n == 1 and len(per_pid) <= 1:
        return {"lower_bound": total}  # steps with output: a lower bound of the engine's steps
    lower = _whole_lower(total, n, max(per_pid) if per_pid else None)
    if lower is None:
        return {"upper_bound": total}  # N unknown and no per-pid files: only the output-step bound holds
    return {"lower_bound": lower, "upper_bound": total}


def _per_pid_deltas(prev: Sequence[tuple[int, float]], cur: Sequence[tuple[int, float]]) -> list[float]:
    """Return each API server's count delta (a pid new since the last tick counts from zero)."""
    if not prev:
        return []  # no per-pid figures last tick (first read, or read over HTTP)
    before = dict(prev)
    out = []
    for pid, count in cur:
        d = counter_delta(before.get(pid, 0.0), count)
        if d is not None:
            out.append(d)
    return out
