"""Where a tick's CPU goes, per thread and per part, from the files `BW_COST_STATS` makes the daemon write.

`BW_COST_STATS=PATH python3 bench/sidecar_cost.py --gpus 8 --scrapes 0 [--ab DIR]` makes each
daemon write, every 5 s, its threads' utime + stime, the cycle collector's time and the CPU of its
synchronous parts (`time_parts` there) to PATH.<gpus> (the `--ab` tree's daemon to PATH.a.<gpus>).
This prints their steady state side by side: ms of CPU per 0.5 s tick between the first row at
least `--skip` seconds after the daemon started and the last one, and the ratio of the second file
to the first when there are two.

    python3 bench/cost_stats.py /tmp/st.a.8 /tmp/st.8
"""

from __future__ import annotations

import argparse
import json
from typing import Any

TICK = 0.5


def steady(rows: list[dict[str, Any]], skip: float) -> dict[str, dict[str, float]]:
    """Return ms of CPU per tick by group (threads, parts, gc) between the row after `skip` s and the last."""
    if len(rows) < 2:
        raise ValueError("fewer than two rows: the daemon ran under 10 s")
    first = next((r for r in rows if r["t"] - rows[0]["t"] >= skip), rows[0])
    last = rows[-1]
    ticks = (last["t"] - first["t"]) / TICK
    if ticks <= 0:
        raise ValueError(f"no rows after {skip} s")
    out: dict[str, dict[str, float]] = {}
    for group in ("threads", "parts", "gc"):
        keys = [k for k in last[group] if group != "gc" or k.endswith("_seconds")]
        out[group] = {k: (last[group][k] - first[group].get(k, 0.0)) / ticks * 1e3 for k in keys}
    out["threads"]["whole process"] = sum(out["threads"].values())
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", help="BW_COST_STATS files (one or two: before, after)")
    ap.add_argument("--skip", type=float, default=15.0, help="seconds of start-up left out")
    args = ap.parse_args()
    stats = []
    for path in args.files:
        with open(path) as f:
            stats.append(steady(json.load(f), args.skip))
    print("ms of CPU per tick | " + " | ".join(args.files) + (" | ratio" if len(stats) == 2 else ""))
    for group in ("threads", "parts", "gc"):
        names = sorted({k for s in stats for k in s[group]})
        for name in names:
            values = [s[group].get(name, 0.0) for s in stats]
            line = f"{group}: {name} | " + " | ".join(f"{v:.3f}" for v in values)
            if len(values) == 2:
                line += f" | {values[1] / values[0]:.2f}" if values[0] else " | -"
            print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
