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
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from typing import Any


def runs_of(path: str, workload: str) -> list[dict[str, Any]]:
    """Return the rows of one results file for a workload: file, pairs, mean and se of the wall cost (%)."""
    with open(path) as f:
        data = json.load(f)
    out = []
    for run in data.get("runs", []) if isinstance(data, dict) else []:
        if not isinstance(run, dict) or run.get("workload") != workload:
            continue
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="light_agent_periods.py results (JSON)")
    ap.add_argument("--workload", default="decode_b1")
    ap.add_argument("--min-pairs", type=int, default=30, help="runs with fewer pairs are left out")
    ap.add_argument(
        "--goal", type=float, default=None, help="a cost goal in %% of wall time, to count runs against"
    )
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
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
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {"workload": args.workload, "runs": rows, "left_out": left, "pooled": pooled}, f, indent=1
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
