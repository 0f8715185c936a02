"""Safety of the CUPTI agent on a GPU: the workload must finish unharmed in each case.

1. torch.profiler runs in the same process (it takes CUPTI over): the agent reports "preempted",
   takes CUPTI back afterwards and reports windows again; the profiler still sees CUDA kernels.
2. The sidecar is killed (SIGKILL) and restarted while an agent runs: messages are dropped and
   counted meanwhile, never blocking; after the restart the sidecar receives windows again.
3. CUPTI cannot start (cupti-python absent from the process): the agent reports "unavailable" with
   the reason, the sidecar shows it, the workload runs as without the agent.

    python3 bench/agent_safety.py --out bench/results/agent_safety_h200.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
SOCK = "/tmp/bwbench/safety.sock"


def make_graph(torch: Any) -> tuple[Any, ...]:
    """A captured graph of matmul+relu, with its inputs, output and the eager reference."""
    a = torch.randn(2048, 2048, device="cuda")
    b = torch.randn(2048, 2048, device="cuda")
    c = torch.zeros_like(a)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        c.copy_(torch.relu(a @ b))
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        c.copy_(torch.relu(a @ b))
    return g, a, b, c, torch.relu(a @ b)


def workload(torch: Any, seconds: float, graph: tuple[Any, ...] | None = None) -> dict[str, Any]:
    """Graph replays plus eager kernels; returns whether the results are right."""
    g, a, _b, c, ref = graph or make_graph(torch)
    c.zero_()
    n = 0
    ok = True
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        g.replay()
        d = (a + 1.0) * 0.5  # eager kernels
        torch.cuda.synchronize()
        n += 1
        if n % 50 == 1:
            ok = ok and bool(torch.allclose(c, ref)) and bool(torch.allclose(d, (a + 1.0) * 0.5))
        time.sleep(0.002)
    return {"iterations": n, "results_ok": ok}


def child(kind: str, seconds: float) -> dict[str, Any]:
    from exporter import agent as agent_mod

    out: dict[str, Any] = {"kind": kind, "agent_start": agent_mod.start(role="generic", mode="cupti")}
    a = agent_mod.current()
    out["detail"] = a.detail if a is not None else ""
    import torch

    if kind == "profiler":
        out["before"] = workload(torch, 2.5)
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            out["state_during"] = a.state if a is not None else None
            out["during"] = workload(torch, 1.0)
        out["profiler_cuda_events"] = sum(
            1 for e in prof.events() if str(getattr(e, "device_type", "")).endswith("CUDA")
        )
        t_after = time.time_ns()
        out["after"] = workload(torch, 3.0)
        out["state_after"] = a.state if a is not None else None
        time.sleep(1.6)
        if a is not None:
            later = [w for w in a.windows_sent() if w.t0 > t_after]
            out["windows_after"] = len(later)
            out["records_after"] = sum(w.kernels + w.graphs + w.memcpys for w in later)
            out["busy_after_ratio"] = sum(w.busy for w in later) / max(1, sum(w.t1 - w.t0 for w in later))
            out["clock_offset_ns"] = a._ts_offset
    elif kind == "profiler_graph":
        # vLLM's /start_profile: graphs captured at start-up, torch.profiler later, the same graphs after
        if os.environ.get("BENCH_FORCE_TEARDOWN"):
            os.environ["TEARDOWN_CUPTI"] = "1"  # what kineto would do without the agent's guard
        out["teardown_cupti"] = os.environ.get("TEARDOWN_CUPTI")
        graph = make_graph(torch)
        out["before"] = workload(torch, 1.0, graph)
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            out["during"] = workload(torch, 1.0, graph)
        out["profiler_cuda_events"] = sum(
            1 for e in prof.events() if str(getattr(e, "device_type", "")).endswith("CUDA")
        )
        out["after"] = workload(torch, 2.0, graph)
        out["state_after"] = a.state if a is not None else None
        agent_mod.stop()  # the agent's own stop must not break the graphs either
        out["after_agent_stop"] = workload(torch, 0.5, graph)
    else:
        out["work"] = workload(torch, seconds)
        time.sleep(1.6)
    if a is not None:
        out["messages_sent"] = a.stats.messages_sent
        out["messages_dropped"] = a.stats.messages_dropped
        out["mode"] = a.mode
        out["reattaches"] = a.stats.reattaches
        out["final_state"] = a.state
    agent_mod.stop()
    return out


def run_child(
    kind: str, seconds: float, env_extra: dict[str, str] | None = None, no_cupti: bool = False
) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOUNDWATCH_AGENT")}
    env["BOUNDWATCH_AGENT_SOCKET"] = SOCK
    if no_cupti:  # a process where CUPTI cannot start: cupti-python is not importable
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != "/tmp/site"
        )
        env["PYTHONPATH"] = os.pathsep.join([ROOT, env["PYTHONPATH"]]).strip(os.pathsep)
    env.update(env_extra or {})
    return subprocess.Popen(
        [sys.executable, __file__, "--child", kind, "--seconds", str(seconds)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def result_of(p: subprocess.Popen[str], timeout: float = 120) -> dict[str, Any]:
    out, err = p.communicate(timeout=timeout)
    lines = [x for x in out.splitlines() if x.startswith("RESULT ")]
    if not lines:
        return {"rc": p.returncode, "error": err[-1500:]}
    r = json.loads(lines[0][7:])
    r["rc"] = p.returncode
    return r


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/agent_safety.json")
    ap.add_argument("--child", default=None)
    ap.add_argument("--seconds", type=float, default=9.0)
    ap.add_argument("--port", type=int, default=19483)
    ap.add_argument(
        "--only",
        default=None,
        help="run these cases only: profiler, profiler_graph, profiler_graph_teardown, profiler_graph_nocupti",
    )
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.seconds)), flush=True)
        return 0
    from bench.agent_common import Sidecar

    results: dict[str, Any] = {}
    graph_cases = {
        "profiler_graph": ({}, False),
        "profiler_graph_teardown": ({"BENCH_FORCE_TEARDOWN": "1"}, False),
        "profiler_graph_nocupti": ({}, True),
    }
    if args.only:
        for case in args.only.split(","):
            if case == "profiler":
                results[case] = result_of(run_child("profiler", 0))
            else:
                extra, no_cupti = graph_cases[case]
                r = result_of(run_child("profiler_graph", 0, extra, no_cupti))
                r["ok"] = r.get("rc") == 0 and all(
                    r.get(k, {}).get("results_ok") for k in ("before", "during", "after", "after_agent_stop")
                )
                results[case] = r
            print(case, json.dumps(results[case]), flush=True)
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=2)
        return 0
    # 1. torch.profiler in the same process
    results["profiler"] = result_of(run_child("profiler", 0))
    print(json.dumps(results["profiler"]), flush=True)
    # 2. sidecar killed and restarted while the agent runs
    side = Sidecar(SOCK, args.port, "/tmp/bwbench/safety-sidecar.log")
    started = side.start()
    p = run_child("work", args.seconds)
    time.sleep(3.5)
    before = side.scrape() if started else {}
    side.kill()
    time.sleep(3.0)
    restarted = side.start()
    r = result_of(p)
    time.sleep(1.0)
    after = side.scrape() if restarted else {}
    busy_after = sum(
        v for (n, lab), v in after.items() if n == "boundwatch_gpu_busy_seconds_total" and "cupti" in lab
    )
    r.update(
        sidecar_started=started,
        sidecar_restarted=restarted,
        messages_before_kill=before.get(("boundwatch_agent_messages_total", ""), 0),
        messages_after_restart=after.get(("boundwatch_agent_messages_total", ""), 0),
        cupti_busy_seconds_after_restart=busy_after,
    )
    results["sidecar_restart"] = r
    print(json.dumps(r), flush=True)
    # 3. an agent whose CUPTI cannot start
    p = run_child("work", 3.0, no_cupti=True)
    time.sleep(2.0)
    mid = side.scrape() if restarted else {}
    r = result_of(p)
    r["sidecar_agents_unavailable"] = sum(
        v for (n, lab), v in mid.items() if n == "boundwatch_agents" and 'state="unavailable"' in lab
    )
    results["cupti_unavailable"] = r
    print(json.dumps(r), flush=True)
    side.stop()
    pr, sr, cu = results["profiler"], results["sidecar_restart"], results["cupti_unavailable"]
    results["pass"] = {
        "profiler": pr.get("rc") == 0
        and all(pr.get(k, {}).get("results_ok") for k in ("before", "during", "after"))
        and pr.get("state_during") == "preempted"
        and pr.get("state_after") == "running"
        and pr.get("profiler_cuda_events", 0) > 0
        and pr.get("records_after", 0) > 0,
        "sidecar_restart": sr.get("rc") == 0
        and sr.get("work", {}).get("results_ok")
        and sr.get("messages_dropped", 0) > 0
        and sr.get("messages_after_restart", 0) > 0,
        "cupti_unavailable": cu.get("rc") == 0
        and cu.get("work", {}).get("results_ok")
        and cu.get("agent_start") == "unavailable",
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(results, fh, indent=2)
    print("\nsafety:", json.dumps(results["pass"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
