"""Overhead of the CUPTI agent: throughput with and without it, in one run, and the longest app-thread pause.

Workloads, each in a fresh child process per configuration (CUPTI cannot be unloaded):
- decode: a small torch transformer (8 layers, d=1024, batch 32, KV cache 1024) whose decode step is
  a captured CUDA graph, with an eager 512-token prefill every 32 steps; sync per step like an engine.
- launch-bound worst case: `x.add_(1.0)` on 256 floats for 3 s, sync every 1000 launches.
Each iteration of both loops is timed, so the longest pause of the application thread is known.
Configurations: none; null (CUPTI on, records discarded: CUPTI's own cost); no_kernels (GRAPH_TRACE,
memcpy, memset only); no_graph_trace (graph kernels as kernel records); default; full; sampled.

    python3 bench/agent_overhead.py --out bench/results/agent_overhead_h200.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from array import array
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = {
    "none": None,
    "default": {},
    "null": {"BOUNDWATCH_AGENT_DECODE": "null"},  # CUPTI on, records thrown away: CUPTI's own cost
    "no_kernels": {"BOUNDWATCH_AGENT_KERNELS": "off"},  # GRAPH_TRACE + memcpy/memset only
    "no_graph_trace": {"BOUNDWATCH_AGENT_GRAPH_TRACE": "off"},  # graph kernels as kernel records
    "full": {"BOUNDWATCH_AGENT_SAMPLING": "off"},
    # which kind costs what, and whether switching every kind off gives the speed back
    "graph_only": {"BOUNDWATCH_AGENT_KINDS": "graph"},
    "kernel_only": {"BOUNDWATCH_AGENT_KINDS": "kernel"},
    "copy_only": {"BOUNDWATCH_AGENT_KINDS": "memcpy,memset"},
    "off_after": {"BOUNDWATCH_AGENT_KINDS": "kernel,memcpy,memset", "BENCH_DISABLE_AFTER": "1"},
    "duty": {
        "BOUNDWATCH_AGENT_KINDS": "kernel,memcpy,memset",
        "BOUNDWATCH_AGENT_SAMPLING": "on",
        "BOUNDWATCH_AGENT_SAMPLE_KINDS": "all",
        "BOUNDWATCH_AGENT_SAMPLE_ON_S": "0.5",
        "BOUNDWATCH_AGENT_SAMPLE_PERIOD_S": "2.0",
    },
    # CUPTI's own knobs, graph-level tracing only: where its device buffers live, how big, preallocated
    "graph_device": {
        "BOUNDWATCH_AGENT_KINDS": "graph",
        "BOUNDWATCH_AGENT_CUPTI_ATTRS": "mem_allocation_type_host_pinned=0",
    },
    "graph_pinned": {
        "BOUNDWATCH_AGENT_KINDS": "graph",
        "BOUNDWATCH_AGENT_CUPTI_ATTRS": "mem_allocation_type_host_pinned=1",
    },
    "graph_bigbuf": {
        "BOUNDWATCH_AGENT_KINDS": "graph",
        "BOUNDWATCH_AGENT_CUPTI_ATTRS": "device_buffer_size=32m,device_buffer_pre_allocate_value=4",
    },
    "graph_sema": {
        "BOUNDWATCH_AGENT_KINDS": "graph",
        "BOUNDWATCH_AGENT_CUPTI_ATTRS": "profiling_semaphore_pool_size=262144,profiling_semaphore_pre_allocate_value=4",
    },
    "graph_hw": {"BOUNDWATCH_AGENT_KINDS": "graph", "BOUNDWATCH_AGENT_HW_TRACE": "on"},
    "nokinds": {"BOUNDWATCH_AGENT_KINDS": ""},
    # kernel, memcpy, memset records switched on only after the graph was captured and warmed up
    "late_kinds": {
        "BOUNDWATCH_AGENT_KINDS": "",
        "BENCH_ENABLE_AFTER": "1",
    },  # CUPTI subscribed, callbacks registered, nothing enabled
    # attach late (graphs already captured: node-level records), detach with cuptiFinalize, repeat,
    # from a side thread while the decode loop runs: failed the next launch on the H200 (README)
    "cycle": {"BENCH_CYCLE": "0.5/5"},
    "default_pinned": {"BOUNDWATCH_AGENT_CUPTI_ATTRS": "mem_allocation_type_host_pinned=1"},
    "sampled": {
        "BOUNDWATCH_AGENT_SAMPLING": "on",
        "BOUNDWATCH_AGENT_SAMPLE_ON_S": "1.0",
        "BOUNDWATCH_AGENT_SAMPLE_PERIOD_S": "5.0",
    },
}


def pauses(ns: array) -> dict[str, float]:
    v = sorted(ns)
    n = len(v)
    return {
        "iterations": n,
        "median_us": v[n // 2] / 1e3,
        "p9999_us": v[min(n - 1, int(n * 0.9999))] / 1e3,
        "max_ms": v[-1] / 1e6,
        "over_1ms": sum(1 for x in v if x > 1_000_000),
    }


def child(config: str, decode_s: float) -> dict[str, Any]:
    sys.path.insert(0, ROOT)
    out: dict[str, Any] = {"config": config}
    agent = None
    cfg = CONFIGS[config]
    if cfg is not None and "BENCH_CYCLE" not in cfg:
        from exporter import agent as agent_mod

        out["agent_state"] = agent_mod.start(role="generic", mode="cupti")
        agent = agent_mod.current()
        out["agent_detail"] = agent.detail if agent is not None else None
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    dev = "cuda"
    # small: the defined decode loop; 8b: the shapes of an 8B model (32 layers, d 4096), ~3 ms steps
    L, d, h, B, T = {"small": (8, 1024, 16, 32, 1024), "8b": (32, 4096, 32, 32, 1024)}[
        os.environ.get("BENCH_MODEL", "small")
    ]
    out["model"] = os.environ.get("BENCH_MODEL", "small")
    dh = d // h
    dt = torch.bfloat16
    W = [
        {
            "qkv": torch.randn(3 * d, d, device=dev, dtype=dt) * 0.02,
            "o": torch.randn(d, d, device=dev, dtype=dt) * 0.02,
            "up": torch.randn(4 * d, d, device=dev, dtype=dt) * 0.02,
            "down": torch.randn(d, 4 * d, device=dev, dtype=dt) * 0.02,
        }
        for _ in range(L)
    ]
    kc = [torch.zeros(B, h, T, dh, device=dev, dtype=dt) for _ in range(L)]
    vc = [torch.zeros(B, h, T, dh, device=dev, dtype=dt) for _ in range(L)]
    x_in = torch.randn(B, 1, d, device=dev, dtype=dt)
    pos = torch.zeros(1, dtype=torch.long, device=dev)
    ar = torch.arange(T, device=dev)

    def decode_step() -> torch.Tensor:
        x = x_in
        mask = (ar <= pos).view(1, 1, 1, T)
        for i in range(L):
            y = F.layer_norm(x, (d,))
            q, k, v = F.linear(y, W[i]["qkv"]).view(B, 1, 3, h, dh).unbind(2)
            kc[i].index_copy_(2, pos, k.transpose(1, 2))
            vc[i].index_copy_(2, pos, v.transpose(1, 2))
            a = F.scaled_dot_product_attention(q.transpose(1, 2), kc[i], vc[i], attn_mask=mask)
            x = x + F.linear(a.transpose(1, 2).reshape(B, 1, d), W[i]["o"])
            y = F.layer_norm(x, (d,))
            x = x + F.linear(F.gelu(F.linear(y, W[i]["up"])), W[i]["down"])
        return x

    def prefill(tokens: torch.Tensor) -> torch.Tensor:
        x = tokens
        n = x.shape[1]
        for i in range(L):
            y = F.layer_norm(x, (d,))
            q, k, v = F.linear(y, W[i]["qkv"]).view(1, n, 3, h, dh).unbind(2)
            a = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            )
            x = x + F.linear(a.transpose(1, 2).reshape(1, n, d), W[i]["o"])
            y = F.layer_norm(x, (d,))
            x = x + F.linear(F.gelu(F.linear(y, W[i]["up"])), W[i]["down"])
        return x

    prompt = torch.randn(1, 512, d, device=dev, dtype=dt)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            decode_step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out_static = decode_step()
    for _ in range(3):
        prefill(prompt)
    torch.cuda.synchronize()
    # correctness: the graph replay equals the eager step (the agent must not change results)
    pos.fill_(5)
    g.replay()
    torch.cuda.synchronize()
    ref = decode_step()
    out["graph_matches_eager"] = bool(torch.allclose(out_static.float(), ref.float(), atol=2e-2, rtol=2e-2))

    def run_decode(seconds: float) -> dict[str, Any]:
        it = array("q")
        ev: list[Any] = []
        steps = 0
        t_end = time.perf_counter() + seconds
        t0 = time.perf_counter()
        last = time.perf_counter_ns()
        while time.perf_counter() < t_end:
            with_prefill = steps % 32 == 0
            if with_prefill:
                prefill(prompt)
            pos.fill_(steps % T)
            timed = steps % 8 == 1 and len(ev) < 400
            if timed:
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
            g.replay()
            if timed:
                e1.record()
                ev.append((e0, e1))
            torch.cuda.synchronize()
            steps += 1
            now = time.perf_counter_ns()
            if not with_prefill:  # decode-only steps: a pause shows as a step longer than the rest
                it.append(now - last)
            last = now
        el = time.perf_counter() - t0
        gpu_ms = sorted(a.elapsed_time(b) for a, b in ev)
        return {
            "steps": steps,
            "steps_per_s": steps / el,
            "tokens_per_s": steps * B / el,
            "graph_gpu_ms_median": gpu_ms[len(gpu_ms) // 2] if gpu_ms else None,
            "iter": pauses(it),
        }

    def run_launch_bound(seconds: float) -> dict[str, Any]:
        x = torch.zeros(256, device=dev)
        it = array("q")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        t_end = t0 + seconds
        last = time.perf_counter_ns()
        i = n = 0
        while True:
            if i % 1000 == 0 and time.perf_counter() > t_end:
                n = i
                break
            i += 1
            x.add_(1.0)
            if i % 1000 == 999:
                torch.cuda.synchronize()
                last = time.perf_counter_ns()
                continue  # the sync waits for the GPU: not a pause of the thread
            now = time.perf_counter_ns()
            it.append(now - last)
            last = now
        torch.cuda.synchronize()
        el = time.perf_counter() - t0
        ok = float(x[0].item()) == float(n)
        return {"launches": n, "launches_per_s": n / el, "seconds": el, "result_ok": ok, "iter": pauses(it)}

    def graph_split(n: int = 200) -> dict[str, float]:
        """Split a replay into host time in the launch call and GPU time of the graph itself.

        A GPU sleep queued first keeps the GPU busy while the host submits, so the events around the
        replay time only the graph's execution, not the launch call's latency."""
        host, gpu = [], []
        for _ in range(n):
            torch.cuda._sleep(400_000)  # ~0.2 ms of GPU time
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            t = time.perf_counter_ns()
            g.replay()
            host.append(time.perf_counter_ns() - t)
            e1.record()
            torch.cuda.synchronize()
            gpu.append(e0.elapsed_time(e1))
        host.sort()
        gpu.sort()
        return {"replay_call_us_median": host[n // 2] / 1e3, "graph_exec_ms_median": gpu[n // 2]}

    run_decode(1.0)  # warm
    run_launch_bound(0.2)
    if agent is not None and os.environ.get("BENCH_DISABLE_AFTER"):
        agent._disable_enabled()  # every kind off again: does the speed come back?
        out["disabled_after_warmup"] = True
    if agent is not None and os.environ.get("BENCH_ENABLE_AFTER"):
        from exporter.agent.cuptilib import KIND_CONCURRENT_KERNEL, KIND_MEMCPY, KIND_MEMSET

        for kind in (KIND_CONCURRENT_KERNEL, KIND_MEMCPY, KIND_MEMSET):
            agent._cupti.activity_enable(kind)
            agent._enabled.append(kind)
        out["enabled_after_warmup"] = True
    out["graph_split"] = graph_split()
    cycler = None
    if "BENCH_CYCLE" in os.environ:
        import threading

        from exporter import agent as agent_mod

        on_s, period_s = (float(v) for v in os.environ["BENCH_CYCLE"].split("/"))
        done = threading.Event()
        cyc: dict[str, Any] = {
            "cycles": 0,
            "states": [],
            "start_ms_max": 0.0,
            "stop_ms_max": 0.0,
            "records": 0,
        }

        def cycle() -> None:
            while not done.is_set():
                t = time.perf_counter()
                cyc["states"].append(agent_mod.start(role="generic", mode="cupti"))
                cyc["start_ms_max"] = max(cyc["start_ms_max"], (time.perf_counter() - t) * 1e3)
                done.wait(on_s)
                a = agent_mod.current()
                cyc["records"] += a.stats.records if a is not None else 0
                t = time.perf_counter()
                agent_mod.stop()
                if a is not None:
                    a._cupti.finalize()  # detach for real (the agent itself never finalizes)
                cyc["stop_ms_max"] = max(cyc["stop_ms_max"], (time.perf_counter() - t) * 1e3)
                cyc["cycles"] += 1
                done.wait(period_s - on_s)

        cycler = threading.Thread(target=cycle, daemon=True)
        cycler.start()
        out["cycle"] = cyc
    time.sleep(1.5)  # let the agent close its warm-up windows
    out["decode"] = run_decode(decode_s)
    out["launch_bound"] = run_launch_bound(float(os.environ.get("BENCH_LAUNCH_S", "3.0")))
    if cycler is not None:
        done.set()
        cycler.join(10)
        cyc["states"] = sorted(set(cyc["states"]))
    pos.fill_(7)  # the graph still computes what the eager step does, after everything above
    g.replay()
    torch.cuda.synchronize()
    out["graph_matches_eager_after"] = bool(
        torch.allclose(out_static.float(), decode_step().float(), atol=2e-2, rtol=2e-2)
    )
    if agent is not None:
        time.sleep(1.6)
        st = agent.stats
        out["agent"] = {
            "mode": agent.mode,
            "lib": agent.lib_text,
            "cupti_attributes": agent.cupti_attributes,
            "hw_trace": agent.hw_trace,
            "records": st.records,
            "buffers": st.buffers,
            "callback_max_us": st.callback_ns_max / 1e3,
            "callback_mean_us": st.callback_ns_total / max(1, st.buffers) / 1e3,
            "decode_ns_per_record": st.decode_ns_total / max(1, st.records),
            "decode_max_ms": st.decode_ns_max / 1e6,
            "flush_max_ms": st.flush_ns_max / 1e6,
            "loop_max_ms": st.loop_ns_max / 1e6,
            "toggles": st.toggles,
            "requests": st.requests,
            "null_bytes": st.null_bytes,
            "cupti_dropped": st.cupti_dropped,
            "layout_checked": st.layout_checked,
            "layout_mismatch": st.layout_mismatch,
            "windows": st.windows_sent,
            "sampling_active": agent._sampling_active,
        }
        from exporter import agent as agent_mod

        agent_mod.stop()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/agent_overhead.json")
    ap.add_argument("--child", default=None)
    ap.add_argument("--decode-seconds", type=float, default=5.0)
    ap.add_argument("--order", default="none,null,no_kernels,no_graph_trace,default,none,default")
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.decode_seconds)), flush=True)
        return 0
    sys.path.insert(0, ROOT)
    from bench.agent_common import run_fresh

    runs = []
    for cfg in args.order.split(","):
        t = time.time()
        r = run_fresh(
            __file__,
            "config",
            cfg,
            ["--decode-seconds", str(args.decode_seconds)],
            CONFIGS[cfg],
            "/tmp/bwbench/overhead-nobody.sock",  # no sidecar: drops are counted
        )
        if "error" not in r:
            r["wall_s"] = time.time() - t
            print(json.dumps(r), flush=True)
        runs.append(r)
    ok = [r for r in runs if "decode" in r]
    base = [r for r in ok if r["config"] == "none"]
    summary: dict[str, Any] = {}
    if base:
        bd = sum(r["decode"]["tokens_per_s"] for r in base) / len(base)
        bl = sum(r["launch_bound"]["launches_per_s"] for r in base) / len(base)
        for cfg in CONFIGS:
            rs = [r for r in ok if r["config"] == cfg]
            if not rs:
                continue
            d = sum(r["decode"]["tokens_per_s"] for r in rs) / len(rs)
            lb = sum(r["launch_bound"]["launches_per_s"] for r in rs) / len(rs)
            summary[cfg] = {
                "decode_tokens_per_s": d,
                "decode_ratio": d / bd,
                "decode_ratio_runs": [round(r["decode"]["tokens_per_s"] / bd, 4) for r in rs],
                "launch_bound_per_s": lb,
                "launch_bound_ratio": lb / bl,
                "added_us_per_launch": (1 / lb - 1 / bl) * 1e6,
                "graph_gpu_ms": sum(r["decode"].get("graph_gpu_ms_median") or 0 for r in rs) / len(rs),
                "decode_step_median_us": sum(r["decode"]["iter"]["median_us"] for r in rs) / len(rs),
                "replay_call_us": sum(r["graph_split"]["replay_call_us_median"] for r in rs) / len(rs),
                "graph_exec_ms": sum(r["graph_split"]["graph_exec_ms_median"] for r in rs) / len(rs),
                "max_pause_ms": max(
                    max(r["decode"]["iter"]["max_ms"], r["launch_bound"]["iter"]["max_ms"]) for r in rs
                ),
                "iterations_over_1ms": sum(
                    r["decode"]["iter"]["over_1ms"] + r["launch_bound"]["iter"]["over_1ms"] for r in rs
                ),
            }
    result = {"runs": runs, "summary": summary}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=2)
    print(
        "\nconfig          decode tok/s ratio step-us graph-gpu-ms  launch/s ratio +us/launch max-pause-ms >1ms"
        " replay-call-us graph-exec-ms"
    )
    for cfg, s in summary.items():
        print(
            f"{cfg:15s} {s['decode_tokens_per_s']:11.0f} {s['decode_ratio']:5.3f} {s['decode_step_median_us']:7.1f}"
            f" {s['graph_gpu_ms']:12.4f} {s['launch_bound_per_s']:9.0f} {s['launch_bound_ratio']:5.3f}"
            f" {s['added_us_per_launch']:10.2f} {s['max_pause_ms']:12.2f} {s['iterations_over_1ms']:4d}"
            f" {s['replay_call_us']:14.1f} {s['graph_exec_ms']:13.4f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
