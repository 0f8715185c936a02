"""The lab's truth per daemon tick (pure): GPU busy and the scheduler's counts from the engine's bins, API main-thread CPU.

Engine bins (engine.py `Truth`, one JSON line per `bin` seconds of wall time): `busy` = GPU
seconds in the bin (CUDA events per step; for eager steps the captured graph's GPU time of the
same work), `busy_span` = event spans (with launch gaps), `running` / `waiting` = requests x
seconds. API samples: (unix time, {pid: (cores of the main thread, its demand: CPU plus
run-queue wait, in cores)} over the sample).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

ApiSample = tuple[float, dict[int, tuple[float, float]]]


def read_bins(path: Path) -> list[dict[str, float]]:
    """Return the engine's truth bins (none if the file is missing); bad lines are skipped."""
    out = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("t"), int | float):
            out.append(row)
    return sorted(out, key=lambda r: r["t"])


def tick_truth(
    at: float, dt: float, bins: Sequence[dict[str, float]], bin_s: float, api: Sequence[ApiSample]
) -> dict[str, Any]:
    """Return the truth over the tick [at - dt, at): busy share, mean running / waiting, API main-thread cores."""
    t0 = at - dt
    got: dict[str, float] = {"busy": 0.0, "busy_span": 0.0, "running": 0.0, "waiting": 0.0}
    covered = 0.0
    for b in bins:
        lo, hi = b["t"], b["t"] + bin_s
        overlap = min(hi, at) - max(lo, t0)
        if overlap <= 0:
            continue
        frac = overlap / bin_s
        covered += overlap
        for k in got:
            got[k] += float(b.get(k, 0.0)) * frac
    out: dict[str, Any] = {k: (v / dt if dt > 0 else None) for k, v in got.items()}
    per_pid: dict[int, list[tuple[float, float]]] = {}
    for t, row in api:
        if t0 < t <= at:
            for pid, cores in row.items():
                per_pid.setdefault(pid, []).append(cores)
    means = sorted(
        ((statistics.fmean(c for c, _ in v), statistics.fmean(d for _, d in v)) for v in per_pid.values()),
        reverse=True,
    )
    out["api_main"] = [c for c, _ in means]
    out["api_main_demand"] = [d for _, d in means]
    out["covered"] = covered / dt if dt > 0 else 0.0
    return out


def summarise(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Return the medians of the per-tick truth over a scenario's scored ticks."""
    rows = list(rows)

    def med(key: str) -> float | None:
        vals = [r[key] for r in rows if r.get(key) is not None]
        return round(statistics.median(vals), 3) if vals else None

    servers = max((len(r["api_main"]) for r in rows), default=0)
    api, demand = [], []
    for i in range(servers):
        vals = [r["api_main"][i] for r in rows if len(r["api_main"]) > i]
        api.append(round(statistics.median(vals), 2))
        vals = [r["api_main_demand"][i] for r in rows if len(r.get("api_main_demand", ())) > i]
        demand.append(round(statistics.median(vals), 2) if vals else None)
    return {
        "busy": med("busy"),
        "busy_span": med("busy_span"),
        "running": med("running"),
        "waiting": med("waiting"),
        "running_mean": round(statistics.fmean(r["running"] for r in rows), 3) if rows else None,
        "api_main_cores": api,
        "api_main_demand": demand,
        "ticks": len(rows),
    }


def describe(s: dict[str, Any]) -> str:
    """Return the truth in the issue's table form: busy, running / waiting, API main thread."""
    if s.get("busy") is None:
        return "-"
    api = s.get("api_main_cores") or []
    if api and max(api) - min(api) < 0.1 and len(api) > 1:
        api_text = f"{statistics.fmean(api):.2f} x{len(api)}"
    else:
        api_text = " / ".join(f"{a:.2f}" for a in api) or "-"
    return f"{s['busy']:.2f}, {s['running']:.1f} / {s['waiting']:.1f}, {api_text}"


def main_thread_ns(proc_root: str, pid: int) -> tuple[int, int] | None:
    """Return (CPU ns, run-queue wait ns) of a process's main thread from schedstat (None when it is gone)."""
    try:
        fields = Path(proc_root, str(pid), "task", str(pid), "schedstat").read_text().split()
        return int(fields[0]), int(fields[1])
    except (OSError, IndexError, ValueError):
        return None
