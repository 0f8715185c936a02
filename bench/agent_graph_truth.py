"""CUPTI busy against in-kernel truth on decode-shaped CUDA graphs (~800 kernels a step), early and late starts.

Each decode step is one graph: a %globaltimer stamp kernel first, 16 layers of small bf16 matmuls and
elementwise kernels (about 800 nodes in all), a stamp kernel last. The truth is the union of the
stamped step spans (in-graph launch gaps count as busy, as CUDA events around each replay would),
over exactly the windows the agent sent. Each variant runs in a fresh process (CUPTI cannot be
unloaded): the agent started before CUDA initialised (GRAPH_TRACE possible) or after (late), with
GRAPH_TRACE on/off/auto and the kernel trim as set; batch 1 and 8; the host waits between steps
(`--gap-ms`) or not at all. The agent's own windows are read in-process; no sidecar is needed.

    python3 bench/agent_graph_truth.py --out bench/results/agent_graph_truth_h200.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.agent_common import clock_offset_ns, kernels, run_fresh

SCRIPT = os.path.abspath(__file__)
SOCK = "/tmp/bwbench/graph-truth.sock"


def start_agent() -> str:
    """Start the CUPTI agent (deep mode where the agent has modes)."""
    from exporter import agent

    try:
        return str(agent.start(role="generic", mode="cupti"))
    except TypeError:
        return str(agent.start(role="generic"))


def build(torch: Any, batch: int, layers: int, hidden: int) -> tuple[Any, Any, Any, int]:
    """Return (graph, stamps, counter, nodes): one decode step of `layers` layers as a CUDA graph."""
    k = kernels()
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    bf = torch.bfloat16
    ws = [
        [torch.randn(hidden, hidden, device=dev, dtype=bf, generator=gen) * 0.02 for _ in range(4)]
        for _ in range(layers)
    ]
    x = torch.randn(batch, hidden, device=dev, dtype=bf, generator=gen)
    side = torch.ones(batch, 64, device=dev, dtype=torch.float32)
    steps_max = 200_000
    stamps = torch.zeros(steps_max * 2 * 2, dtype=torch.int64, device=dev)
    counter = torch.zeros(1, dtype=torch.int64, device=dev)

    def body() -> None:
        k["spin_indexed"][(1,)](stamps, counter, 0, 0, NODES=2, CTAS=1, num_warps=1)
        h = x
        for w in ws:
            for wi in w:
                a = torch.nn.functional.silu(h @ wi)
                h = (h + a) * 0.5
            for _ in range(15):  # norms, rotary, bookkeeping: many tiny kernels, as a real decoder has
                side.mul_(0.999).add_(0.001)
            h = torch.nn.functional.layer_norm(h, (hidden,))
        x.copy_(h)
        k["spin_indexed"][(1,)](stamps, counter, 1, 0, NODES=2, CTAS=1, num_warps=1)
        k["bump"][(1,)](counter, num_warps=1)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            body()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    counter.zero_()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body()
    torch.cuda.synchronize()
    counter.zero_()
    torch.cuda.synchronize()
    nodes = layers * (4 * 4 + 15 * 2 + 1) + 4  # matmul, silu, add, mul per weight; tiny ops; norm; stamps
    return g, stamps, counter, nodes


def _scan_ms() -> float:
    """Time one heap scan for live CUDA graphs in this process (what a late deep-mode start pays once)."""
    from exporter.agent import hooks

    t = time.perf_counter()
    hooks.live_graphs()
    return round((time.perf_counter() - t) * 1e3, 3)


def child(name: str, args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    import torch

    late = name.startswith("late")
    state = ""
    if not late:
        state = start_agent()  # before CUDA initialises: GRAPH_TRACE may go on (auto)
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    if late and "precapture" in name:
        state = start_agent()  # CUDA is up, no graph captured yet
    g, stamps, counter, nodes = build(torch, args.batch, args.layers, args.hidden)
    if late and "precapture" not in name:
        state = start_agent()  # after CUDA initialised and a graph was captured: kernel by kernel
    from exporter import agent

    a = agent.current()
    offset = clock_offset_ns(torch)
    for _ in range(20):
        g.replay()
    torch.cuda.synchronize()
    counter.zero_()
    torch.cuda.synchronize()
    t_begin = time.time_ns()
    steps = 0
    end = time.perf_counter() + args.seconds
    gap = args.gap_ms / 1e3
    while time.perf_counter() < end:
        g.replay()
        if gap:
            torch.cuda.synchronize()
            t = time.perf_counter() + gap
            while time.perf_counter() < t:
                pass
        steps += 1
        if steps % 64 == 0 and not gap:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    t_end = time.time_ns()
    time.sleep(args.settle)  # let the agent close and send the last windows
    st = stamps[: steps * 4].view(steps, 2, 2).cpu().numpy()
    s = st[:, 0, 0].astype(np.int64) + offset
    e = st[:, 1, 1].astype(np.int64) + offset
    from bench.agent_accuracy import union_ratio

    wins = [w for w in (a.windows_sent() if a else []) if w.t0 >= t_begin + 0.5e9 and w.t1 <= t_end - 0.2e9]
    busy = sum(w.busy for w in wins)
    graph_busy = sum(w.graph_busy for w in wins)
    obs = sum(w.t1 - w.t0 for w in wins)
    truth_busy = sum(union_ratio(np, s, e, w.t0, w.t1) * (w.t1 - w.t0) for w in wins)
    per_win = [w.busy / (w.t1 - w.t0) - union_ratio(np, s, e, w.t0, w.t1) for w in wins]
    step_gpu = float(np.median(e - s)) / 1e6 if steps else None
    out = {
        "variant": name,
        "batch": args.batch,
        "gap_ms": args.gap_ms,
        "agent_state": state,
        "agent_mode": getattr(a, "mode", ""),
        "graph_trace": bool(getattr(a, "_graph_trace", False)),
        "trim_ns": os.environ.get("BOUNDWATCH_AGENT_KERNEL_TRIM_NS", "680"),
        "nodes_per_graph": nodes,
        "steps": steps,
        "step_gpu_ms_median": step_gpu,
        "windows": len(wins),
        "agent_busy_ratio": busy / obs if obs else None,
        "agent_graph_busy_ratio": graph_busy / obs if obs else None,
        "truth_busy_ratio": truth_busy / obs if obs else None,
        "error_points": 100 * (busy - truth_busy) / obs if obs else None,
        "window_error_points_max": 100 * max((abs(x) for x in per_win), default=0.0),
        "records": a.stats.records if a else 0,
        "kernels": sum(w.kernels for w in wins),
        "graphs": sum(w.graphs for w in wins),
        "heap_scan_ms": _scan_ms(),
        "window_dropped": [w.dropped for w in wins],
        "window_kernels": [w.kernels for w in wins],
        "window_error_points": [round(100 * x, 3) for x in per_win],
        "agent_stats": dataclasses.asdict(a.stats) if a else {},
        "agent_detail": getattr(a, "detail", ""),
    }
    return out


STAT_KEYS = (
    "buffers", "records", "cupti_dropped", "queue_dropped_bytes", "queued_bytes_max", "delivery_lag_ns_max",
    "decode_ns_total", "decode_ns_max", "callback_ns_total", "callback_ns_max", "loop_ns_max",
    "cupti_walks", "unwalkable", "layout_mismatch",
)  # fmt: skip

VARIANTS: list[tuple[str, dict[str, str]]] = [
    ("early_graphtrace", {"BOUNDWATCH_AGENT_GRAPH_TRACE": "auto"}),
    ("early_kernels", {"BOUNDWATCH_AGENT_GRAPH_TRACE": "off"}),
    ("early_kernels_trim0", {"BOUNDWATCH_AGENT_GRAPH_TRACE": "off", "BOUNDWATCH_AGENT_KERNEL_TRIM_NS": "0"}),
    ("late_kernels", {}),
    ("late_kernels_trim0", {"BOUNDWATCH_AGENT_KERNEL_TRIM_NS": "0"}),
    ("late_kernels_lag1", {"BOUNDWATCH_AGENT_LAG_MAX_S": "1"}),  # windows never wait past lag_s (session 5)
    ("late_precapture", {}),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", default="")
    ap.add_argument("--out", default="")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--gaps", default="0,4")
    ap.add_argument("--gap-ms", type=float, default=0.0)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--settle", type=float, default=4.0, help="seconds to wait for the last windows")
    ap.add_argument("--only", default="", help="comma-separated variant names")
    args = ap.parse_args()
    if args.child:
        try:
            res = child(args.child, args)
        except Exception as exc:
            res = {"variant": args.child, "error": f"{type(exc).__name__}: {exc}"}
        print("RESULT " + json.dumps(res), flush=True)
        return 0
    os.makedirs(os.path.dirname(SOCK), exist_ok=True)
    want = set(filter(None, args.only.split(",")))
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        for gap in [float(x) for x in args.gaps.split(",")]:
            for name, env in VARIANTS:
                if want and name not in want:
                    continue
                extra = ["--batch", str(batch), "--gap-ms", str(gap), "--layers", str(args.layers)]
                extra += [
                    "--hidden",
                    str(args.hidden),
                    "--seconds",
                    str(args.seconds),
                    "--settle",
                    str(args.settle),
                ]
                r = run_fresh(SCRIPT, "variant", name, extra, env, SOCK)
                r.setdefault("batch", batch)
                r.setdefault("gap_ms", gap)
                rows.append(r)
                print(
                    f"b={batch} gap={gap} {name:22s} gt={r.get('graph_trace')} busy={r.get('agent_busy_ratio')}"
                    f" truth={r.get('truth_busy_ratio')} err_pts={r.get('error_points')} step_ms="
                    f"{r.get('step_gpu_ms_median')} {r.get('error', '')[:200]}",
                    flush=True,
                )
                st = r.get("agent_stats") or {}
                print(
                    "   stats: " + " ".join(f"{k}={st.get(k)}" for k in STAT_KEYS),
                    f"win_dropped={r.get('window_dropped')} win_err={r.get('window_error_points')}",
                    flush=True,
                )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "argv": sys.argv}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
