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
sync), graph_b1 / graph_b8 (the same graph replayed by a plain torch loop, no engine step: the replay is
the site that drives the agent's cycle, its thin check in place of torch's own replay shim),
decode_8b (a Llama-3-8B-shaped decode step at batch 1, captured), eager (a launch-bound step of
256 tiny kernels, synchronised), cpu (a pure-Python step: runs without torch or a GPU). The goal (issue
9): <= 0.1% throughput on decode.

    python3 bench/light_agent_periods.py --out /tmp/periods.json [--pairs 8] [--aa 4] [--period 2] [--settle 0.6]
        [--budget S]   (fewer pairs rather than nothing where the run would outlast S seconds)
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKLOADS = ("decode_b1", "decode_b8", "graph_b1", "graph_b8", "decode_8b", "eager", "cpu")


class Stamps:
    """%globaltimer stamps captured first and last in every decode step's graph (bench.agent_common's
    Triton kernels): the GPU's own start and end of each step, so the host's share of a step (the GPU
    idle between one step's end and the next one's start) is read apart from the graph's own time,
    which drifts with the GPU's clock from one period to the next."""

    CAP = 16384  # steps between two resets (the stamping kernel has no bound of its own)

    def __init__(self, torch: Any) -> None:
        from bench.agent_common import kernels

        self.torch, self.k = torch, kernels()
        self.stamps = torch.zeros(self.CAP * 4, dtype=torch.int64, device="cuda")
        self.counter = torch.zeros(1, dtype=torch.int64, device="cuda")

    def wrap(self, body: Any) -> Any:
        k, stamps, counter = self.k, self.stamps, self.counter

        def stamped() -> Any:
            k["spin_indexed"][(1,)](stamps, counter, 0, 0, NODES=2, CTAS=1, num_warps=1)
            out = body()
            k["spin_indexed"][(1,)](stamps, counter, 1, 0, NODES=2, CTAS=1, num_warps=1)
            k["bump"][(1,)](counter, num_warps=1)
            return out

        return stamped

    def reset(self) -> None:
        self.torch.cuda.synchronize()
        self.counter.zero_()
        self.torch.cuda.synchronize()

    def read(self, n: int) -> dict[str, float]:
        """The GPU's view of the first n steps since the reset: mean graph time, mean idle gap, mean cycle (us)."""
        self.torch.cuda.synchronize()
        n = min(n, self.CAP)
        st = self.stamps[: n * 4].view(n, 2, 2).cpu().tolist()
        starts = [r[0][0] for r in st]
        ends = [r[1][1] for r in st]
        gaps = [b - a for a, b in zip(ends[:-1], starts[1:], strict=True)]
        return {
            "gpu_us": sum(e - s for s, e in zip(starts, ends, strict=True)) / n / 1e3,
            "idle_us": sum(gaps) / len(gaps) / 1e3,
            "cycle_us": (starts[-1] - starts[0]) / (n - 1) / 1e3,
        }


def make_step(name: str) -> tuple[Any, str, Stamps | None]:
    """Build the workload's engine step (through the plugin's step wrapper); return it, what it is and
    its GPU stamps (decode workloads)."""
    from bench.light_agent_overhead import (
        HIDDEN,
        LAYERS,
        call_step,
        captured_steps,
        engine_class,
        llama8b_step,
    )

    if name == "cpu":
        cls = engine_class(True)  # the step site as the vLLM plugin installs it (the switch swaps it)
        return call_step(cls(8, lambda: sum(range(200)))), "pure-Python step, sum(range(200))", None
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device")
    stamps = Stamps(torch)
    if name.startswith(("decode_b", "graph_b")):
        batch = int(name.split("_b", 1)[1])
        ws = [torch.randn(HIDDEN, HIDDEN, device="cuda", dtype=torch.float16) * 0.005 for _ in range(8)]
        x = torch.randn(batch, HIDDEN, device="cuda", dtype=torch.float16)

        def body(x: Any = x) -> Any:
            for i in range(LAYERS):
                x = x + torch.relu(x @ ws[i % 8]) * 0.5
            return x.argmax(-1)

        step, _ = captured_steps(torch, stamps.wrap(body))
        what = f"graph of {LAYERS * 4} kernels and 2 stamps, batch {batch}, replayed and synced"
        if name.startswith("graph_b"):  # no engine step site at all: torch's replay drives the cycle
            return step, f"{what}, no engine step", stamps
        cls = engine_class(True)  # the step site as the vLLM plugin installs it (the switch swaps it)
        return call_step(cls(batch, step)), what, stamps
    cls = engine_class(True)
    if name == "decode_8b":
        step, _, _ws = llama8b_step(torch, wrap=stamps.wrap)
        return call_step(cls(1, step)), "Llama-3-8B-shaped decode step, batch 1, captured, 2 stamps", stamps
    small = torch.zeros(16, device="cuda")

    def eager() -> None:
        for _ in range(256):
            small.add_(1.0)
        torch.cuda.synchronize()

    return call_step(cls(1, eager)), "256 eager kernels a step, synchronised", None


