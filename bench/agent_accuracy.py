"""Accuracy of the CUPTI agent's busy fraction, end to end through the real sidecar's /metrics.

Ground truth comes from inside the kernels: Triton kernels stamp %globaltimer when each CTA starts
and ends. Loads: eager 2 ms kernels at 25, 50 and 90% duty, a CUDA graph of 20 kernels replayed at
50% duty, and a storm of tiny 1-CTA kernels launched back to back (with and without the per-kernel
trim). For each phase the sidecar's busy counters (source cupti, gpm, nvml) are read at two times
and compared with the truth over the same span; the agent's own windows are compared one by one.

    python3 bench/agent_accuracy.py --out bench/results/agent_accuracy_h200.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.agent_common import Sidecar, busy_ratios, clock_offset_ns, kernels
from exporter.probe.gpu import sleep_until

SOCK = "/tmp/bwbench/agent.sock"
LAG_S = 1.25  # agent lag 1.0 s + half a flush period: windows reach the sidecar this much later


def union_ratio(np: Any, s: Any, e: Any, lo: int, hi: int) -> float:
    from exporter.agent.windows import merge_np

    m = (e > lo) & (s < hi)
    bs, be = merge_np(np.maximum(s[m], lo), np.minimum(e[m], hi))
    return float((be - bs).sum()) / (hi - lo)


class Observer(threading.Thread):
    """Scrape the sidecar at two host times (CUPTI counters lag; NVML/GPM do not)."""

    def __init__(self, sidecar: Sidecar | None, at: list[float]) -> None:
        super().__init__(daemon=True)
        self.sidecar, self.at = sidecar, at
        self.marks: list[tuple[int, dict[tuple[str, str], float]]] = []
        self.done = threading.Event()

    def run(self) -> None:
        try:
            for t in self.at:
                sleep_until(t)
                wall = time.time_ns()
                page = self.sidecar.scrape() if self.sidecar is not None else {}
                self.marks.append((wall, page))
        except Exception as exc:
            print("observer:", exc, flush=True)
        finally:
            self.done.set()


def run_phase(
    name: str, torch: Any, np: Any, load: Any, settle: float, seconds: float, ctx: dict[str, Any]
) -> dict[str, Any]:
    agent = ctx["agent"]
    t_start = time.perf_counter()
    wall_start = time.time_ns()
    obs = Observer(ctx["sidecar"], [t_start + settle + LAG_S, t_start + settle + seconds + LAG_S])
    obs.start()
    s_dev, e_dev, info = load(obs.done)
    wall_end = time.time_ns()
    obs.join(10)
    off = ctx["offset"]
    out: dict[str, Any] = {"phase": name, **info}
    s = np.asarray(s_dev, dtype=np.int64) + off  # device clock -> CLOCK_REALTIME
    e = np.asarray(e_dev, dtype=np.int64) + off
    # the agent's own windows, one by one, over the steady part
    errs = []
    for w in agent.windows_sent():
        if w.dev != ctx["dev"] or w.t0 < wall_start + settle * 1e9 or w.t1 > wall_end - 0.1e9:
            continue
        truth = union_ratio(np, s, e, w.t0, w.t1)
        errs.append((w.busy / (w.t1 - w.t0)) - truth)
    if errs:
        out["agent_windows"] = {
            "n": len(errs),
            "max_abs_error": max(abs(x) for x in errs),
            "mean_error": sum(errs) / len(errs),
        }
    if len(obs.marks) == 2 and obs.marks[0][1]:
        (w0, m0), (w1, m1) = obs.marks
        ratios = busy_ratios(m0, m1, ctx["gpu_label"])
        lag = int(LAG_S * 1e9)
        truth_cupti = union_ratio(np, s, e, w0 - lag, w1 - lag)  # about the windows the counters took in
        span = counted_windows(
            agent.windows_sent(), ctx["dev"], ratios.get("cupti"), m0, m1, ctx["gpu_label"]
        )
        if span is not None:  # exactly the windows the counters took in, found by their busy sum
            truth_cupti = union_ratio(np, s, e, span[0], span[1])
            out["cupti_windows_matched"] = True
        truth_now = union_ratio(np, s, e, w0, w1)  # NVML and GPM integrate in real time
        out["truth_cupti_span"] = truth_cupti
        out["truth"] = truth_now
        for src, r in ratios.items():
            t = truth_cupti if src == "cupti" else truth_now
            r["error"] = r["busy_ratio"] - t
        out["sidecar"] = ratios
        out["pass"] = "cupti" in ratios and abs(ratios["cupti"]["error"]) <= 0.01
    else:
        out["pass"] = bool(errs) and max(abs(x) for x in errs) <= 0.01
    return out


def counted_windows(
    windows: list[Any],
    dev: int,
    cupti: dict[str, Any] | None,
    m0: dict[Any, float],
    m1: dict[Any, float],
    gpu: str,
) -> tuple[int, int] | None:
    """Return the span of the run of agent windows whose busy sum equals the sidecar's counter delta."""
    if cupti is None:
        return None
    lab = f'gpu="{gpu}",source="cupti"'
    busy = m1[("boundwatch_gpu_busy_seconds_total", lab)] - m0.get(
        ("boundwatch_gpu_busy_seconds_total", lab), 0
    )
    n = round(cupti["observed_s"] / 0.5)
    ws = sorted((w for w in windows if w.dev == dev), key=lambda w: w.t0)
    for i in range(len(ws) - n + 1):
        run = ws[i : i + n]
        if run[-1].t1 - run[0].t0 == n * 500_000_000 and abs(sum(w.busy for w in run) / 1e9 - busy) < 2e-6:
            return run[0].t0, run[-1].t1
    return None


