"""What the light agent's class swaps do to the engine's own code on this Python: attribute reads and
method calls on the instances of a class whose attribute the switch swaps, after N swaps.

Python 3.13 gives each class at most 1,000 type versions; every change of a class attribute uses one
(of the class and of each subclass) when the class is next used, and past the cap the interpreter no
longer specialises anything on its instances. The light agent's switch (exporter.agent.switch) swaps
an engine's step and torch's CUDAGraph.replay twice or more a tick, so this runs the real Switch on a
stand-in engine class (a step site of rank 2 on a subclass's instance, as vLLM's EngineCoreProc
inherits EngineCore.step) on a fake clock, and times a loop of the engine's own attribute reads and
method calls after 0, 300, 900, 1,200 and 3,000 swaps: as shipped (`CLASS_CHANGES_MAX`, 900 on 3.13+,
no cap before) and with no cap at all. Pure Python, no GPU; run it with each interpreter to compare.

    python3 bench/class_versions.py --out /tmp/class_versions.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.ab import write_results  # noqa: E402
from exporter.agent import switch as switch_mod  # noqa: E402

MS = 1_000_000
SWAPS = (0, 300, 900, 1200, 3000)


def engine_classes() -> tuple[type, type]:
    class EngineCore:
        def __init__(self) -> None:
            self.scheduler, self.model, self.steps = object(), object(), 0

        def step(self) -> int:
            self.steps += 1
            return self.steps

        def has_work(self) -> bool:
            return self.scheduler is not None and self.model is not None

    class EngineCoreProc(EngineCore):
        pass

    return EngineCore, EngineCoreProc


def own_loop(engine: Any, n: int) -> float:
    """ns per round of the engine's own code (4 attribute reads, 2 method calls), not through the switch."""
    t0 = time.perf_counter_ns()
    for _ in range(n):
        engine.has_work()
        engine.has_work()
        _ = engine.scheduler, engine.model
    return (time.perf_counter_ns() - t0) / n


def measure(cap: int) -> dict[str, Any]:
    """Swap the step site SWAPS[i] times in all; time the engine's own loop after each."""
    switch_mod.CLASS_CHANGES_MAX = cap
    base, sub = engine_classes()
    t = [1_000 * MS]
    sw = switch_mod.Switch(lambda: t[0])
    own = base.__dict__["step"]
    sw.add(base, "step", own, lambda self: own(self), rank=2)
    assert sw.start_cycle()

    def tick() -> Any:
        yield

    sw.drive_inline(40 * MS, 10 * MS, 5 * MS, tick, lambda w: None)
    engine = sub()
    out, swaps, was = [], 0, sw.hooks_in
    for target in SWAPS:
        while swaps < target and not sw.held:
            t[0] += 1 * MS
            engine.step()
            swaps, was = swaps + (sw.hooks_in != was), sw.hooks_in
        for _ in range(3):
            own_loop(engine, 100_000)
        ns = statistics.median(own_loop(engine, 200_000) for _ in range(5))
        out.append({"swaps_asked": target, "swaps": swaps, "ns_per_round": round(ns, 1), "held": sw.held})
    return {"cap": cap, "class_changes": sw.class_changes.get(base, 0), "rounds": out}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    shipped = switch_mod.CLASS_CHANGES_MAX
    result = {
        "python": sys.version.split()[0],
        "shipped_cap": shipped,
        "as_shipped": measure(shipped),
        "no_cap": measure(0),
    }
    switch_mod.CLASS_CHANGES_MAX = shipped
    for name in ("as_shipped", "no_cap"):
        r = result[name]
        rounds = ", ".join(f"{x['swaps']}: {x['ns_per_round']} ns" for x in r["rounds"])
        held = r["rounds"][-1]["held"]
        print(
            f"python {result['python']} {name} (cap {r['cap']}): {rounds}{'; held: ' + held if held else ''}"
        )
    if args.out:
        write_results(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
