"""CPU of the pipeline's `advance` alone, on captured ticks, before against after, with its outputs compared.

The inputs are those `BW_COST_CAPTURE=PATH bench/sidecar_cost.py --gpus N` pickles (40 ticks of the
real daemon: each tick's history and raw Snapshot, to PATH.N). Each tree (an unpacked older commit,
or this checkout) runs in a fresh process: the 40 ticks once to warm up, then `--reps` times, each
tick's `advance(history, raw, cfg)` on the captured inputs (never on its own earlier outputs), the
thread's CPU per tick in us, and once the calls per tick (Python functions and builtins, counted by
`sys.setprofile`: the same on every run, so a figure the machine's load does not move). Rounds alternate the order of the trees, so both meet the same load.
With `--sequence` the 40 raw ticks run in order on a history that `advance` builds itself, the
one before the newest `retire()`d as the Sampler does, so what the pipeline keeps from one tick to
the next (a reading's figures, a tick's busy shares) is used as in the daemon; without it each tick
runs on its own captured (unpickled) history, where nothing carries over.
Every run also prints a digest of the 40 Snapshots `advance` returned (sha256 of their reprs:
every field, the counters' series in order, floats exact): trees that agree return the same ones.

    .venv/bin/python bench/advance_ab.py /tmp/base,. --capture /tmp/cap --gpus 8,64 --rounds 6 \
        --out bench/results/advance_ab.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import hashlib, pickle, sys, time, types
sys.path.insert(0, sys.argv[1])
from exporter.analysis.pipeline import advance

def mappingproxy_of(d):  # how the capture pickled the Snapshots' mapping fields (bench/sidecar_cost.py)
    return types.MappingProxyType(d)

with open(sys.argv[2], "rb") as f:
    got = pickle.load(f)
ticks, cfg, reps = got["ticks"], got["cfg"], int(sys.argv[3])
if sys.argv[4] == "sequence":  # the raw ticks in order, the history kept as the Sampler keeps it
    import collections
    from exporter.sampling import retire

    base = list(ticks[0][0])

    def one_pass():
        history = collections.deque(base, maxlen=len(base) + 1)
        outs = []
        for _, raw in ticks:
            snap = advance(tuple(history), raw, cfg)
            if history:
                history[-1] = retire(history[-1])
            history.append(snap)
            outs.append(snap)
        return outs
else:  # each tick on its own captured history

    def one_pass():
        return [advance(history, raw, cfg) for history, raw in ticks]

outs = one_pass()
digest = hashlib.sha256("\n".join(repr(s) for s in outs).encode()).hexdigest()
calls = [0]

def count(frame, event, arg):
    if event in ("call", "c_call"):
        calls[0] += 1

sys.setprofile(count)  # one pass counting calls (Python functions and builtins): the same on every run
one_pass()
sys.setprofile(None)
t = time.thread_time()
for _ in range(reps):
    one_pass()
print((time.thread_time() - t) / (reps * len(ticks)) * 1e6, calls[0] / len(ticks), digest)
"""


def run(tree: str, capture: str, reps: int, mode: str = "each") -> tuple[float, float, str]:
    """Return (us of CPU per tick, calls per tick, digest of the outputs) of one tree's `advance` on one capture."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD, tree, capture, str(reps), mode],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, PYTHONPATH=tree),
    )
    us, calls, digest = out.stdout.split()
    return float(us), float(calls), digest


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trees", help="source trees, comma-separated (before,after)")
    ap.add_argument("--capture", required=True, help="the BW_COST_CAPTURE path (PATH.<gpus> is read)")
    ap.add_argument("--gpus", default="8,64")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--reps", type=int, default=10, help="passes over the 40 ticks per run")
    ap.add_argument(
        "--sequence",
        action="store_true",
        help="the ticks in order on a history advance itself builds (retire()d as the Sampler does), "
        "so what the pipeline keeps from one tick to the next is used as in the daemon",
    )
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    trees = [os.path.abspath(t) for t in args.trees.split(",")]
    us: dict[str, dict[str, list[float]]] = {g: {t: [] for t in trees} for g in args.gpus.split(",")}
    digests: dict[str, dict[str, list[str]]] = {g: {t: [] for t in trees} for g in us}
    calls: dict[str, dict[str, float]] = {g: {} for g in us}
    for r in range(args.rounds):
        for gpus in us:
            for tree in trees if r % 2 == 0 else trees[::-1]:
                mode = "sequence" if args.sequence else "each"
                t_us, calls[gpus][tree], digest = run(tree, f"{args.capture}.{gpus}", args.reps, mode)
                us[gpus][tree].append(t_us)
                digests[gpus][tree].append(digest)
            row = ", ".join(f"{t} {v[-1]:.0f} us" for t, v in us[gpus].items())
            print(f"round {r}, {gpus} GPUs: {row}", flush=True)
    summary: dict[str, dict[str, object]] = {}
    for gpus, by_tree in us.items():
        med = {t: statistics.median(v) for t, v in by_tree.items()}
        same = len({d for ds in digests[gpus].values() for d in ds}) == 1
        ratios = [a / b for b, a in zip(by_tree[trees[0]], by_tree[trees[-1]], strict=True)]
        summary[gpus] = {
            "median_us": med,
            "ratios": ratios,
            "calls_per_tick": calls[gpus],
            "outputs_identical": same,
        }
        print(f"{gpus} GPUs: median us per tick {med}, after/before {[round(x, 3) for x in ratios]}")
        print(f"{gpus} GPUs: calls per tick {calls[gpus]}")
        print(f"{gpus} GPUs: outputs identical across trees and runs: {same}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {
                    "us_per_tick": us,
                    "digests": digests,
                    "summary": summary,
                    "argv": sys.argv[1:],
                    "cpus": os.cpu_count(),
                    "at": time.strftime("%Y-%m-%d %H:%M:%S"),
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
