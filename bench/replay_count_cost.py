"""CPU per replay call: torch 2.x's CUDAGraph.replay shim against the light agent's counted replay in its place.

The light agent counts every replay where torch's `replay` is its 2.x shim (`super().replay()` over the
C++ method): the hook takes the shim's place, so the engine's call is still one Python frame. This
times that frame alone, with a C builtin standing in for the C++ replay (pybind's instancemethod over
it, as torch has it), in one process: two classes of the same shim, one patched by the agent's hooks
(as a site that does not drive the cycle: in and out the same) and one not, alternating rounds.

    .venv/bin/python bench/replay_count_cost.py --out bench/results/replay_count_cost_vm.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exporter.agent import hooks

instancemethod = ctypes.pythonapi.PyInstanceMethod_New
instancemethod.restype, instancemethod.argtypes = ctypes.py_object, [ctypes.py_object]


def graph_class(name: str) -> type:
    """Return a class shaped as torch 2.x's CUDAGraph: a C++-like base, and `replay` the shim over it."""
    base = type(f"_{name}Base", (), {"replay": instancemethod(id)})  # a C builtin of one argument

    class Graph(base):  # type: ignore[misc, valid-type]
        def replay(self) -> None:
            """Replay the CUDA work captured by this graph."""
            super().replay()

        def capture_begin(self, pool: object = None, capture_error_mode: str = "global") -> None:
            pass

        def capture_end(self) -> None:
            pass

    Graph.__name__ = Graph.__qualname__ = name
    return Graph


def per_call_ns(g: object, n: int) -> float:
    """Return the process CPU per `g.replay()` over n calls, in ns."""
    replay = g.replay  # type: ignore[attr-defined]
    c = time.process_time_ns()
    for _ in range(n):
        replay()
    return (time.process_time_ns() - c) / n


def main() -> int:
    """Time both classes alternately and write the medians and their difference."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=1_000_000)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--out", default="")
    args = p.parse_args()
    torch_cls, counted_cls = graph_class("TorchShim"), graph_class("Counted")
    assert hooks.patch_graph_class(counted_cls) and hooks.replay_direct(counted_cls)
    plain, counted = torch_cls(), counted_cls()
    before = hooks.counts()[0]
    rows: dict[str, list[float]] = {"torch_shim": [], "counted": []}
    for k in range(args.rounds):
        order = (("torch_shim", plain), ("counted", counted))
        for name, g in order if k % 2 == 0 else order[::-1]:
            rows[name].append(per_call_ns(g, args.calls))
    counted_calls = hooks.counts()[0] - before
    med = {k: statistics.median(v) for k, v in rows.items()}
    out = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "calls_per_round": args.calls,
        "rounds": args.rounds,
        "ns_per_call": rows,
        "median_ns": med,
        "counted_minus_shim_ns": med["counted"] - med["torch_shim"],
        "replays_counted": counted_calls,
        "replays_expected": args.calls * args.rounds,
        "exact": hooks.replays_exact(),
    }
    print(json.dumps({k: v for k, v in out.items() if k != "ns_per_call"}, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
