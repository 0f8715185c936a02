"""CPU of the Sampler's own part of a tick (scheduling, thread hand-offs, Snapshot, history), per source tree.

Each tree runs its real `Sampler.run` for `--ticks` ticks at 50 ms with four sources that cost
nothing themselves (three read through `BlockingReader` threads, as NVML, host and the engine
do, one on the event loop, as the agent feed does) and the pipeline's `advance` replaced by
one that returns its input, in a fresh process; the process's utime + stime per tick, in us.
Rounds alternate the order of the trees, so both meet the same load.

    .venv/bin/python bench/sampler_tick_ab.py /tmp/base,. --rounds 6
"""

from __future__ import annotations

import argparse
import json
import os
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
ticks = int(sys.argv[2])

class Threaded:
    def __init__(self, name):
        self.name, self._reader = name, BlockingReader(name, 1.0)
    async def read(self):
        return await self._reader.run(lambda: None)
    def close(self):
        self._reader.close()

class OnLoop:
    name = "agent"
    async def read(self):
        return None
    def close(self):
        pass

async def main() -> None:
    cfg = load(overrides={"tick_seconds": 0.05, "probe.enabled": False}, environ={})
    sources = [Threaded("nvml"), Threaded("host"), Threaded("engine"), OnLoop()]
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

asyncio.run(main())
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", help="comma-separated source trees (an unpacked commit, or .)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--ticks", type=int, default=300)
    args = ap.parse_args()
    trees = [os.path.abspath(t) for t in args.trees.split(",")]
    out: dict[str, list[float]] = {t: [] for t in trees}
    for r in range(args.rounds):
        for t in trees if r % 2 == 0 else trees[::-1]:
            res = subprocess.run(
                [sys.executable, "-c", CHILD, t, str(args.ticks)], capture_output=True, text=True, check=True
            )
            out[t].append(round(float(res.stdout.split()[-1]), 1))
    print(json.dumps({"us_cpu_per_tick": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
