"""Pool runs of bench/light_agent_periods.py: one workload's cost as runs, not as pairs.

Runs of one agent on one kind of machine differ by more than their own standard errors (H100,
decode b=1: -0.11% to +0.26% wall, each +- 0.005-0.09%), so the pairs of all runs are not one
sample: each run's mean is one observation, and the pooled figure is the mean of the runs with
its standard error (the spread between runs). The inverse-variance mean (what pooling pairs
would give) is printed beside it for comparison only: it trusts each run's own error, which the
spread between runs says is too small.

    python3 bench/pool_periods.py bench/results/light_periods_h100_session3[3-6]*.json \
        [--workload decode_b1] [--min-pairs 30] [--goal 0.1] [--out pooled.json]

A run with fewer pairs than --min-pairs (a pause probe's two pairs, a call cut short) is listed
and left out of the pool.

`--strata 26,40` splits the pairs by how slow the host was while they ran: by the mean of their two
periods' GPU idle a step (`idle_us`, from the stamps), in microseconds, at the edges given. The
lent H100's host spends 16-76 us of GPU idle between decode steps, in stretches of its own; the
pair's mean (unlike either period alone) is uncorrelated with the on-off difference under
symmetric noise, so each stratum's cost is read without a bias from the split. Pairs of all the
runs are pooled within a stratum (one figure each, its standard error over pairs).
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import statistics
import sys
from typing import Any


def runs_in(path: str, workload: str) -> list[dict[str, Any]]:
    """Return the runs of one workload in a light_agent_periods.py results file (as written)."""
    with open(path) as f:
        data = json.load(f)
    runs = data.get("runs", []) if isinstance(data, dict) else []
    return [r for r in runs if isinstance(r, dict) and r.get("workload") == workload]


def runs_of(path: str, workload: str) -> list[dict[str, Any]]:
    """Return the rows of one results file for a workload: file, pairs, mean and se of the wall cost (%)."""
    out = []
    for run in runs_in(path, workload):
        wall = (run.get("cost") or {}).get("wall_pct") or {}
        mean, se = wall.get("mean"), wall.get("se")
        if not isinstance(mean, int | float):
            continue
        out.append(
            {
                "file": os.path.basename(path),
                "pairs": len(run.get("pairs") or []),
                "mean_pct": float(mean),
                "se_pct": float(se) if isinstance(se, int | float) else None,
            }
        )
    return out


def pool(rows: list[dict[str, Any]], goal: float | None = None) -> dict[str, Any]:
    """Return the runs' mean, its standard error and median, and the inverse-variance mean beside them."""
    means = [r["mean_pct"] for r in rows]
    out: dict[str, Any] = {"runs": len(means)}
    if not means:
        return out
    out["mean_pct"] = statistics.fmean(means)
    out["median_pct"] = statistics.median(means)
    out["se_pct"] = statistics.stdev(means) / math.sqrt(len(means)) if len(means) > 1 else None
    weighted = [(m, r["se_pct"]) for m, r in zip(means, rows, strict=True) if r["se_pct"]]
    if weighted:
        w = [1 / se**2 for _, se in weighted]
        out["inverse_variance_mean_pct"] = sum(m * k for (m, _), k in zip(weighted, w, strict=True)) / sum(w)
        out["inverse_variance_se_pct"] = 1 / math.sqrt(sum(w))
    if goal is not None:
        out["goal_pct"] = goal
        out["runs_under_goal"] = sum(m <= goal for m in means)
        out["mean_under_goal"] = out["mean_pct"] <= goal
    return out


