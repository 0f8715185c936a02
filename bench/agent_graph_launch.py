"""What CUPTI costs one CUDA graph launch, split into host time in the launch call and GPU time.

The decode benchmark (agent_overhead.py) saw graph steps slow down with the agent. This isolates
where: for graphs of 1, 10, 100 and 1000 tiny kernel nodes, each replay is preceded by a GPU sleep,
so the GPU is still busy while the host submits and the events around the replay time only the
graph's execution; the launch call (`g.replay()`) is timed on the host. Each mode runs in a fresh
process (CUPTI cannot be unloaded), from "no CUPTI" up to the agent's default, so that each step of
CUPTI's set-up shows its own cost:

  none        no CUPTI in the process
  dlopen      libcupti mapped (ctypes), never called
  timestamp   one cuptiGetTimestamp (CUPTI initialises itself), nothing subscribed
  nokinds     the agent started with no activity kind: buffer callbacks registered, nothing enabled
  graph       the agent with GRAPH_TRACE only
  graph_copy  GRAPH_TRACE, MEMCPY and MEMSET (no kernel records)
  default     the agent's default kinds (GRAPH_TRACE, CONCURRENT_KERNEL, MEMCPY, MEMSET)
  kernel_off  default, then CONCURRENT_KERNEL disabled (what sampling's off-phase does)
  stopped     default, measured, then the agent stopped (kinds disabled, CUPTI kept) and measured again
  finalized   default, measured, then the agent stopped and CUPTI finalized: the next replay of a
              graph captured under GRAPH_TRACE hit an illegal memory access on the H200 (why the
              agent never finalizes)
  late_cycle  the agent started after the graphs were captured (no GRAPH_TRACE: node-level records),
              measured; stopped and CUPTI finalized, measured; started again, measured

    python3 bench/agent_graph_launch.py --out bench/results/agent_graph_launch_h200.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES: dict[str, dict[str, str] | None] = {
    "none": None,
    "dlopen": None,
    "timestamp": None,
    "nokinds": {"BOUNDWATCH_AGENT_KINDS": ""},
    "graph": {"BOUNDWATCH_AGENT_KINDS": "graph"},
    "default": {},
    "graph_copy": {"BOUNDWATCH_AGENT_KINDS": "graph,memcpy,memset"},
    "kernel_off": {},
    "stopped": {},
    "finalized": {},
    "late_cycle": {},
}
LATE = ("late_cycle",)
NODES = (1, 10, 100, 1000)


def _libcupti_path() -> str:
    """Return the libcupti torch ships (the one the agent would reuse)."""
    import glob

    import torch

    base = os.path.dirname(os.path.dirname(torch.__file__))
    hits = sorted(glob.glob(os.path.join(base, "nvidia", "*", "lib", "libcupti.so*")))
    hits += sorted(glob.glob(os.path.join(base, "nvidia", "cuda_cupti", "lib", "libcupti.so*")))
    if not hits:
        raise OSError("no libcupti next to torch")
    return hits[0]


def child(mode: str, replays: int) -> dict[str, Any]:
    sys.path.insert(0, ROOT)
    out: dict[str, Any] = {"mode": mode}
    from exporter import agent as agent_mod

    if MODES[mode] is not None and mode not in LATE:
        out["agent_state"] = agent_mod.start(role="generic", mode="cupti")
    import torch

    if mode in ("dlopen", "timestamp"):
        lib = ctypes.CDLL(_libcupti_path())
        out["lib"] = lib._name
        if mode == "timestamp":
            t = ctypes.c_uint64(0)
            out["status"] = lib.cuptiGetTimestamp(ctypes.byref(t))
    x = torch.zeros(256, device="cuda")
    graphs = {}
    s = torch.cuda.Stream()
    for n in NODES:
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            x.add_(1.0)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(n):
                x.add_(1.0)
        graphs[n] = g
    torch.cuda.synchronize()
    expected = 0

    def measure() -> dict[str, Any]:
        nonlocal expected
        res = {}
        for n, g in graphs.items():
            for _ in range(20):  # warm
                g.replay()
            torch.cuda.synchronize()
            host, gpu = [], []
            for _ in range(replays):
                torch.cuda._sleep(200_000 + 3_000 * n)  # keeps the GPU busy while the host submits
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                t = time.perf_counter_ns()
                g.replay()
                host.append(time.perf_counter_ns() - t)
                e1.record()
                torch.cuda.synchronize()
                gpu.append(e0.elapsed_time(e1) * 1e3)
            expected += n * (replays + 20)
            host.sort()
            gpu.sort()
            res[str(n)] = {
                "launch_call_us_median": host[len(host) // 2] / 1e3,
                "launch_call_us_p90": host[int(len(host) * 0.9)] / 1e3,
                "graph_gpu_us_median": gpu[len(gpu) // 2],
            }
        return res

    def agent_facts() -> dict[str, Any]:
        a = agent_mod.current()
        if a is None:
            return {}
        return {"agent_mode": a.mode, "agent_state": a.state, "records": a.stats.records}

    expected += len(graphs)  # the warm-up launch before each capture
    phases: dict[str, Any] = {}
    if mode in LATE:
        out["agent_state"] = agent_mod.start(role="generic", mode="cupti")
    if mode == "kernel_off":
        from exporter.agent.cuptilib import KIND_CONCURRENT_KERNEL

        agent_mod.current()._cupti.activity_disable(KIND_CONCURRENT_KERNEL)
    phases["measured"] = dict(measure(), **agent_facts())
    if mode in ("stopped", "finalized", "late_cycle"):
        a = agent_mod.current()
        agent_mod.stop()
        if mode != "stopped" and a is not None:
            a._cupti.finalize()  # what the agent itself never does
        phases["after_stop"] = measure()
    if mode == "late_cycle":
        out["restart_state"] = agent_mod.start(role="generic", mode="cupti")
        phases["restarted"] = dict(measure(), **agent_facts())
    torch.cuda.synchronize()
    out["result_ok"] = float(x[0].item()) == float(expected)
    out["phases"] = phases
    out["graphs"] = phases["measured"]
    agent_mod.stop()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/agent_graph_launch.json")
    ap.add_argument("--child", default=None)
    ap.add_argument("--replays", type=int, default=300)
    ap.add_argument("--order", default="none,dlopen,timestamp,nokinds,graph,default,none,default")
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.replays)), flush=True)
        return 0
    sys.path.insert(0, ROOT)
    from bench.agent_common import run_fresh

    runs = [
        run_fresh(
            __file__,
            "mode",
            mode,
            ["--replays", str(args.replays)],
            MODES[mode],
            "/tmp/bwbench/graph-launch-nobody.sock",
        )
        for mode in args.order.split(",")
    ]
    with open(args.out, "w") as fh:
        json.dump({"runs": runs, "nodes": NODES}, fh, indent=2)
    print("mode          " + "".join(f"  call-us/gpu-us @{n:<5d}" for n in NODES))
    for r in runs:
        for phase, res in r.get("phases", {}).items():
            cells = "".join(
                f"  {res[str(n)]['launch_call_us_median']:8.1f}/{res[str(n)]['graph_gpu_us_median']:8.1f}"
                for n in NODES
            )
            label = r["mode"] if phase == "measured" else f"  {phase}"
            print(f"{label:12s}{cells}  {res.get('agent_mode', '')} ok={r.get('result_ok')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
