"""Does the light agent slow a launch-bound eager loop process-wide? Before and after its start, in each process.

bench/light_agent_overhead.py found the eager loop (tiny kernels, x.add_, a sync every 256) 0.80x in
processes with the sampled light agent against processes without it, while the same loop bare against
the step wrapper in one light process differed by -0.09%. Something process-wide (the agent's thread,
its hook swaps, its imports) or the processes' own spread (none against none moved 0.86-1.58x)?

Each fresh process (modes rotated round by round) initialises CUDA, then times the eager loop in
`segments` slices; the agent starts after the first slice:

- none: no agent (its later slices against its first are the A/A);
- light: the light agent as shipped (hooks sampled, in 1/8 of each tick);
- light_thread: the light agent with BOUNDWATCH_AGENT_INLINE=off (its thread swaps the hooks and
  ticks, as before session 10: two wake-ups a tick whatever the engine does);
- light_full: the light agent with BOUNDWATCH_AGENT_HOOK_SHARE=1 (hooks always in, no swaps);
- light_early: the sampled light agent started before `import torch`, as a plugin starts it (no
  slice before: it only joins the across-process comparison).

Printed and written: each mode's after/before ratio (median over its processes: the process-wide
effect, free of placement), and each mode's loops per second across processes against none's.
`--cpus 2,3` pins every child to those CPUs (the same cores for all, the agent's thread included).

    python bench/eager_processes.py --out /tmp/eager.json [--rounds 4] [--seconds 2] [--cpus 2,3]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.ab import write_results  # noqa: E402
from bench.light_agent_overhead import Listener, Spans, pause_attributed, timed_loop  # noqa: E402

MODES = ("none", "light", "light_thread", "light_full", "light_early")
ENV = {"light_full": {"BOUNDWATCH_AGENT_HOOK_SHARE": "1"}, "light_thread": {"BOUNDWATCH_AGENT_INLINE": "off"}}
STARTED_LATE = ("light", "light_thread", "light_full")  # the agent starts after the first slice


def on_cpu() -> int:
    """Return the CPU this thread last ran on (/proc/self/stat field 39), -1 if unknown."""
    try:
        with open("/proc/thread-self/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[36])
    except (OSError, ValueError, IndexError):
        return -1


def child(mode: str, seconds: float, segments: int, cpus: str, pause_s: float = 0.0) -> dict[str, Any]:
    if cpus:
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
    res: dict[str, Any] = {"mode": mode, "pid": os.getpid(), "slices": []}
    from exporter import agent

    if mode == "light_early":
        res["agent_state"] = agent.start(role="generic")
    try:
        import torch

        cuda = torch.cuda.is_available()
        res["skipped"] = "" if cuda else "torch has no CUDA device here: the eager loop skipped"
    except ImportError as exc:
        cuda, res["skipped"] = False, f"torch not importable ({exc}): the eager loop skipped"
    if cuda:
        small = torch.zeros(16, device="cuda")

        def eager() -> None:
            for _ in range(256):
                small.add_(1.0)
            torch.cuda.synchronize()

        for i in range(segments):
            if i == 1 and mode in STARTED_LATE:
                res["agent_state"] = agent.start(role="generic")
            r = timed_loop(eager, seconds)
            res["slices"].append({"per_s": round(r["per_s"], 2), "median_us": round(r["median_us"], 2),
                                  "max_us": round(r["max_us"], 1), "cpu": on_cpu()})  # fmt: skip
    elif mode in STARTED_LATE:
        res["agent_state"] = agent.start(role="generic")
    a = agent.current()
    if pause_s > 0:  # the longest pauses a pure-Python thread sees beside the agent, and what overlapped each
        spans = Spans()
        gc.callbacks.append(spans.on_gc)
        if a is not None:
            spans.wrap(a, "tick", "tick")
            spans.wrap(a.switch, "_run_phases", "tick")  # the tick's phases the engine's thread runs
            spans.wrap(a.switch, "_set", "swap")  # every swap: the thread's and the inline ones
        res["pause"] = pause_attributed(pause_s, spans)
        if cuda:  # the engine-like thread: a launch per iteration (the GIL let go in each), no sync
            res["pause_launch"] = pause_attributed(pause_s, spans, call=lambda: small.add_(1.0))
            torch.cuda.synchronize()
            # ... and stepping: a captured graph replayed (torch's CUDAGraph.replay, the light agent's
            # hook site) every 256 launches, so a light agent's cycle is driven from this thread
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                small.add_(1.0)
            n = [0]

            def launch_and_step() -> None:
                n[0] += 1
                if n[0] % 256:
                    small.add_(1.0)
                else:
                    g.replay()

            res["pause_steps"] = pause_attributed(pause_s, spans, call=launch_and_step)
            torch.cuda.synchronize()
        gc.callbacks.remove(spans.on_gc)
    if a is not None:
        res["agent"] = {
            k: v
            for k, v in a.describe().items()
            if k in ("mode", "state", "hook_share", "hooks_driven", "wakes", "messages_sent", "replays")
        }
        agent.stop()
    return res


def pause_summary(key: str, pauses: list[dict[str, Any]]) -> dict[str, Any]:
    """Return one probe's longest gaps over processes, what overlapped them, and the agent's longest."""
    causes: dict[str, int] = {}
    for p in pauses:
        for k, n in p["over_100us_by_cause"].items():
            causes[k] = causes.get(k, 0) + n
    return {
        f"{key}_max_us": [p["max_us"] for p in pauses],
        f"{key}_agent_max_us": max(p.get("agent_max_us", 0.0) for p in pauses),
        f"{key}_top": max(pauses, key=lambda p: p["max_us"])["top"][:5],
        f"{key}s_over_100us_by_cause": causes,
    }


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Return each mode's after/before ratio (median over processes) and its loops/s against none's."""
    ok = [r for r in runs if "error" not in r]
    out: dict[str, Any] = {}
    whole = {}
    for mode in MODES:
        rs = [r for r in ok if r["mode"] == mode]
        if not rs:
            continue
        out[mode] = {"processes": len(rs)}
        timed = [r for r in rs if r["slices"]]
        if timed:
            after = [statistics.median(s["per_s"] for s in r["slices"][1:]) for r in timed]
            ratios = [a / r["slices"][0]["per_s"] for a, r in zip(after, timed, strict=True)]
            whole[mode] = statistics.median(after)
            out[mode].update(
                {
                    "after_per_s_median": round(whole[mode], 1),
                    "after_per_s_range": [round(min(after), 1), round(max(after), 1)],
                    "after_over_before_median": round(statistics.median(ratios), 4),
                    "after_over_before_range": [round(min(ratios), 4), round(max(ratios), 4)],
                }
            )
        for key in ("pause", "pause_launch", "pause_steps"):  # pure-Python spin, launches, launches and steps
            pauses = [r[key] for r in rs if key in r]
            if pauses:
                out[mode].update(pause_summary(key, pauses))
    for mode, v in out.items():
        if "none" in whole and mode != "none":
            v["across_vs_none"] = round(whole[mode] / whole["none"], 4)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=2.0, help="each slice of the eager loop")
    ap.add_argument(
        "--segments", type=int, default=3, help="slices per process (the agent starts after the first)"
    )
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--cpus", default="", help="pin every child to these CPUs, e.g. 2,3")
    ap.add_argument(
        "--pause", type=float, default=0.0, help="then spin this long, recording pauses and causes"
    )
    ap.add_argument("--child", default="")
    args = ap.parse_args()
    if args.child:
        print(
            "RESULT " + json.dumps(child(args.child, args.seconds, args.segments, args.cpus, args.pause)),
            flush=True,
        )
        return 0
    if not args.out:
        ap.error("--out is required")
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad or args.segments < 2:
        ap.error(f"modes are {', '.join(MODES)}; segments >= 2")
    from bench.agent_common import run_fresh

    listener = Listener(f"/tmp/bwbench/eager-processes-{os.getpid()}.sock")
    runs = []
    try:
        for i in range(args.rounds):
            for mode in modes[i % len(modes) :] + modes[: i % len(modes)]:
                t = time.perf_counter()
                extra = [
                    "--seconds",
                    str(args.seconds),
                    "--segments",
                    str(args.segments),
                    "--cpus",
                    args.cpus,
                    "--pause",
                    str(args.pause),
                ]
                r = run_fresh(__file__, "mode", mode, extra, ENV.get(mode), listener.path)
                r["child_seconds"] = round(time.perf_counter() - t, 1)
                runs.append(r)
                said = [s["per_s"] for s in r.get("slices", [])] or r.get("skipped") or r.get("error")
                print(mode, said, (r.get("pause") or {}).get("top", "")[:3], flush=True)
    finally:
        listener.close()
    summary = summarise(runs)
    write_results(args.out, {"runs": runs, "summary": summary, "messages_received": listener.count})
    for mode, s in summary.items():
        print(f"{mode:12s} {json.dumps(s)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
