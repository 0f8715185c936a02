"""Two processes sharing one GPU, each with the agent: is the GPU's union busy right, and each process's share?

One process is host-bound (per step: a short burst of bf16 matmuls, then a host sleep, ~30% duty),
the other GPU-bound (bursts of matmuls back to back). Each starts `exporter.agent.start(mode="cupti")`
(plain `start()` where the agent takes no mode). The real daemon runs beside them with real NVML
(bench/agent_common.Sidecar). Ground truth comes from the device: every burst is bracketed by two
stamping kernels that read %globaltimer, so each process knows when its work was on the GPU. Over
the same span the sidecar's busy counters (cupti: the agents' union; gpm; nvml) are read from
/metrics and compared with the union of both processes' truth and with each process's own.

Under time slicing (no MPS) a burst's bracket also covers time the other context held the GPU, so
each process's own figure is an upper bound on its share; the union is exact.

    python3 bench/two_engines_one_gpu.py --out bench/results/two_engines_one_gpu_h200.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.agent_common import Sidecar, busy_ratios, clock_offset_ns, kernels, union_fraction

SOCK = "/tmp/bwbench-two/agent.sock"
LAG_S = 1.25  # CUPTI windows reach the sidecar this much after they close (lag 1.0 s + half a flush)
STEP_API = ("mark_step",)  # public step markers the agent may expose (none on main when this was written)


def _fail(out: str | None, message: str, code: int = 2) -> None:
    print(f"two_engines_one_gpu: {message}", file=sys.stderr, flush=True)
    if out:
        with open(out, "w") as f:
            json.dump({"error": message}, f, indent=2)
    sys.exit(code)


def _start_agent() -> dict[str, Any]:
    """Start the agent in CUPTI mode where it takes a mode; find its public step API, if any."""
    import exporter.agent as agent

    try:
        state = agent.start(mode="cupti")
        how = 'start(mode="cupti")'
    except TypeError:
        state = agent.start()
        how = "start()"
    marker = next((getattr(agent, n) for n in STEP_API if callable(getattr(agent, n, None))), None)
    mode = getattr(agent.current(), "mode", None)  # what the agent runs (a mode it does not know is ignored)
    return {"state": state, "how": how, "mode": mode, "step_api": marker}


def child(kind: str, end_ns: int, out: str) -> None:
    """Run one process's load until `end_ns` (CLOCK_REALTIME) and write its truth intervals."""
    import torch

    info = _start_agent()
    marker = info.pop("step_api")
    k = kernels()["spin"]
    offset = clock_offset_ns(torch)
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    burst = 15 if kind == "host" else 20  # ~3 ms of matmuls on an H200
    max_steps = 200_000
    stamps = torch.zeros(4 * max_steps, dtype=torch.int64, device="cuda")
    for _ in range(3):
        torch.mm(a, b)
    torch.cuda.synchronize()
    print("READY", flush=True)
    steps = 0
    marks = 0
    while time.time_ns() < end_ns and steps < max_steps:
        base = 4 * steps
        k[(1,)](stamps, base, 0, num_warps=1)  # stamps[base], stamps[base + 1]
        for _ in range(burst):
            torch.mm(a, b)
        k[(1,)](stamps, base + 2, 0, num_warps=1)  # stamps[base + 2], stamps[base + 3]
        steps += 1
        if kind == "host":
            torch.cuda.synchronize()
            time.sleep(0.007)  # the host's share of the step: the GPU idles
        elif steps % 8 == 0:
            torch.cuda.synchronize()  # keep the queue bounded; the gap it leaves is in the truth
        if marker is not None:
            try:
                marker()
                marks += 1
            except TypeError:
                marker = None
    torch.cuda.synchronize()
    s = stamps[: 4 * steps].view(-1, 4).cpu().tolist()
    intervals = [(row[0] + offset, row[3] + offset) for row in s if row[3] >= row[0] > 0]
    with open(out, "w") as f:
        json.dump({"kind": kind, "agent": info, "steps": steps, "marked": marks, "intervals": intervals}, f)
    print("RESULT " + json.dumps({"kind": kind, "steps": steps, "agent": info}), flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(p: subprocess.Popen[str], timeout: float) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = p.stdout.readline() if p.stdout else ""
        if line.startswith("READY"):
            return True
        if not line and p.poll() is not None:
            return False
    return False


def _sleep_until(t: float) -> None:
    while (left := t - time.time()) > 0:
        time.sleep(min(left, 0.05))


def _series(m: dict[tuple[str, str], float], name: str) -> dict[str, float]:
    return {labels: v for (n, labels), v in m.items() if n == name}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results/two_engines_one_gpu.json")
    ap.add_argument("--seconds", type=float, default=20.0, help="measured span")
    ap.add_argument("--warmup", type=float, default=30.0, help="agents start, CUPTI attaches, loads settle")
    ap.add_argument("--child", choices=("host", "gpu"))
    ap.add_argument("--end-ns", type=int, default=0)
    ap.add_argument("--stamps", default="")
    args = ap.parse_args()
    if args.child:
        child(args.child, args.end_ns, args.stamps)
        return
    try:
        import torch
    except ImportError:
        _fail(args.out, "torch is not installed: this benchmark needs a CUDA GPU with torch and triton")
    if not torch.cuda.is_available():
        _fail(args.out, "no CUDA GPU visible (torch.cuda.is_available() is False): run it on the GPU host")
    try:
        import triton  # noqa: F401
    except ImportError:
        _fail(args.out, "triton is not installed: the truth stamps need it")
    work = os.path.dirname(SOCK)
    os.makedirs(work, exist_ok=True)
    port = _free_port()
    sidecar = Sidecar(SOCK, port, os.path.join(work, "sidecar.log"))
    if not sidecar.start():
        _fail(args.out, f"the sidecar did not start (log: {work}/sidecar.log)")
    procs: dict[str, subprocess.Popen[str]] = {}
    try:
        t0 = time.time() + args.warmup
        t1 = t0 + args.seconds
        end_ns = int((t1 + LAG_S + 1.0) * 1e9)
        env = {k: v for k, v in os.environ.items() if not k.startswith("BOUNDWATCH_AGENT")}
        env["BOUNDWATCH_AGENT_SOCKET"] = SOCK
        for kind in ("host", "gpu"):
            cmd = [sys.executable, os.path.abspath(__file__), "--child", kind, "--end-ns", str(end_ns)]
            cmd += ["--stamps", os.path.join(work, f"{kind}.json")]
            procs[kind] = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
        for kind, p in procs.items():
            if not _wait_ready(p, args.warmup + 60):
                _fail(args.out, f"the {kind}-bound process did not start (rc {p.poll()})")
        if time.time() > t0:
            _fail(args.out, f"the processes took longer than --warmup {args.warmup} s to start: raise it")
        _sleep_until(t0)
        m0 = sidecar.scrape()
        _sleep_until(t0 + LAG_S)
        m0c = sidecar.scrape()
        _sleep_until(t1)
        m1 = sidecar.scrape()
        _sleep_until(t1 + LAG_S)
        m1c = sidecar.scrape()
        for p in procs.values():
            p.wait(timeout=120)
        report = _report(args, work, (t0, t1), m0, m0c, m1, m1c)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        sidecar.stop()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report["summary"], indent=2))


