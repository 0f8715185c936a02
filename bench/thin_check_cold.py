"""What each part of the light agent's thin check costs a call with the caches emptied, on this CPU.

The switch's out-of-slice check (exporter.agent.switch, `thin_self`) is one frame around the engine's
own method plus `due[0] and clock() >= due[0]`. Warm it costs tens of nanoseconds; on a GPU step's
path the H200 measured ~1.2-1.7 us (bench/README.md, session 18). This times one call of a small
Python method alone, right after `--cold-mib` MiB were written (the data caches emptied, roughly as a
GPU step leaves them), through each variant in turn:

- `bare`: the method itself;
- `frame`: a pass-through frame of `self` alone;
- `clock`: the frame and one `time.monotonic_ns()`;
- `due`: the frame and one read of a list item (`due[0]`);
- `check`: the frame and the switch's whole check (`due[0] and clock() >= due[0] and drive()`).

Variants alternate in order over `--rounds`; each figure is the median over rounds of the median of
`--n` calls, in ns, and its excess over `bare`.

    python3 bench/thin_check_cold.py --rounds 8 --out bench/results/thin_check_cold_py311.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any


class Core:
    def __init__(self) -> None:
        self.x = 1

    def step(self) -> int:
        return self.x


def variants() -> dict[str, Any]:
    own = Core.step
    due = [10**30]
    clock = time.monotonic_ns

    def drive() -> bool:
        return False

    def frame(self: Core) -> Any:
        return own(self)

    def with_clock(self: Core) -> Any:
        if clock() < 0:
            return None
        return own(self)

    def with_due(self: Core) -> Any:
        if due[0] < 0:
            return None
        return own(self)

    def check(self: Core) -> Any:
        if due[0] and clock() >= due[0] and drive():
            return None
        return own(self)

    return {"bare": own, "frame": frame, "clock": with_clock, "due": with_due, "check": check}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--n", type=int, default=600, help="calls timed a variant a round")
    ap.add_argument("--cold-mib", type=int, default=16, help="MiB written before each call")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    fns = variants()
    own = Core.step
    buf, zeros = bytearray(args.cold_mib << 20), bytes(args.cold_mib << 20)
    core, clock = Core(), time.perf_counter_ns
    res: dict[str, list[float]] = {k: [] for k in fns}
    try:
        for r in range(args.rounds):
            for name, fn in fns.items() if r % 2 == 0 else reversed(list(fns.items())):
                Core.step = fn  # type: ignore[method-assign]
                times = []
                for _ in range(args.n):
                    buf[:] = zeros
                    t0 = clock()
                    core.step()
                    times.append(clock() - t0)
                res[name].append(statistics.median(times))
    finally:
        Core.step = own  # type: ignore[method-assign]
    base = statistics.median(res["bare"])
    out = {k: {"ns": statistics.median(v), "over_bare": statistics.median(v) - base} for k, v in res.items()}
    version = sys.version.split()[0]
    print(version, "  ".join(f"{k} {v['ns']:.0f} ({v['over_bare']:+.0f})" for k, v in out.items()))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {"python": version, "cold_mib": args.cold_mib, "rounds": args.rounds, "ns": out, "raw": res},
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