def eager_duty(torch: Any, duty: float, ctas: int, kernel_ms: float = 2.0) -> Any:
    k = kernels()["spin"]
    period = kernel_ms / 1e3 / duty

    def load(done: threading.Event) -> tuple[Any, Any, dict[str, Any]]:
        n_max = 6000
        stamps = torch.zeros(n_max * ctas * 2, dtype=torch.int64, device="cuda")
        b = 0
        nxt = time.perf_counter()
        while not done.is_set() and b < n_max:
            sleep_until(nxt)
            k[(ctas,)](stamps, b * ctas * 2, int(kernel_ms * 1e6), num_warps=1)
            torch.cuda.synchronize()
            b += 1
            nxt += period
            if nxt < time.perf_counter() - period:
                nxt = time.perf_counter()
        v = stamps[: b * ctas * 2].view(b, ctas, 2)
        return v[:, :, 0].min(1).values.cpu().numpy(), v[:, :, 1].max(1).values.cpu().numpy(), {"bursts": b}

    return load


def graph_duty(torch: Any, duty: float, ctas: int, nodes: int = 20, node_us: int = 100) -> Any:
    k = kernels()
    max_rep = 4000
    stamps = torch.zeros(max_rep * nodes * ctas * 2, dtype=torch.int64, device="cuda")
    counter = torch.zeros(1, dtype=torch.int64, device="cuda")

    def body() -> None:
        for n in range(nodes):
            k["spin_indexed"][(ctas,)](
                stamps, counter, n, node_us * 1000, NODES=nodes, CTAS=ctas, num_warps=1
            )
        k["bump"][(1,)](counter)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        body()  # compile and warm up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body()
    period = nodes * node_us / 1e6 / duty

    def load(done: threading.Event) -> tuple[Any, Any, dict[str, Any]]:
        counter.zero_()
        stamps.zero_()
        torch.cuda.synchronize()
        r = 0
        nxt = time.perf_counter()
        while not done.is_set() and r < max_rep:
            sleep_until(nxt)
            g.replay()
            torch.cuda.synchronize()
            r += 1
            nxt += period
            if nxt < time.perf_counter() - period:
                nxt = time.perf_counter()
        v = stamps[: r * nodes * ctas * 2].view(r * nodes, ctas, 2)
        return (
            v[:, :, 0].min(1).values.cpu().numpy(),
            v[:, :, 1].max(1).values.cpu().numpy(),
            {"replays": r, "nodes": nodes},
        )

    return load


