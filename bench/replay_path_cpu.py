"""What a graph replay costs on this CPU through the light agent's hooks, out and in, per source tree and Python.

torch 2.11's `torch.cuda.CUDAGraph.replay` is a Python shim over the C++ `_CUDAGraph.replay`
(`def replay(self): super().replay()`). Each child process builds classes of that shape (the base's
replay a builtin behind pybind's `instancemethod`, here `list.clear`, about as cheap as the C++
call's Python side), imports the light hooks of one source tree, patches the class as `hooks.install`
does, lets the replay drive the cycle (no engine step: a torch engine) and times replays in a loop:

- `none`: the class unpatched (torch's own call);
- `out`: hooks out, the driver's thin check (what most of a tick's replays run);
- `in`: hooks in, counted.

Trees and modes alternate over `--rounds` in fresh processes; the figure is the median ns per
replay over the round's repeats, warm (replays back to back), or with `--cold-mib M` each replay
timed alone right after M MiB were written (the data caches emptied, roughly as a GPU step leaves them). The delta against `none` is what the
agent adds to each replay on this CPU. A decode step on the GPU host runs this code cold, so the
H200's figures per frame are several times larger (bench/README.md, "The light agent's cost"); 20 us
of the engine's Python between replays, tried, left the difference within the loop's noise here.

    python3 bench/replay_path_cpu.py /tmp/base,. --rounds 6 --out bench/results/replay_path_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.agent.fake_torch import GRAPH_2_11, INSTANCEMETHOD  # noqa: E402  (torch 2.11's class, as it reads)

CHILD = (
    r"""
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
mode, n, reps, cold_mib = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
"""
    + INSTANCEMETHOD
    + """
_CUDAGraph = type("_CUDAGraph", (list,), {"replay": instancemethod(list.clear)})
"""
    + GRAPH_2_11
    + r"""
if mode != "none":
    from exporter.agent import hooks
    from exporter.agent.switch import SWITCH
    assert hooks.patch_graph_class(CUDAGraph)
    assert SWITCH.start_cycle()
    assert SWITCH.drive_inline(10**13, 10**13, 0, lambda: iter(()), lambda wake: None)
    SWITCH.set_in(mode == "in")
g = CUDAGraph()
out = []
if cold_mib:  # each replay alone, right after cold_mib MiB were written (the caches emptied, as a GPU step does)
    buf, zeros = bytearray(cold_mib << 20), bytes(cold_mib << 20)
    clock = time.perf_counter_ns
    for _ in range(reps):
        times = []
        for _ in range(n):
            buf[:] = zeros
            t0 = clock()
            g.replay()
            times.append(clock() - t0)
        out.append(statistics.median(times))
else:
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            g.replay()
        out.append((time.perf_counter_ns() - t0) / n)
print(json.dumps({"ns": statistics.median(out)}))
"""
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trees", help="source trees, comma-separated (the first is the reference)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--n", type=int, default=200_000, help="replays a repeat")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument(
        "--cold-mib",
        type=int,
        default=0,
        help="time each replay alone after writing this many MiB (caches emptied); 0: back to back",
    )
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    trees = [os.path.abspath(t) for t in args.trees.split(",")]
    runs = [("none", trees[0])] + [(m, t) for t in trees for m in ("out", "in")]
    res: dict[str, list[float]] = {}
    for r in range(args.rounds):
        for mode, tree in runs if r % 2 == 0 else runs[::-1]:
            argv = [args.python, "-c", CHILD, tree, mode, str(args.n), str(args.reps), str(args.cold_mib)]
            got = json.loads(subprocess.check_output(argv, cwd=ROOT).split(b"\n")[-2])
            name = "none" if mode == "none" else f"{tree}:{mode}"
            res.setdefault(name, []).append(got["ns"])
    base = statistics.median(res["none"])
    how = f"each after {args.cold_mib} MiB written" if args.cold_mib else "back to back"
    print(f"{args.python}, {args.n} replays a repeat, {how}:")
    for name, v in res.items():
        med = statistics.median(v)
        print(f"  {name}: {med:.1f} ns a replay, {med - base:+.1f} against none ({len(v)} rounds)")
    if args.out:
        version = subprocess.check_output([args.python, "-c", "import sys; print(sys.version.split()[0])"])
        doc = {
            "python": version.decode().strip(),
            "trees": trees,
            "rounds": args.rounds,
            "cold_mib": args.cold_mib,
            "ns": res,
        }
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
