"""What the light agent costs a decode loop, in one process: periods with the agent running against
periods with no agent at all, alternating, throughput compared pair by pair.

bench/light_agent_overhead.py compares blocks of ten steps through the hooks against blocks of the bare
step. Since the engine's own step drives the agent's tick (exporter.agent.switch), the tick's work on
the engine's thread lands in a few of the hooked blocks, so the blocks' median cannot weigh a fixed
cost per second. Here the agent is started and stopped as a whole (`exporter.agent.start()` /
`stop()`, the engine's own functions put back in every hook site while stopped), and each state runs
for `--period` seconds after `--settle` seconds untimed (the agent's first cycle, on its own thread,
then the engine's step drives it). Pairs run on, off, off, on, ... (ABBA), so a linear drift cancels;
the cost is the mean of the pairs' differences in mean step time, with its standard error. An A/A
beside it (both periods with no agent, the same schedule) gives the noise floor in the same process.

Workloads, one fresh process each: decode_b1 / decode_b8 (a CUDA graph of ~800 kernels replayed once a
step through the vLLM plugin's step wrapper and torch's CUDAGraph.replay, the tokens copied back: a
sync), decode_8b (a Llama-3-8B-shaped decode step at batch 1, captured), eager (a launch-bound step of
256 tiny kernels, synchronised), cpu (a pure-Python step: runs without torch or a GPU). The goal (issue
9): <= 0.1% throughput on decode.

    python3 bench/light_agent_periods.py --out /tmp/periods.json [--pairs 8] [--aa 4] [--period 2] [--settle 0.6]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKLOADS = ("decode_b1", "decode_b8", "decode_8b", "eager", "cpu")


def make_step(name: str) -> tuple[Any, str]:
    """Build the workload's engine step (through the plugin's step wrapper); return it and what it is."""
    from bench.light_agent_overhead import (
        HIDDEN,
        LAYERS,
        call_step,
        captured_steps,
        engine_class,
        llama8b_step,
    )

    cls = engine_class(True)  # the step site as the vLLM plugin installs it (the switch swaps it)
    if name == "cpu":
        return call_step(cls(8, lambda: sum(range(200)))), "pure-Python step, sum(range(200))"
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device")
    if name.startswith("decode_b"):
        batch = int(name[len("decode_b") :])
        ws = [torch.randn(HIDDEN, HIDDEN, device="cuda", dtype=torch.float16) * 0.005 for _ in range(8)]
        x = torch.randn(batch, HIDDEN, device="cuda", dtype=torch.float16)

        def body(x: Any = x) -> Any:
            for i in range(LAYERS):
                x = x + torch.relu(x @ ws[i % 8]) * 0.5
            return x.argmax(-1)

        step, _ = captured_steps(torch, body)
        return call_step(
            cls(batch, step)
        ), f"graph of {LAYERS * 4} kernels, batch {batch}, replayed and synced"
    if name == "decode_8b":
        step, _, _ws = llama8b_step(torch)
        return call_step(cls(1, step)), "Llama-3-8B-shaped decode step, batch 1, captured"
    small = torch.zeros(16, device="cuda")

    def eager() -> None:
        for _ in range(256):
            small.add_(1.0)
        torch.cuda.synchronize()

    return call_step(cls(1, eager)), "256 eager kernels a step, synchronised"


class AgentState:
    """Start and stop the light agent as a whole; stopped, every hook site holds the engine's own function."""

    def __init__(self) -> None:
        from exporter import agent
        from exporter.agent.switch import SWITCH

        self.agent, self.switch, self.on = agent, SWITCH, False
        self.starts = 0

    def set(self, on: bool) -> None:
        if on == self.on:
            return
        if on:
            self.agent.start(role="generic")
            self.starts += 1
        else:
            self.agent.stop()
            with self.switch._lock:
                self.switch._set(False)  # not driving, not cycling: the originals
        self.on = on


def timed(step: Any, seconds: float) -> tuple[int, float]:
    """Step for `seconds`; return the steps and the mean step time in us."""
    n, t0 = 0, time.perf_counter_ns()
    t_end = t0 + int(seconds * 1e9)
    t = t0
    while t < t_end:
        step()
        n += 1
        t = time.perf_counter_ns()
    return n, (t - t0) / n / 1e3


