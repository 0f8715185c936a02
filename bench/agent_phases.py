"""The light agent's own pauses on an engine's thread: each swap and each tick phase it runs there, timed.

Where the engine's step drives the hook cycle (BOUNDWATCH_AGENT_INLINE=on, the default), everything the
agent does while the engine steps runs on the engine's own thread, between two of its steps: the hook
swaps (twice a tick) and the tick, one phase per step (exporter.agent.light.LightAgent.phases). Each
such call delays the engine by exactly its own duration, so the pause the agent adds is the longest
of them; this bench times every one (wall time on the engine's thread, perf_counter_ns), by kind and
by phase, and counts the agent thread's wake-ups (each would take the GIL from the engine).

The engine is vLLM-shaped: the tests' stand-in vLLM package (tests/agent/fake_vllm.py, the classes and
signatures the plugin patches, as in vLLM 0.33) whose EngineCore.step the real plugin wraps; its model
is, with CUDA, a captured graph of `--kernels` small kernels replayed and synchronised each step (the
GIL let go in the sync, as in vLLM); without CUDA a sleep of `--step-us`. The agent sends to a real
unix datagram socket (bound, never read). Fresh processes, `--rounds` of them, `--seconds` each.

    python3 bench/agent_phases.py --out bench/results/agent_phases.json [--rounds 3] [--seconds 6]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def stats(durations_us: list[float]) -> dict[str, float]:
    """Return count, median, p90, p99 and max of a list of durations."""
    d = sorted(durations_us)
    if not d:
        return {"n": 0}
    return {
        "n": len(d),
        "median_us": round(statistics.median(d), 1),
        "p90_us": round(d[min(len(d) - 1, int(len(d) * 0.9))], 1),
        "p99_us": round(d[min(len(d) - 1, int(len(d) * 0.99))], 1),
        "max_us": round(d[-1], 1),
    }


def model_fn(kernels: int, step_us: float) -> tuple[Any, str]:
    """Return the engine's model step (a CUDA graph replayed and synchronised, else a sleep) and what it is."""
    try:
        import torch

        if torch.cuda.is_available():
            x = torch.zeros(1 << 16, device="cuda")
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(kernels):
                    x.mul_(1.0001)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(kernels):
                    x.mul_(1.0001)
            host = torch.empty(1, device="cpu").pin_memory()

            def step() -> None:
                g.replay()  # the light hooks' replay site
                host.copy_(x[:1])  # the tokens back: a sync, the GIL let go meanwhile
                torch.cuda.synchronize()

            return step, f"cuda graph of {kernels} kernels, replayed and synchronised"
    except ImportError:
        pass
    return (lambda: time.sleep(step_us / 1e6)), f"sleep {step_us:.0f} us (no CUDA)"