def _report(
    args: argparse.Namespace,
    work: str,
    span: tuple[float, float],
    m0: dict[tuple[str, str], float],
    m0c: dict[tuple[str, str], float],
    m1: dict[tuple[str, str], float],
    m1c: dict[tuple[str, str], float],
) -> dict[str, Any]:
    """Return the truth (each process, their union) against what /metrics said over the same span."""
    lo, hi = int(span[0] * 1e9), int(span[1] * 1e9)
    per: dict[str, Any] = {}
    every: list[tuple[int, int]] = []
    for kind in ("host", "gpu"):
        with open(os.path.join(work, f"{kind}.json")) as f:
            data = json.load(f)
        ivs = [tuple(x) for x in data["intervals"]]
        every += ivs  # type: ignore[arg-type]
        per[kind] = {
            "truth_busy_ratio": union_fraction(ivs, lo, hi),  # type: ignore[arg-type]
            "steps": data["steps"],
            "steps_marked": data["marked"],
            "agent": data["agent"],
        }
    truth = union_fraction(every, lo, hi)
    cupti = busy_ratios(m0c, m1c, "0").get("cupti")
    device = busy_ratios(m0, m1, "0")
    measured = {"cupti": cupti, "gpm": device.get("gpm"), "nvml": device.get("nvml")}
    summary = {
        "truth_union_busy_ratio": truth,
        "truth_sum_of_processes": sum(p["truth_busy_ratio"] for p in per.values()),
        "per_process_truth": {k: p["truth_busy_ratio"] for k, p in per.items()},
        "measured_busy_ratio": {k: (v or {}).get("busy_ratio") for k, v in measured.items()},
        "error_vs_union": {k: (v["busy_ratio"] - truth if v else None) for k, v in measured.items()},
        "agents": _series(m1, "boundwatch_agents"),
        "verdict": {k: v for k, v in _series(m1, "boundwatch_bound").items() if v == 1.0},
        "reasons": {k: v for k, v in _series(m1, "boundwatch_bound_reason").items() if v == 1.0},
    }
    return {
        "bench": "two_engines_one_gpu",
        "seconds": args.seconds,
        "span_unix_s": list(span),
        "summary": summary,
        "processes": per,
        "measured": measured,
        "metrics_end": {f"{n}{{{lab}}}": v for (n, lab), v in m1c.items() if n.startswith("boundwatch_")},
    }


if __name__ == "__main__":
    main()