def pairs(
    step: Any, state: AgentState, n: int, period: float, settle: float, aa: bool
) -> list[dict[str, Any]]:
    """Run n pairs (ABBA; both sides off for the A/A); return each pair's mean step times."""
    out = []
    for i in range(n):
        order = (True, False) if i % 2 == 0 else (False, True)
        got: dict[bool, float] = {}
        steps: dict[bool, int] = {}
        for on in order:
            state.set(on and not aa)
            timed(step, settle)
            steps[on], got[on] = timed(step, period)
        out.append({"on_us": round(got[True], 4), "off_us": round(got[False], 4), "on_steps": steps[True],
                    "off_steps": steps[False]})  # fmt: skip
    return out


def cost(ps: list[dict[str, Any]]) -> dict[str, Any]:
    """The mean of the pairs' relative differences (on over off), its standard error, in percent."""
    rel = [100.0 * (p["on_us"] - p["off_us"]) / p["off_us"] for p in ps]
    add = [p["on_us"] - p["off_us"] for p in ps]
    se = statistics.stdev(rel) / math.sqrt(len(rel)) if len(rel) > 1 else float("nan")
    return {
        "pairs": len(rel),
        "cost_pct_mean": round(statistics.fmean(rel), 4),
        "cost_pct_se": round(se, 4),
        "cost_pct_median": round(statistics.median(rel), 4),
        "added_us_mean": round(statistics.fmean(add), 3),
        "step_us": round(statistics.fmean(p["off_us"] for p in ps), 2),
    }


def child(name: str, n: int, n_aa: int, period: float, settle: float, tree: str) -> dict[str, Any]:
    sys.path.insert(0, ROOT)
    if tree:  # another tree's exporter (the code before a change), this tree's bench
        sys.path.insert(0, os.path.abspath(tree))
    import exporter

    state = AgentState()
    state.set(True)  # before torch: the hooks see every capture, as shipped
    step, what = make_step(name)
    timed(step, 1.0)  # warm, the agent on
    res: dict[str, Any] = {"workload": name, "what": what, "pid": os.getpid(), "exporter": exporter.__file__}
    t0 = time.perf_counter()
    res["pairs"] = pairs(step, state, n, period, settle, aa=False)
    res["aa_pairs"] = pairs(step, state, n_aa, period, settle, aa=True) if n_aa else []
    res["seconds"] = round(time.perf_counter() - t0, 1)
    res["cost"] = cost(res["pairs"])
    if len(res["aa_pairs"]) > 1:
        res["aa"] = cost(res["aa_pairs"])
    res["agent_starts"] = state.starts
    state.set(False)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="")
    ap.add_argument(
        "--workloads", default="decode_b1,decode_b8,decode_8b,eager", help=f"of {','.join(WORKLOADS)}"
    )
    ap.add_argument("--pairs", type=int, default=8, help="on/off pairs per workload")
    ap.add_argument("--aa", type=int, default=4, help="off/off pairs per workload (the noise floor)")
    ap.add_argument("--period", type=float, default=2.0, help="timed seconds per period")
    ap.add_argument("--settle", type=float, default=0.6, help="untimed seconds after each switch of state")
    ap.add_argument(
        "--tree", default="", help="a checkout whose exporter/ the children import (a before/after)"
    )
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    opts = ["--pairs", str(args.pairs), "--aa", str(args.aa), "--period", str(args.period), "--settle",
            str(args.settle), "--tree", args.tree]  # fmt: skip
    if args.child:
        r = child(args.child, args.pairs, args.aa, args.period, args.settle, args.tree)
        print("RESULT " + json.dumps(r), flush=True)
        return 0
    names = [w for w in args.workloads.split(",") if w]
    bad = [w for w in names if w not in WORKLOADS]
    if bad or not names:
        ap.error(f"--workloads takes some of {','.join(WORKLOADS)}")
    sys.path.insert(0, ROOT)
    from bench.agent_common import run_fresh
    from bench.light_agent_overhead import Listener

    listener = Listener(f"/tmp/bwbench/light-periods-{os.getpid()}.sock")
    runs = []
    try:
        for name in names:
            r = run_fresh(__file__, "workload", name, opts, None, listener.path)
            runs.append(r)
            if "cost" in r:
                print(f"{name:10s} {r['what']}: on-off {json.dumps(r['cost'])}; A/A {json.dumps(r.get('aa'))}",
                      flush=True)  # fmt: skip
    finally:
        listener.close()
    result = {"argv": sys.argv[1:], "runs": runs, "messages_received": listener.count}
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0 if all("cost" in r for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