def strata(paths: list[str], workload: str, edges: list[float], min_pairs: int = 0) -> list[dict[str, Any]]:
    """Return, per stratum of the pairs' mean GPU idle a step (us), the cost on over off and the idle added.

    Runs with fewer than min_pairs pairs are left out, as from the pool.
    """
    cuts = sorted(edges)
    bounds = [-math.inf, *cuts, math.inf]
    got: list[list[tuple[float, float]]] = [[] for _ in bounds[1:]]
    for path in paths:
        for run in runs_in(path, workload):
            pairs = run.get("pairs") or []
            if len(pairs) < min_pairs:
                continue
            for p in pairs:
                on, off = (p.get("on"), p.get("off")) if isinstance(p, dict) else (None, None)
                if not (
                    isinstance(on, dict) and isinstance(off, dict) and "idle_us" in on and "idle_us" in off
                ):
                    continue
                level = (on["idle_us"] + off["idle_us"]) / 2
                i = bisect.bisect_right(cuts, level)  # the stratum [bounds[i], bounds[i + 1])
                cost = 100.0 * (on["wall_us"] - off["wall_us"]) / off["wall_us"]
                got[i].append((cost, on["idle_us"] - off["idle_us"]))
    out = []
    for k, xs in enumerate(got):
        costs, added = [c for c, _ in xs], [a for _, a in xs]
        out.append(
            {
                "idle_us_from": None if k == 0 else bounds[k],
                "idle_us_to": None if k == len(got) - 1 else bounds[k + 1],
                "pairs": len(xs),
                "mean_pct": statistics.fmean(costs) if costs else None,
                "se_pct": statistics.stdev(costs) / math.sqrt(len(costs)) if len(costs) > 1 else None,
                "median_pct": statistics.median(costs) if costs else None,
                "idle_added_us_mean": statistics.fmean(added) if added else None,
                "idle_added_us_median": statistics.median(added) if added else None,
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="light_agent_periods.py results (JSON)")
    ap.add_argument("--workload", default="decode_b1")
    ap.add_argument("--min-pairs", type=int, default=30, help="runs with fewer pairs are left out")
    ap.add_argument(
        "--goal", type=float, default=None, help="a cost goal in %% of wall time, to count runs against"
    )
    ap.add_argument(
        "--strata",
        default="",
        help="split the pairs by the host's GPU idle a step (us, the mean of their two periods) at these edges,"
        " comma-separated (e.g. 26,40)",
    )
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    try:
        edges = [float(e) for e in args.strata.split(",") if e.strip()]
    except ValueError:
        ap.error(f"--strata takes numbers (us), comma-separated, got {args.strata!r}")
    rows, left = [], []
    for path in args.files:
        for row in runs_of(path, args.workload):
            (rows if row["pairs"] >= args.min_pairs else left).append(row)
    if not rows:
        print(f"no run of {args.workload} with {args.min_pairs} pairs or more", file=sys.stderr)
        return 1
    for row in rows:
        se = f" +- {row['se_pct']:.3f}" if row["se_pct"] is not None else ""
        print(f"{row['file']}: {row['pairs']} pairs, {row['mean_pct']:+.3f}{se}% wall")
    for row in left:
        print(f"{row['file']}: {row['pairs']} pairs, left out (under {args.min_pairs})")
    pooled = pool(rows, args.goal)
    se = f" +- {pooled['se_pct']:.3f}" if pooled.get("se_pct") is not None else ""
    print(
        f"{args.workload}, {pooled['runs']} runs as runs: {pooled['mean_pct']:+.3f}{se}% wall "
        f"(median {pooled['median_pct']:+.3f}%)"
    )
    if "inverse_variance_mean_pct" in pooled:
        print(
            f"  (inverse-variance, for comparison only: {pooled['inverse_variance_mean_pct']:+.3f} "
            f"+- {pooled['inverse_variance_se_pct']:.3f}%)"
        )
    result = {"workload": args.workload, "runs": rows, "left_out": left, "pooled": pooled}
    if edges:
        result["strata"] = strata(args.files, args.workload, edges, args.min_pairs)
        print("by the host's GPU idle a step (the mean of each pair's two periods):")
        for st in result["strata"]:
            if not st["pairs"]:
                continue
            lo = "" if st["idle_us_from"] is None else f"{st['idle_us_from']:g}"
            hi = "" if st["idle_us_to"] is None else f"{st['idle_us_to']:g}"
            se = f" +- {st['se_pct']:.3f}" if st["se_pct"] is not None else ""
            print(
                f"  {lo}-{hi} us: {st['pairs']} pairs, {st['mean_pct']:+.3f}{se}% wall (median "
                f"{st['median_pct']:+.3f}%), idle added {st['idle_added_us_median']:+.2f} us a step (median)"
            )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