class AgentState:
    """Start and stop the light agent as a whole; stopped, every hook site holds the engine's own function."""

    def __init__(self, spans: Any, pin: int = -1) -> None:
        """pin: the CPU the stepping (calling) thread keeps to (-1: where the OS puts it); the agent's
        threads are started free of it, as in an engine whose main thread is not pinned."""
        from exporter import agent
        from exporter.agent.switch import SWITCH

        self.agent, self.switch, self.on = agent, SWITCH, False
        self.starts = 0
        self.spans = spans  # what the agent does, for the pause probe's attribution
        self.pin = pin
        self.cpus = os.sched_getaffinity(0)
        if pin >= 0:
            os.sched_setaffinity(0, {pin})  # this thread alone (Linux: pid 0 is the calling thread)

    def set(self, on: bool) -> None:
        if on == self.on:
            return
        if on:
            if self.pin >= 0:
                os.sched_setaffinity(0, self.cpus)  # the agent's thread inherits the mask it is made with
            try:
                self.agent.start(role="generic")
            finally:
                if self.pin >= 0:
                    os.sched_setaffinity(0, {self.pin})
            self.starts += 1
            if self.agent.current() is not None:
                self.spans.watch_agent(self.agent.current())
        else:
            self.agent.stop()
            with self.switch._lock:
                self.switch._set(False)  # not driving, not cycling: the originals
        self.on = on


class StepClasses:
    """What the light agent's switch did around each step of a period (`--per-step`), and the steps' wall time.

    Each step is put in one class from the switch's state read just before and just after it: `gc` (a
    collection ran in it), `swap_in` / `swap_out` (the hooks went in or out in it), `phase` (a tick's phase
    was pending: the launch site's runner or the driver ran one), `in` (its hooks in: counted), `out` (its
    hooks out: the driver's thin check only). With the agent stopped every step is `out` (or `gc`), so each
    class's mean against the off period's `out` splits the cost. The reads cost both states the same.
    """

    NAMES = ("out", "in", "swap_in", "swap_out", "phase", "gc")

    def __init__(self, switch: Any) -> None:
        self.sw, self.gcs = switch, [0]
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.gcs[0] += 1

    def state(self) -> tuple[bool, bool, int, int]:
        sw = self.sw
        return (sw.hooks_in, sw._pending is not None, sw.after_launch, self.gcs[0])

    @staticmethod
    def name(a: tuple[bool, bool, int, int], b: tuple[bool, bool, int, int]) -> str:
        if a[3] != b[3]:
            return "gc"
        if a[0] != b[0]:
            return "swap_in" if b[0] else "swap_out"
        if a[1] or b[1] or a[2] != b[2]:
            return "phase"
        return "in" if a[0] else "out"


