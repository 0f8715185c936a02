"""De-duplicate what several vLLM API servers report: pid-labelled gauges and engine steps.

With N API servers, vLLM's `iteration_tokens_total` gains one observation per step for every
API server that had output in that step, so its `_count` lies in [S, N x S] for S steps
(research/vllm-metrics.md §2.3). Per tick, with Δc_i the count delta of API server i and
ΔC = Σ Δc_i:

* each step with output adds 1 to at least one c_i and to at most N of them, so
  S >= max_i Δc_i, S >= ΔC / N, S <= ΔC;
* with one API server ΔC = S exactly (for steps that emitted output).

Summing the per-tick lower bounds gives a lower bound of the total that is tighter than the
same bound taken once over the whole run. An exact count only comes from inside the engine
(the agent's EngineSteps), which wins when present.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from exporter.snapshot.engine import EngineReading, StepCount

Series = tuple[Mapping[str, str], float]

# Where an API-server count may come from to bound steps below by ΔC / N. The number of pid
# series of vLLM 0.10-0.11 kv_cache_usage_perc only counts servers that ever received scheduler
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

    vLLM 0.10-0.11 exposes `kv_cache_usage_perc` once per API-server pid (multiprocess mode
    'all'); only the series written last is current and the others keep a stale value, and the
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


def step_count(reading: EngineReading) -> StepCount | None:
    """Return the cumulative step figure a reading supports, with how it was derived.

    With several API servers `total` is the lower bound when there is one (the busiest server's
    count, or count / N): it is exact whenever some API server had output in every step, which
    holds on a busy engine, where every server has requests decoding. Without a lower bound it is
    the upper bound, the raw count, which can be up to N times the truth.
    """
    if reading.kind == "sglang":
        return (
            StepCount("forward_passes", reading.forward_passes)
            if reading.forward_passes is not None
            else None
        )
    count = reading.iteration_count
    if count is None:
        return None
    n = _servers(reading)
    if n == 1 and not reading.iteration_count_by_pid[1:]:
        return StepCount("iteration_count", count, lower=count, upper=count)
    lower: float | None = max((c for _, c in reading.iteration_count_by_pid), default=None)
    if n:
        lower = max(lower or 0.0, count / n)
    return StepCount("bounds", count if lower is None else min(lower, count), lower=lower, upper=count)


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
        d = counter_delta(prev.forward_passes, cur.forward_passes)
        return {} if d is None else {"forward_passes": d}
    total = counter_delta(prev.iteration_count, cur.iteration_count)
    if total is None:
        return {}
    n = _servers(cur)
    per_pid = _per_pid_deltas(prev.iteration_count_by_pid, cur.iteration_count_by_pid)
    if n == 1 and len(per_pid) <= 1:
        return {"iteration_count": total}
    lower = max(per_pid, default=0.0)
    if n:
        lower = max(lower, total / n)
    elif not per_pid:
        return {"upper_bound": total}  # N unknown and no per-pid files: only the upper bound holds
    return {"lower_bound": min(lower, total), "upper_bound": total}


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