def storm(torch: Any, kernel_ns: int = 2000, cap: int = 3_000_000) -> Any:
    k = kernels()["spin"]

    def load(done: threading.Event) -> tuple[Any, Any, dict[str, Any]]:
        stamps = torch.zeros(cap * 2, dtype=torch.int64, device="cuda")
        i = 0
        t = time.perf_counter()
        while not done.is_set() and i < cap:
            for _ in range(500):
                k[(1,)](stamps, 2 * i, kernel_ns, num_warps=1)
                i += 1
            torch.cuda.synchronize()
        rate = i / (time.perf_counter() - t)
        v = stamps[: 2 * i].view(i, 2)
        return v[:, 0].cpu().numpy(), v[:, 1].cpu().numpy(), {"kernels": i, "launches_per_s": rate}

    return load


def nvml_index(uuid: str) -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        return str(pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(uuid)))
    except Exception:
        return "0"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/agent_accuracy.json")
    ap.add_argument("--settle", type=float, default=2.0)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--port", type=int, default=19482)
    args = ap.parse_args()
    os.environ["BOUNDWATCH_AGENT_SOCKET"] = SOCK
    os.environ["BOUNDWATCH_AGENT_SAMPLING"] = (
        "off"  # accuracy of full collection; sampling is an overhead mode
    )
    sidecar: Sidecar | None = Sidecar(SOCK, args.port, "/tmp/bwbench/sidecar.log")
    assert sidecar is not None
    sidecar_ok = sidecar.start()
    if not sidecar_ok:
        print("sidecar did not start; measuring the agent's windows only", flush=True)
        sidecar = None
    import numpy as np
    import torch

    from exporter import agent as agent_mod

    state = agent_mod.start(
        role="generic", mode="cupti"
    )  # before CUDA is initialised: GRAPH_TRACE from the start
    agent = agent_mod.current()
    torch.cuda.init()
    props = torch.cuda.get_device_properties(0)
    ctas = 2 * props.multi_processor_count
    kernels()
    offset = clock_offset_ns(torch)
    from exporter.agent.core import gpu_uuid

    uuid = gpu_uuid(0)
    ctx = {"agent": agent, "sidecar": sidecar, "offset": offset, "dev": 0, "gpu_label": nvml_index(uuid)}
    result: dict[str, Any] = {
        "machine": {
            "gpu": props.name,
            "uuid": uuid,
            "torch": torch.__version__,
            "python": sys.version.split()[0],
        },
        "agent": {"state": state, "lib": agent.lib_text, "mode": agent.mode, "detail": agent.detail},
        "sidecar": bool(sidecar_ok),
        "clock_offset_ns": offset,
        "phases": [],
    }
    print(json.dumps(result["agent"]), flush=True)
    phases = [
        ("eager 2 ms, 25% duty", eager_duty(torch, 0.25, ctas), 0),
        ("eager 2 ms, 50% duty", eager_duty(torch, 0.50, ctas), 0),
        ("eager 2 ms, 90% duty", eager_duty(torch, 0.90, ctas), 0),
        ("CUDA graph 20x100 us, 50% duty", graph_duty(torch, 0.50, ctas), 0),
        ("tiny-kernel storm (no trim)", storm(torch), 0),
        ("tiny-kernel storm (trim 680 ns)", storm(torch), 680),
    ]
    for name, load, trim in phases:
        agent.settings.kernel_trim_ns = trim
        r = run_phase(name, torch, np, load, args.settle, args.seconds, ctx)
        r["kernel_trim_ns"] = trim
        result["phases"].append(r)
        print(json.dumps(r), flush=True)
    result["agent_stats"] = dict(vars(agent.stats))
    agent_mod.stop()
    if sidecar is not None:
        sidecar.stop()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=2, default=str)
    print("\nphase                               truth%  cupti%   err   gpm%  nvml%  agent-window max|err|")
    for r in result["phases"]:
        sc = r.get("sidecar", {})

        def f(src: str, sc: dict[str, Any] = sc) -> str:
            return f"{100 * sc[src]['busy_ratio']:6.2f}" if src in sc else "   n/a"

        err = f"{100 * sc['cupti']['error']:+5.2f}" if "cupti" in sc else "  n/a"
        aw = r.get("agent_windows", {})
        print(
            f"{r['phase']:34s} {100 * r.get('truth', float('nan')):6.2f} {f('cupti')} {err} {f('gpm')} {f('nvml')}"
            f"   {100 * aw.get('max_abs_error', float('nan')):.2f} ({aw.get('n', 0)} windows)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
