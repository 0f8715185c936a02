"""CPU of one `NvmlSource.read_blocking()` over the tests' NVML stand-in with N GPUs, per source tree.

Each tree runs in a fresh process (rounds alternate the order): the source reads N stand-in GPUs
(GPM on) `--reads` times, `--gap` s apart (as ticks do, so caches are as cold as in the daemon),
and the median thread CPU per read is printed, in us. The stand-in is Python, so this measures
the source's own per-field overhead plus the stand-in's; on a real driver each call costs
~1.5 us more (section "NVML calls per tick" of bench/README.md). A tree whose source follows the
Snapshot is handed verdicts of `gpu` on every GPU first, as the daemon's first tick would.

    .venv/bin/python bench/nvml_read_ab.py /tmp/base,. --gpus 8,64 --rounds 4 --out bench/results/nvml_read_ab.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import statistics, sys, time
sys.path.insert(0, sys.argv[1])
from exporter.config import load
from exporter.sources.nvml import NvmlSource
from tests.fakes.nvml_standin import FakeGpu, FakeNvml

gpus, reads, gap = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
cfg = load(overrides={}, environ={})
src = NvmlSource(cfg.nvml, nvml=FakeNvml([FakeGpu(uuid=f"GPU-{i}") for i in range(gpus)]))
if hasattr(src, "follow"):  # the daemon hands the source each tick's verdicts (their edges: GRAPHICS_UTIL's gate)
    from exporter.snapshot import Snapshot
    from exporter.snapshot.verdict import Verdict
    verdicts = tuple(Verdict(i, "gpu", edges=(0.70, 0.775)) for i in range(gpus))
    src.follow(Snapshot(seq=1, at=0.0, mono=0.0, interval=0.5, dt=0.5, verdicts=verdicts))
src.read_blocking()
out = []
for _ in range(reads):
    time.sleep(gap)
    c = time.thread_time()
    src.read_blocking()
    out.append(time.thread_time() - c)
src.close()
print(statistics.median(out) * 1e6)
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trees", help="source trees, comma-separated (before,after)")
    ap.add_argument("--gpus", default="8,64")
    ap.add_argument("--reads", type=int, default=200)
    ap.add_argument("--gap", type=float, default=0.02)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    trees = [os.path.abspath(t) for t in args.trees.split(",")]
    rows = []
    for r in range(args.rounds):
        for g in [int(x) for x in args.gpus.split(",")]:
            for tree in trees if r % 2 == 0 else trees[::-1]:
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, tree, str(g), str(args.reads), str(args.gap)],
                    capture_output=True,
                    text=True,
                    check=True,
                    env=dict(os.environ, PYTHONPATH=tree),
                    cwd=tree,
                )
                us = float(out.stdout.strip().splitlines()[-1])
                rows.append({"tree": tree, "gpus": g, "round": r, "us_per_read": us})
                print(f"round {r} {g} GPUs {tree}: {us:.0f} us a read", flush=True)
    for g in sorted({row["gpus"] for row in rows}):
        meds = [
            statistics.median(x["us_per_read"] for x in rows if x["gpus"] == g and x["tree"] == t)
            for t in trees
        ]
        print(f"{g} GPUs median: " + ", ".join(f"{t} {m:.0f} us" for t, m in zip(trees, meds, strict=True)))
    if args.out:
        sys.path.insert(0, ROOT)
        from bench.ab import write_results

        write_results(args.out, {"rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
