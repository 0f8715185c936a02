"""The light agent's pauses on a stepping thread, inline drive against the agent's thread, on this machine's CPU.

No GPU needed: the tests' stand-in torch (tests/agent/fake_torch.py) gives the CUDAGraph class the
light hooks patch; a thread "steps" by replaying a graph every `--step-us` and lets go of the GIL in
between (`time.sleep(0)`, as torch's ops do), and times every iteration (a gap: an iteration longer
than 20 us), naming each gap over 100 us by what overlapped it (bench/light_agent_overhead.Spans:
the agent's swaps, its tick phases, collections). Fresh processes alternate the modes:
`none` (no agent), `inline` (the engine's step drives the cycle, BOUNDWATCH_AGENT_INLINE=on, the
default) and `thread` (the agent's thread swaps and ticks, INLINE=off).

    python3 bench/agent_pause_cpu.py --out bench/results/agent_pause_cpu.json [--rounds 3] [--seconds 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODES = ("none", "inline", "thread")


def child(mode: str, seconds: float, step_us: float) -> dict[str, Any]:
    from bench.light_agent_overhead import Spans, pause_attributed
    from exporter.agent import hooks

    hooks.install()
    import torch  # the stand-in

    from exporter.agent.light import LightAgent
    from exporter.agent.settings import Settings
    from tests.agent.fresh import ListSender

    spans = Spans()
    agent = None
    if mode != "none":
        agent = LightAgent(
            Settings(socket="", inline="on" if mode == "inline" else "off"), sender=ListSender()
        )
        spans.wrap(agent.switch, "_set", "swap")
        spans.wrap(agent.switch, "_run_phases", "tick")  # the engine thread's tick phases
        spans.wrap(agent, "tick", "tick")  # the agent thread's whole ticks
        agent.start()
    g = torch.cuda.CUDAGraph()
    next_step = [time.perf_counter_ns()]

    def call() -> None:
        now = time.perf_counter_ns()
        if now >= next_step[0]:
            g.replay()
            next_step[0] = now + int(step_us * 1e3)
        else:
            time.sleep(0)  # the GIL let go, as in a torch op

    call()
    time.sleep(1.2)  # the agent's first cycle (its thread) is over
    res = pause_attributed(seconds, spans, call=call)
    if agent is not None:
        res["agent"] = {
            "wakes": agent.wakes,
            "hooks_driven": agent.switch.driving,
            "messages": len(agent.sender.sent),
        }
        agent.stop()
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--step-us", type=float, default=1400.0, help="one engine step (a replay) this often")
    ap.add_argument("--child", default="")
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.seconds, args.step_us)), flush=True)
        return 0
    from tests.agent import fake_torch, fake_vllm
    from tests.agent.fresh import fresh_env

    env = fresh_env(Path(tempfile.mkdtemp()), [fake_torch, fake_vllm])
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    runs = []
    for i in range(args.rounds):
        for mode in MODES[i % 3 :] + MODES[: i % 3]:
            cmd = [sys.executable, __file__, "--child", mode, "--seconds", str(args.seconds),
                   "--step-us", str(args.step_us)]  # fmt: skip
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
            line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
            r = json.loads(line[-1][7:]) if line else {"error": out.stderr[-2000:]}
            r["mode"] = mode
            runs.append(r)
            print(
                mode,
                r.get("max_us"),
                r.get("agent_max_us"),
                r.get("over_100us_by_cause"),
                r.get("agent"),
                flush=True,
            )
    summary = {}
    for mode in MODES:
        rs = [r for r in runs if r["mode"] == mode and "error" not in r]
        if rs:
            summary[mode] = {
                "max_us": [r["max_us"] for r in rs],
                "agent_max_us": [r["agent_max_us"] for r in rs],
                "agent_gaps_over_100us_per_s": round(
                    statistics.median(
                        sum(n for k, n in r["over_100us_by_cause"].items() if "swap" in k or "tick" in k)
                        for r in rs
                    )
                    / args.seconds,
                    2,
                ),
                "other_gaps_over_100us_per_s": round(
                    statistics.median(r["over_100us_by_cause"].get("other", 0) for r in rs) / args.seconds, 2
                ),
                "wakes": [r.get("agent", {}).get("wakes") for r in rs],
            }
    print(json.dumps(summary, indent=1))
    if args.out:
        Path(args.out).write_text(
            json.dumps({"runs": runs, "summary": summary, "argv": sys.argv[1:]}, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
