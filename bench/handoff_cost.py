"""CPU of a tick's thread hand-offs: the Sampler with 0-3 of its four null sources read through `BlockingReader` threads.

Each variant runs a tree's real `Sampler.run` for `--ticks` ticks of `--tick` seconds (50 ms by
default; the daemon's are 0.5 s) in a fresh process with four sources that cost nothing
themselves: N read through `BlockingReader` threads (as NVML, host and the engine are), 4 - N on
the event loop (as the agent feed is), and the pipeline's `advance` replaced by one that returns
its input; the process's utime + stime per tick, in us. Rounds alternate the order of the variants
(and of the trees, when several are given: before,after), so all meet the same load. The slope over
N is what one source's thread hand-off costs a tick.

Two more variants (letters): `L`, the four sources' reads already done when started (as the agent
feed's `start_read` gives; `0`'s are a task each, awaited), and `T`, the same sources and the same
`Sampler.tick()` stepped by hand from a plain loop that sleeps with `time.sleep` (no event loop
runs; nothing in such a tick awaits). What the event loop itself costs a tick is `L` less `T`.
`S<n>`: n sources through threads by `start_read` (as NVML and the engine), the others' reads done
when started (as the host and the agent feed): the daemon's shape; `A<n>`: the same, the threaded
ones with `reads_in_thread` (read a tick ahead by `Sampler.run`, their threads waking at its time).

    .venv/bin/python bench/handoff_cost.py --rounds 6 --out bench/results/handoff_cost.json
    .venv/bin/python bench/handoff_cost.py /tmp/base,. --threaded 3 --rounds 8 --out bench/results/handoff_ab.json
    .venv/bin/python bench/handoff_cost.py --tick 0.5 --ticks 40 --threaded 3,0,L,T --out bench/results/handoff_tick05.json
    .venv/bin/python bench/handoff_cost.py --tick 0.5 --ticks 40 --threaded S2,A2,L --out bench/results/handoff_ahead.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import asyncio, resource, sys
sys.path.insert(0, sys.argv[1])
import exporter.sampling as sampling
from exporter.config import load
from exporter.sources.base import BlockingReader

sampling.advance = lambda history, raw, cfg: raw
ticks, threaded, tick = int(sys.argv[2]), sys.argv[3], float(sys.argv[4])

class Threaded:
    def __init__(self, name):
        self.name, self._reader = name, BlockingReader(name, 1.0)
    async def read(self):
        return await self._reader.run(lambda: None)
    def close(self):
        self._reader.close()

class Ahead(Threaded):  # variants A<n>: a source whose start_read hands its read to its thread, read ahead
    reads_in_thread = True
    def start_read(self):
        return self._reader.submit(lambda: None)

class Handed(Threaded):  # variants S<n>: the same, started at the tick's time
    def start_read(self):
        return self._reader.submit(lambda: None)

class OnLoop:
    def __init__(self, name):
        self.name = name
    async def read(self):
        return None
    def close(self):
        pass

class Stepped(OnLoop):  # variant T: a read already done, as the agent feed's start_read gives
    def start_read(self):
        f = LOOP.create_future()
        f.set_result(None)
        return f

def by_hand() -> None:
    global LOOP
    import time
    LOOP = asyncio.new_event_loop()
    asyncio.events._set_running_loop(LOOP)  # tick() asks for the running loop (its Handoff): none runs
    cfg = load(overrides={"tick_seconds": tick, "probe.enabled": False}, environ={})
    s = sampling.Sampler(cfg, [Stepped(n) for n in ["nvml", "host", "engine", "agent"]])
    seen = []
    next_at = time.monotonic()
    while len(seen) <= ticks + 20:
        step = s.tick()
        try:
            step.send(None)
        except StopIteration:
            pass
        else:
            raise SystemExit("a null tick awaited")
        seen.append(resource.getrusage(resource.RUSAGE_SELF))
        next_at += tick
        time.sleep(max(0.0, next_at - time.monotonic()))
    r0, r1 = seen[20], seen[-1]
    print((r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / (len(seen) - 21) * 1e6)

async def main() -> None:
    global LOOP
    LOOP = asyncio.get_running_loop()
    cfg = load(overrides={"tick_seconds": tick, "probe.enabled": False}, environ={})
    names = ["nvml", "host", "engine", "agent"]
    if threaded == "L":  # T's sources on the event loop: what differs from T is the loop alone
        sources = [Stepped(n) for n in names]
    elif threaded[0] in "AS":  # n through threads by start_read (ahead or not), the rest done at once
        kind = Ahead if threaded[0] == "A" else Handed
        sources = [kind(n) if i < int(threaded[1:]) else Stepped(n) for i, n in enumerate(names)]
    else:
        sources = [Threaded(n) if i < int(threaded) else OnLoop(n) for i, n in enumerate(names)]
    stop = asyncio.Event()
    seen = []
    def on_tick(snap):
        seen.append(resource.getrusage(resource.RUSAGE_SELF))
        if len(seen) > ticks + 20:
            stop.set()
    s = sampling.Sampler(cfg, sources, on_tick=on_tick)
    await s.run(stop)
    s.close()
    r0, r1 = seen[20], seen[-1]
    print((r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / (len(seen) - 21) * 1e6)

if threaded == "T":
    by_hand()
else:
    asyncio.run(main())
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "trees", nargs="?", default=ROOT, help="source trees, comma-separated (default: this one)"
    )
    ap.add_argument(
        "--threaded",
        default="3,2,1,0",
        help="how many sources read through threads, per variant (L, T: none, done at once; T: no event loop; "
        "S<n>, A<n>: n by start_read, the rest done at once; A: read ahead)",
    )
    ap.add_argument("--tick", type=float, default=0.05, help="tick length, s (the daemon's: 0.5)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--ticks", type=int, default=300)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    trees = [os.path.abspath(t) for t in args.trees.split(",")]
    variants = [(t, n) for n in args.threaded.split(",") for t in trees]
    got: dict[str, list[float]] = {f"{t} {n}": [] for t, n in variants}
    for r in range(args.rounds):
        for tree, n in variants if r % 2 == 0 else variants[::-1]:
            out = subprocess.run(
                [sys.executable, "-c", CHILD, tree, str(args.ticks), n, str(args.tick)],
                capture_output=True,
                text=True,
                check=True,
                env=dict(os.environ, PYTHONPATH=tree),
            )
            got[f"{tree} {n}"].append(float(out.stdout.strip().splitlines()[-1]))
        print(f"round {r}: " + ", ".join(f"{k} threaded {v[-1]:.0f} us" for k, v in got.items()), flush=True)
    med = {k: statistics.median(v) for k, v in got.items()}
    print("median us per tick: " + ", ".join(f"{k} threaded {m:.0f}" for k, m in med.items()))
    if args.out:
        sys.path.insert(0, ROOT)
        from bench.ab import write_results

        write_results(args.out, {"tick_seconds": args.tick, "us_per_tick": got, "median": med})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