def child(seconds: float, kernels: int, step_us: float) -> dict[str, Any]:
    import vllm.plugins  # the stand-in package, written by the parent

    from bench.light_agent_overhead import Spans
    from exporter import agent as agent_pkg
    from exporter.agent.light import LightAgent
    from exporter.agent.sender import Sender
    from exporter.agent.settings import Settings

    vllm.plugins.load_general_plugins()  # the plugin wraps EngineCore.step (and CUDAGraph on import)
    from vllm.config import VllmConfig
    from vllm.v1.engine import core as core_mod

    model, what = model_fn(kernels, step_us)
    core_mod.time = type("ModelClock", (), {"sleep": staticmethod(lambda s: model())})  # the stand-in's model
    path = os.path.join(tempfile.mkdtemp(), "agent.sock")
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(path)  # a real receiver, never read: its buffer takes a few hundred messages
    a = agent_pkg._agent = LightAgent(Settings(socket=path, role="vllm_engine"), sender=Sender(path))
    spans = Spans()
    spans.wrap(a.switch, "_set", "swap")
    phases: dict[str, list[float]] = {}
    own_phases = a.phases

    def timed_phases(*args: Any, **kwargs: Any) -> Any:
        gen = own_phases(*args, **kwargs)
        i = 0
        while True:
            t0 = time.perf_counter_ns()
            try:
                next(gen)
            except StopIteration:
                phases.setdefault(f"phase{i}", []).append((time.perf_counter_ns() - t0) / 1e3)
                return
            phases.setdefault(f"phase{i}", []).append((time.perf_counter_ns() - t0) / 1e3)
            i += 1
            yield

    a.phases = timed_phases  # type: ignore[method-assign]
    spans.wrap(a.switch, "_run_phases", "phase_call")  # a phase with the switch's own bookkeeping
    a.start()
    core = core_mod.EngineCore(VllmConfig(max_num_seqs=64))
    steps, k, t_end = 0, 0, time.monotonic() + 1.5
    while time.monotonic() < t_end:  # the agent's first cycle (its own thread), not timed
        core.scheduler.add_request(f"w{k}", decode_steps=4)
        k += 1
        core.step_fn()
    spans.spans.clear()
    phases.clear()
    wakes0 = a.wakes
    walls: list[float] = []
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        core.scheduler.add_request(f"r{k}", decode_steps=4)
        k += 1
        t0 = time.perf_counter_ns()
        steps += 1 if core.step_fn()[1] else 0  # vLLM's busy loop calls the bound step_fn
        walls.append((time.perf_counter_ns() - t0) / 1e3)
    wakes = a.wakes - wakes0
    driven = a.switch.driving
    a.stop()
    by: dict[str, list[float]] = {}
    for t0, t1, lab in spans.spans:
        by.setdefault(lab, []).append((t1 - t0) / 1e3)
    every = by.get("swap", []) + by.get("phase_call", [])
    return {
        "model": what,
        "steps": steps,
        "step_us": stats(walls),
        "agent_thread_wakes_while_stepping": wakes,
        "hooks_driven": driven,
        "spans": {lab: stats(d) for lab, d in sorted(by.items())},
        "phases": {lab: stats(d) for lab, d in sorted(phases.items())},
        "longest_agent_call_us": round(max(every), 1) if every else 0.0,
        "messages_sent": a.sender.sent,
        "phases_after_launch": a.switch.after_launch,  # of them, run right after a graph replay's launch
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="")
    ap.add_argument("--rounds", type=int, default=3, help="fresh processes")
    ap.add_argument("--seconds", type=float, default=6.0, help="timed stepping per process")
    ap.add_argument("--kernels", type=int, default=400, help="kernels in the model's graph (with CUDA)")
    ap.add_argument("--step-us", type=float, default=1400.0, help="the model's sleep without CUDA")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.seconds, args.kernels, args.step_us)), flush=True)
        return 0
    from tests.agent import fake_vllm
    from tests.agent.fresh import fresh_env

    env = fresh_env(Path(tempfile.mkdtemp()), [fake_vllm])
    runs = []
    for _ in range(args.rounds):
        cmd = [sys.executable, __file__, "--child", "--seconds", str(args.seconds), "--kernels", str(args.kernels),
               "--step-us", str(args.step_us)]  # fmt: skip
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.seconds + 120)
        line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
        r = json.loads(line[-1][7:]) if line else {"error": out.stderr[-2000:]}
        runs.append(r)
        if "error" in r:
            print("error:", r["error"][-800:], flush=True)
            continue
        print(
            f"steps {r['steps']} (median {r['step_us'].get('median_us')} us), longest agent call "
            f"{r['longest_agent_call_us']} us, thread wake-ups {r['agent_thread_wakes_while_stepping']}, "
            f"driven {r['hooks_driven']}, phases after a launch {r.get('phases_after_launch')}",
            flush=True,
        )
        for lab, s in {**r["spans"], **r["phases"]}.items():
            print(f"  {lab:12s} {s}", flush=True)
    ok = [r for r in runs if "error" not in r]
    summary = {
        "longest_agent_call_us": [r["longest_agent_call_us"] for r in ok],
        "thread_wakes_while_stepping": [r["agent_thread_wakes_while_stepping"] for r in ok],
        "model": ok[0]["model"] if ok else "",
    }
    print(json.dumps(summary), flush=True)
    if args.out:
        Path(args.out).write_text(
            json.dumps({"runs": runs, "summary": summary, "argv": sys.argv[1:]}, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