class SwapParts:
    """Time the switch's own parts on the engine's thread (`--swap-parts`): each call's CPU-free wall time.

    Wraps the methods of the process's Switch before the agent starts (the driver's closures take its
    `drive` then), and the tick and rearm callables the agent hands to drive_inline. `drive` is split by
    what the call did: swapped the hooks in or out, or neither. The wrappers' own frames add to what they time.
    """

    PARTS = ("_swap", "_set", "_classify", "_wake_at", "_place_runner", "_remove_runner", "_run_phases")

    def __init__(self, switch: Any) -> None:
        self.sw, self.t = switch, {}
        for name in self.PARTS:
            setattr(switch, name, self.timer(name, getattr(switch, name)))
        drive = switch.drive

        def timed_drive(by_thread: bool = False) -> bool:
            was = switch.hooks_in
            t0 = time.perf_counter_ns()
            r = drive(by_thread)
            self.add(
                "drive_" + ("swap_in" if r and not was else "swap_out" if was and not r else "other"), t0
            )
            return r

        switch.drive = timed_drive
        inline = switch.drive_inline

        def timed_inline(out_ns: int, in_ns: int, margin_ns: int, on_out: Any, rearm: Any, **kw: Any) -> bool:
            return inline(
                out_ns, in_ns, margin_ns, self.timer("on_out", on_out), self.timer("rearm", rearm), **kw
            )

        switch.drive_inline = timed_inline

    def add(self, name: str, t0: int) -> None:
        d = time.perf_counter_ns() - t0
        got = self.t.setdefault(name, [0, 0, 0])
        got[0] += 1
        got[1] += d
        got[2] = max(got[2], d)

    def timer(self, name: str, fn: Any) -> Any:
        def timed_part(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(name, t0)

        return timed_part

    def result(self) -> dict[str, list[float]]:
        """Each part: [calls, mean us, max us]."""
        return {
            k: [v[0], round(v[1] / v[0] / 1e3, 2), round(v[2] / 1e3, 1)] for k, v in sorted(self.t.items())
        }


def thread_sched() -> tuple[int, int, int]:
    """Return the calling thread's last CPU and its voluntary and involuntary context switches so far."""
    try:
        with open("/proc/thread-self/stat") as fh:
            cpu = int(fh.read().rsplit(")", 1)[1].split()[36])  # field 39, "processor"
        with open("/proc/thread-self/status") as fh:
            got = dict(line.split(":", 1) for line in fh if "ctxt_switches" in line)
        return cpu, int(got["voluntary_ctxt_switches"]), int(got["nonvoluntary_ctxt_switches"])
    except (OSError, ValueError, IndexError, KeyError):
        return -1, 0, 0


def timed(
    step: Any, seconds: float, stamps: Stamps | None = None, classes: StepClasses | None = None
) -> dict[str, Any]:
    """Step for `seconds`; return the steps, the mean step time in us and, stamped, the GPU's view.

    classes: time each step and sort it by what the agent did around it (`per_class`: count, mean us).
    Each period also says on which CPU the stepping thread began and ended it and how often the OS
    switched it out (`sched`: CPU at start, CPU at end, voluntary, involuntary context switches).
    """
    cpu0, vol0, inv0 = thread_sched()
    if stamps is not None:
        stamps.reset()
    n, t0 = 0, time.perf_counter_ns()
    t_end = t0 + int(seconds * 1e9)
    t = t0
    cap = Stamps.CAP if stamps is not None else 1 << 62
    sums: dict[str, list[int]] = {}
    if classes is None:
        while t < t_end and n < cap:
            step()
            n += 1
            t = time.perf_counter_ns()
    else:
        state, name = classes.state, classes.name
        while t < t_end and n < cap:
            a = state()
            ta = time.perf_counter_ns()
            step()
            t = time.perf_counter_ns()
            c = name(a, state())
            got = sums.get(c)
            if got is None:
                sums[c] = [1, t - ta]
            else:
                got[0] += 1
                got[1] += t - ta
            n += 1
    out: dict[str, Any] = {"steps": n, "wall_us": (t - t0) / n / 1e3}
    cpu1, vol1, inv1 = thread_sched()
    out["sched"] = [cpu0, cpu1, vol1 - vol0, inv1 - inv0]
    if stamps is not None and n > 2:
        out.update(stamps.read(n))
    if classes is not None:
        out["per_class"] = {c: [v[0], round(v[1] / v[0] / 1e3, 3)] for c, v in sorted(sums.items())}
    return out


def pairs(
    step: Any,
    state: AgentState,
    n: int,
    period: float,
    settle: float,
    aa: bool,
    stamps: Stamps | None,
    classes: StepClasses | None = None,
    until: float = math.inf,
) -> list[dict[str, Any]]:
    """Run n pairs (ABBA; both sides off for the A/A); return each pair's figures, on and off.

    until: a time.time() past which no pair starts that could not end before it (fewer pairs, kept).
    """
    out = []
    pair_s = 2 * (period + settle) * 1.25
    for i in range(n):
        if time.time() + pair_s > until:
            break
        order = (True, False) if i % 2 == 0 else (False, True)
        got: dict[str, Any] = {}
        for on in order:
            state.set(on and not aa)
            timed(step, settle, stamps)
            got["on" if on else "off"] = {
                k: round(v, 4) if isinstance(v, float) else v
                for k, v in timed(step, period, stamps, classes).items()
            }
        out.append(got)
    return out


def cost(ps: list[dict[str, Any]]) -> dict[str, Any]:
    """The pairs' relative differences (on over off) in percent: mean, its standard error, median.

    wall: the steps' mean wall time (what a loop's throughput is; with the GPU's clock drift in it).
    host (stamped steps): the GPU's idle between steps, on minus off, over the off step's cycle: what
    the host added to a step, the graph's own time (and its drift) left out.
    """

    def stats(rel: list[float]) -> dict[str, float | None]:
        se = statistics.stdev(rel) / math.sqrt(len(rel)) if len(rel) > 1 else None  # one pair: no spread
        return {
            "mean": round(statistics.fmean(rel), 4),
            "se": round(se, 4) if se is not None else None,
            "median": round(statistics.median(rel), 4),
        }

    wall = [100.0 * (p["on"]["wall_us"] - p["off"]["wall_us"]) / p["off"]["wall_us"] for p in ps]
    out: dict[str, Any] = {
        "pairs": len(ps),
        "step_us": round(statistics.fmean(p["off"]["wall_us"] for p in ps), 2),
        "wall_pct": stats(wall),
    }
    if all("idle_us" in p["on"] and "idle_us" in p["off"] for p in ps):
        host = [100.0 * (p["on"]["idle_us"] - p["off"]["idle_us"]) / p["off"]["cycle_us"] for p in ps]
        out["host_pct"] = stats(host)
        out["idle_added_us_mean"] = round(
            statistics.fmean(p["on"]["idle_us"] - p["off"]["idle_us"] for p in ps), 3
        )
        out["idle_us_off"] = round(statistics.fmean(p["off"]["idle_us"] for p in ps), 2)
        out["gpu_us_off"] = round(statistics.fmean(p["off"]["gpu_us"] for p in ps), 2)
    if all("per_class" in p["on"] and "out" in p["off"].get("per_class", {}) for p in ps):
        out["per_class"] = by_class(ps)
    return out


def by_class(ps: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Split on - off by the classes of `--per-step` (us a step, mean and se over the pairs).

    For each class c of the on period: `steps` (mean a period), `vs_on_out` (its mean step against the
    same period's `out` steps: no drift between periods in it), `vs_off` (against the off period's `out`
    steps) and `added` (its share of the on period's steps times vs_off: what it adds to the mean step;
    gc's is net of the off period's own collections). The `added` figures sum to on - off.
    """

    def ms(xs: list[float]) -> dict[str, float | None]:
        se = statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else None
        return {"mean": round(statistics.fmean(xs), 3), "se": round(se, 3) if se is not None else None}

    names = sorted({c for p in ps for c in p["on"]["per_class"]})
    out: dict[str, dict[str, Any]] = {}
    for c in names:
        steps, on_out, off_, added = [], [], [], []
        for p in ps:
            on, off = p["on"]["per_class"], p["off"]["per_class"]
            n_on, n_off = sum(v[0] for v in on.values()), sum(v[0] for v in off.values())
            base = off["out"][1]
            k, m = on.get(c, (0, 0.0))
            steps.append(k)
            add = k / n_on * (m - base) if k else 0.0
            if c == "gc" and "gc" in off:
                add -= off["gc"][0] / n_off * (off["gc"][1] - base)
            added.append(add)
            if k:
                off_.append(m - base)
                if "out" in on:
                    on_out.append(m - on["out"][1])
        out[c] = {
            "steps": round(statistics.fmean(steps), 1),
            "vs_on_out": ms(on_out) if on_out else {},
            "vs_off": ms(off_) if off_ else {},
            "added": ms(added),
        }
    return out


def child(
    name: str,
    n: int,
    n_aa: int,
    period: float,
    settle: float,
    tree: str,
    pause_s: float,
    per_step: bool = False,
    swap_parts: bool = False,
    deadline: float = 0.0,
    pin: int = -1,
) -> dict[str, Any]:
    """Run one workload's pairs, pause probes and A/A in this process; `deadline` (time.time(), 0: none):
    the on/off pairs stop early enough for the rest to end before it."""
    sys.path.insert(0, ROOT)
    if tree:  # another tree's exporter (the code before a change), this tree's bench
        sys.path.insert(0, os.path.abspath(tree))
    import exporter
    from bench.light_agent_overhead import Spans, pause_attributed

    spans = Spans()
    gc.callbacks.append(spans.on_gc)
    parts = None
    if swap_parts:
        from exporter.agent.switch import SWITCH

        parts = SwapParts(SWITCH)
    state = AgentState(spans, pin)
    state.set(True)  # before torch: the hooks see every capture, as shipped
    step, what, stamps = make_step(name)
    timed(step, 1.0, stamps)  # warm, the agent on
    res: dict[str, Any] = {"workload": name, "what": what, "pid": os.getpid(), "exporter": exporter.__file__}
    res["pin"] = pin
    t0 = time.perf_counter()
    classes = StepClasses(state.switch) if per_step else None
    # what follows the on/off pairs: two steady stretches, the pause probes, the A/A pairs, the exit
    tail_s = 2 * (settle + period) + 2 * pause_s + 2.5 * n_aa * (period + settle) + 5.0
    until = deadline - tail_s if deadline > 0 else math.inf
    res["pairs"] = pairs(
        step, state, n, period, settle, aa=False, stamps=stamps, classes=classes, until=until
    )
    res["pairs_asked"] = n
    # the engine's thread stops stepping and spins in Python: the agent's thread then swaps and ticks for
    # it until it goes quiet; each of its wake-ups can take the GIL from the spinning thread
    state.set(True)
    timed(step, settle + period, stamps)
    spans.spans.clear()
    res["pause_after_steps"] = pause_attributed(pause_s, spans) if pause_s > 0 else {}
    res["agent"] = state.agent.current().describe() if state.agent.current() is not None else None
    res["aa_pairs"] = (
        pairs(step, state, n_aa, period, settle, aa=True, stamps=stamps, classes=classes) if n_aa else []
    )
    if pause_s > 0:  # the same with no agent: what the process and the machine do alone
        state.set(False)
        timed(step, settle + period, stamps)
        spans.spans.clear()
        res["pause_after_steps_none"] = pause_attributed(pause_s, spans)
    res["seconds"] = round(time.perf_counter() - t0, 1)
    if parts is not None:
        res["swap_parts"] = parts.result()
    res["cost"] = cost(res["pairs"]) if res["pairs"] else {"pairs": 0}  # a budget too short for one pair
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
    ap.add_argument(
        "--pause", type=float, default=4.0, help="seconds of the pause probe after the steps stop"
    )
    ap.add_argument(
        "--per-step",
        action="store_true",
        help="time each step and split the cost by what the agent did around it (both states pay the reads)",
    )
    ap.add_argument(
        "--swap-parts", action="store_true", help="time the switch's own parts (their frames add to the cost)"
    )
    ap.add_argument(
        "--agent-env",
        action="append",
        default=[],
        metavar="BOUNDWATCH_AGENT_<NAME>=<value>",
        help="a setting for the agent in each workload's process (repeatable), e.g. BOUNDWATCH_AGENT_INLINE=off",
    )
    ap.add_argument(
        "--budget",
        type=float,
        default=0.0,
        help="seconds the whole run may take (0: no limit): each workload gets an even share of what is "
        "left and takes fewer on/off pairs where its share would run out, so a caller's timeout keeps them",
    )
    ap.add_argument(
        "--pin",
        type=int,
        default=-1,
        help="keep each workload's stepping thread on this CPU (-1: where the OS puts it); the agent's"
        " threads stay free",
    )
    ap.add_argument("--deadline", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    opts = ["--pairs", str(args.pairs), "--aa", str(args.aa), "--period", str(args.period), "--settle",
            str(args.settle), "--tree", args.tree, "--pause", str(args.pause), "--pin", str(args.pin)] + (["--per-step"] if args.per_step else []) + (["--swap-parts"] if args.swap_parts else [])  # fmt: skip
    if args.child:
        r = child(
            args.child,
            args.pairs,
            args.aa,
            args.period,
            args.settle,
            args.tree,
            args.pause,
            args.per_step,
            args.swap_parts,
            args.deadline,
            args.pin,
        )
        print("RESULT " + json.dumps(r), flush=True)
        return 0
    agent_env = dict(kv.split("=", 1) for kv in args.agent_env if "=" in kv)
    if any(not k.startswith("BOUNDWATCH_AGENT_") for k in agent_env) or len(agent_env) != len(args.agent_env):
        ap.error("--agent-env takes BOUNDWATCH_AGENT_<NAME>=<value>")
    names = [w for w in args.workloads.split(",") if w]
    bad = [w for w in names if w not in WORKLOADS]
    if bad or not names:
        ap.error(f"--workloads takes some of {','.join(WORKLOADS)}")
    sys.path.insert(0, ROOT)
    from bench.agent_common import run_fresh
    from bench.light_agent_overhead import Listener

    listener = Listener(f"/tmp/bwbench/light-periods-{os.getpid()}.sock")
    # each child: its warm-up and graph capture, every period with its settle, the two pause probes
    child_s = 120 + 1.25 * (2 * (args.pairs + args.aa) + 2) * (args.period + args.settle) + 2 * args.pause
    runs: list[dict[str, Any]] = []

    def save() -> None:  # after each workload: a run cut short by its caller's timeout keeps what finished
        if args.out:
            result = {
                "argv": sys.argv[1:],
                "agent_env": agent_env,
                "runs": runs,
                "messages_received": listener.count,
            }
            with open(args.out + ".part", "w") as fh:
                json.dump(result, fh, indent=2)
            os.replace(args.out + ".part", args.out)

    if args.budget < 0:
        ap.error("--budget takes seconds, 0 for no limit")
    end = time.time() + args.budget if args.budget > 0 else 0.0
    try:
        for k, name in enumerate(names):
            timeout, extra = child_s, []
            if end:  # an even share of what is left; the child stops taking pairs in time for its tail
                share = (end - time.time()) / (len(names) - k)
                timeout, extra = max(share, 1.0) + 20.0, ["--deadline", f"{time.time() + share:.3f}"]
            r = run_fresh(__file__, "workload", name, opts + extra, agent_env, listener.path, timeout=timeout)
            runs.append(r)
            save()
            if "cost" in r:
                print(f"{name:10s} {r['what']}: on-off {json.dumps(r['cost'])}; A/A {json.dumps(r.get('aa'))}",
                      flush=True)  # fmt: skip
                for c, v in (r["cost"].get("per_class") or {}).items():
                    print(f"  class {c:8s} {json.dumps(v)}", flush=True)
                for c, v in (r.get("swap_parts") or {}).items():
                    print(f"  part {c:16s} calls, mean us, max us {v}", flush=True)
                for k in ("pause_after_steps", "pause_after_steps_none"):
                    p = r.get(k) or {}
                    print(f"  {k}: max {p.get('max_us')} us, agent's {p.get('agent_max_us')} us, over 100 us by "
                          f"cause {p.get('over_100us_by_cause')}, top {p.get('top', [])[:4]}", flush=True)  # fmt: skip
    finally:
        listener.close()
    save()
    return 0 if all("cost" in r for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
