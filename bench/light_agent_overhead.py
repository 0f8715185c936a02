"""What the light agent (no CUPTI) costs the application: throughput with and without it, in one run.

Fresh processes alternate (none, light, light, none, ...; bench/agent_common.run_fresh), each running
every workload once:

- decode_b1 / decode_b8: a CUDA graph of about 800 kernels (200 layers of matmul, relu, scale, add)
  replayed once per step, the step's tokens copied back (a sync), as an engine's decode loop does. With
  the light agent the step goes through the vLLM plugin's step wrapper (timing, scheduler counts) and
  every replay through the CUDAGraph hook, both installed as shipped: in for the agent's hook_share of
  each tick (exporter.agent.switch), the engine's own functions between.
- decode_8b: one decode step of a Llama-3-8B-shaped model at batch 1 (32 layers, 14 GB of bf16
  weights read a step), captured in a CUDA graph: a realistic step length for the same wrapper.
- *_same_process: the bare step against the same step through the agent's hooks, blocks alternating in
  one process; *_hook_only / *_wrapper_only: the replay hook alone, the step wrapper alone. A process
  without the agent runs the same pairs (both sides bare), so both modes do the same work in the same
  order before each timed loop, and those pairs are the A/A beside (`*_same_process_aa`).
- eager: a launch-bound loop of tiny eager kernels (x.add_), synchronised every 256 launches;
  eager_same_process: the same loop as an engine's step, bare against the step wrapper in one process.
- agent_thread_cpu_pct: the CPU the agent's own thread used over a light child's life (from /proc), the
  most of the GIL it can have taken from the workloads' thread.
- cpu_steps: the same step wrapper around a pure-Python step (runs without torch or a GPU);
  plain_cpu: the pure-Python step called directly (no wrapper in either mode: the agent's thread and
  whatever else differs between the processes, alone).
- pause_after_decode / pause: a pure-Python loop that records the longest gap between its iterations,
  after the decode loops and after the CPU-step flood (~300k steps/s) (the agent's thread
  holding the GIL shows up here as an added pause); each long gap is named by what overlapped it (a
  garbage collection, the agent's tick, a hook swap, or 'other': the OS, the VM).

The goal (issue 9): <= 0.1% throughput on decode, no app pause added over 0.1 ms. Without torch or a
GPU the GPU workloads are skipped with a message and the CPU ones still run. The parent listens on the
agent socket (messages are received and counted, as a sidecar would).

    python bench/light_agent_overhead.py --out /tmp/light_overhead.json [--rounds 3] [--seconds 6]
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import operator
import os
import socket
import statistics
import sys
import threading
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYERS = 200  # x 4 ops: ~800 kernels per graph
HIDDEN = 512


class FakeScheduler:
    """What the step wrapper reads after each step (vLLM's Scheduler.get_request_counts)."""

    def __init__(self, batch: int) -> None:
        self.batch = batch

    def get_request_counts(self) -> tuple[int, int]:
        return self.batch, 0


class FakeConfig:
    class scheduler_config:
        max_num_seqs = 256
        max_num_active_seqs = None

    class parallel_config:
        data_parallel_rank = 0


class Engine:
    """An EngineCore-shaped object: step() returns (outputs, model_executed)."""

    def __init__(self, batch: int, body: Any) -> None:
        self.scheduler = FakeScheduler(batch)
        self.vllm_config = FakeConfig()
        self.body = body

    def step(self) -> tuple[dict[int, Any], bool]:
        return {0: self.body()}, True


def engine_class(light: bool) -> type[Engine]:
    """Return an Engine class whose step goes through the plugin's wrapper when the agent is on."""
    cls = type("EngineCore", (Engine,), {"step": Engine.step})
    if light:
        from exporter.agent import plugins

        batch_of = lambda core, n: (core.scheduler.batch * n, core.scheduler.batch * n)  # noqa: E731
        # through the switch, as the vLLM plugin installs it: sampled, in for hook_share of each tick
        plugins.hook_step(cls, "step", "vllm", batch_of, plugins.vllm_counts)
    return cls


def call_step(engine: Any) -> Any:
    """Return engine.step as a callable that looks the method up at each call (no Python frame of its own).

    The light agent swaps its step hook in and out of the class (exporter.agent.switch), as vLLM's
    engine core sees through its step_fn (adopted by the switch): a bound method taken once would
    keep whichever was in at that moment.
    """
    return functools.partial(operator.methodcaller("step"), engine)


def timed_loop(fn: Any, seconds: float) -> dict[str, Any]:
    """Call fn until `seconds` pass; return calls per second and the step-time tail."""
    for _ in range(20):
        fn()
    times: list[int] = []
    t_end = time.perf_counter() + seconds
    t0 = time.perf_counter_ns()
    while time.perf_counter() < t_end:
        a = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - a)
    wall = time.perf_counter_ns() - t0
    times.sort()
    return {
        "calls": len(times),
        "per_s": len(times) / (wall / 1e9),
        "median_us": times[len(times) // 2] / 1e3,
        "p999_us": times[min(len(times) - 1, int(len(times) * 0.999))] / 1e3,
        "max_us": times[-1] / 1e3,
    }


def interleaved(raw: Any, hooked: Any, seconds: float, block: int = 10) -> dict[str, Any]:
    """Alternate blocks of `block` calls of raw() and hooked() in this process; return the per-call cost.

    Fresh processes differ by several percent in throughput on this machine (same code, same GPU), so a
    0.1% cost can only be seen side by side in one process: same graph, same CUDA context, same thread.

    The agent's fixed work on the engine's thread (each tick's phases and swaps, where the step drives
    the cycle) lands in a few hooked blocks a tick and only in hooked ones: the median of the blocks
    moves with that contamination and the blocks' jitter, not with a per-call cost. The mean of the
    paired differences (`added_us_mean`) counts that work once, on half the calls: an upper bound of
    what a loop that steps only through the hooks pays a step (`loop_us_low`: half of it, the bound
    from below where the whole cost is the fixed work).
    """
    for _ in range(20):
        raw()
        hooked()
    per: dict[str, list[float]] = {"raw": [], "hooked": []}
    t_end = time.perf_counter() + seconds
    i = 0
    while time.perf_counter() < t_end:
        order = (("raw", raw), ("hooked", hooked)) if i % 2 == 0 else (("hooked", hooked), ("raw", raw))
        for name, fn in order:
            a = time.perf_counter_ns()
            for _ in range(block):
                fn()
            per[name].append((time.perf_counter_ns() - a) / block)
        i += 1
    r = statistics.median(per["raw"])
    h = statistics.median(per["hooked"])
    pairs = [b - a for a, b in zip(per["raw"], per["hooked"], strict=False)]
    mean = statistics.fmean(pairs) if pairs else 0.0
    return {
        "blocks": len(per["raw"]),
        "block_calls": block,
        "raw_us": round(r / 1e3, 3),
        "hooked_us": round(h / 1e3, 3),
        "added_us": round((h - r) / 1e3, 3),
        "ratio": round(r / h, 6),
        "cost_pct": round(100 * (h - r) / r, 4),
        "added_us_mean": round(mean / 1e3, 3),
        "cost_pct_mean": round(100 * mean / r, 4),
        "loop_us_low": round(mean / 2e3, 3),
    }


class Spans:
    """Intervals (perf_counter_ns) of what can hold the GIL while the pause probe spins: collections, agent calls."""

    def __init__(self) -> None:
        self.spans: list[tuple[int, int, str]] = []
        self._gc_at: dict[str, tuple[int, int]] = {}

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        now, who = time.perf_counter_ns(), threading.current_thread().name
        if phase == "start":
            self._gc_at[who] = (now, info.get("generation", -1))
        elif who in self._gc_at:
            t0, gen = self._gc_at.pop(who)
            self.spans.append((t0, now, f"gc{gen}" + ("" if who == "MainThread" else f"@{who}")))

    def wrap(self, owner: Any, name: str, label: str) -> None:
        """Record each call of owner.name (an instance attribute in front of the method)."""
        fn = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spans.append((t0, time.perf_counter_ns(), label))

        setattr(owner, name, timed)

    def watch_agent(self, a: Any) -> None:
        """Record the light agent's own activity: its ticks, swaps, tick phases (either thread's), and its
        thread's time awake between two timer waits (it holds or wants the GIL then: 'agent_thread')."""
        from exporter.agent.timer import WakeTimer

        self.wrap(a, "tick", "tick")
        self.wrap(a.switch, "_set", "swap")  # every swap: the thread's and the inline ones
        self.wrap(a.switch, "_run_phases", "phases")
        if getattr(WakeTimer.wait, "_bench_watched", False):
            return
        own, awake = WakeTimer.wait, [0]
        spans = self.spans

        def wait(timer: Any) -> bool:
            if awake[0]:
                spans.append((awake[0], time.perf_counter_ns(), "agent_thread"))
            try:
                return bool(own(timer))
            finally:
                awake[0] = time.perf_counter_ns()

        wait._bench_watched = True  # type: ignore[attr-defined]
        WakeTimer.wait = wait  # type: ignore[method-assign]

    def what(self, a: int, b: int) -> str:
        """Return the labels of the spans that overlap [a, b], 'other' if none."""
        hit = sorted({lab for t0, t1, lab in self.spans if t0 < b and t1 > a})
        return "+".join(hit) or "other"


def pause_attributed(seconds: float, spans: Spans, call: Any = None) -> dict[str, Any]:
    """Spin for `seconds`; return the longest gaps and what overlapped each.

    With no `call` the thread spins in pure Python and never lets go of the GIL: another thread gets
    it only by a forced switch (the worst case). With `call` (an engine-like thread: a tiny CUDA launch,
    which releases the GIL inside torch's dispatch) each iteration makes that call, so a gap is one
    iteration's time, the call included, and the agent can take the GIL while the call runs.
    """
    gaps: list[tuple[int, int]] = []
    last = time.perf_counter_ns()
    t_end = last + int(seconds * 1e9)
    while last < t_end:
        if call is not None:
            call()
        now = time.perf_counter_ns()
        if now - last > 20_000:
            gaps.append((last, now))
        last = now
    gaps.sort(key=lambda g: g[0] - g[1])
    by: dict[str, int] = {}
    for a, b in gaps:
        if b - a > 100_000:
            k = spans.what(a, b)
            by[k] = by.get(k, 0) + 1
    mine = ("tick", "swap", "phases", "agent_thread")
    agent = [b - a for a, b in gaps if any(k in mine for k in spans.what(a, b).split("+"))]
    return {
        "gaps_over_20us": len(gaps),
        "agent_max_us": round(max(agent) / 1e3, 1) if agent else 0.0,  # the longest the agent overlapped
        "max_us": round((gaps[0][1] - gaps[0][0]) / 1e3, 1) if gaps else 0.0,
        "top": [[round((b - a) / 1e3, 1), spans.what(a, b)] for a, b in gaps[:8]],
        "over_100us_by_cause": by,
        "spans": {  # how many of each, and the longest (wall time, GIL waits included)
            lab: [
                sum(1 for s in spans.spans if s[2] == lab),
                round(max(s[1] - s[0] for s in spans.spans if s[2] == lab) / 1e3, 1),
            ]
            for lab in sorted({s[2] for s in spans.spans})
        },
    }


def captured_steps(torch: Any, body: Any) -> tuple[Any, Any]:
    """Capture body() in a CUDA graph; return (step, raw step): replay and copy the tokens back (a sync).

    The raw step replays through torch's own CUDAGraph.replay, around the light agent's hook.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            body()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        tokens = body()
    host = torch.empty_like(tokens, device="cpu").pin_memory()
    original = getattr(type(g).replay, "__wrapped__", None) or type(g).replay

    def step() -> Any:
        g.replay()
        host.copy_(tokens)  # the step's tokens back to the host: a sync, as in an engine
        return host

    def raw_step() -> Any:
        original(g)
        host.copy_(tokens)
        return host

    return step, raw_step


def gpu_workloads(light: bool, seconds: float) -> dict[str, Any]:
    try:
        import torch
    except Exception as exc:
        return {"skipped": f"torch not importable ({type(exc).__name__}: {exc}): GPU workloads skipped"}
    if not torch.cuda.is_available():
        return {"skipped": "torch has no CUDA device here: GPU workloads skipped"}
    out: dict[str, Any] = {}
    ws = [
        torch.randn(HIDDEN, HIDDEN, device="cuda", dtype=torch.float16) * 0.005 for _ in range(8)
    ]  # no fp16 overflow over 200 residual layers
    cls = engine_class(light)
    for batch in (1, 8):
        x = torch.randn(batch, HIDDEN, device="cuda", dtype=torch.float16)

        def body(x: Any = x) -> Any:
            for i in range(LAYERS):
                y = torch.relu(x @ ws[i % 8]) * 0.5
                x = x + y
            return x.argmax(-1)

        decode_step, raw_step = captured_steps(torch, body)
        engine = cls(batch, decode_step)
        out[f"decode_b{batch}"] = timed_loop(call_step(engine), seconds)
        # the same step without the wrapper and the replay hook, side by side in this process (in a
        # process without the agent both sides are the bare step: an A/A, and the same work and time)
        bare = Engine(batch, raw_step)
        out[f"decode_b{batch}_same_process"] = interleaved(call_step(bare), call_step(engine), seconds)
        # Which part costs: the replay hook alone (no step wrapper), the step wrapper alone (replay unhooked).
        hook_only = Engine(batch, decode_step)
        out[f"decode_b{batch}_hook_only_same_process"] = interleaved(
            call_step(bare), call_step(hook_only), seconds
        )
        wrapper_only = cls(batch, raw_step)
        out[f"decode_b{batch}_wrapper_only_same_process"] = interleaved(
            call_step(bare), call_step(wrapper_only), seconds
        )
    out.update(big_decode(torch, cls, seconds))
    small = torch.zeros(16, device="cuda")

    def eager() -> None:
        for _ in range(256):
            small.add_(1.0)
        torch.cuda.synchronize()

    r = timed_loop(eager, seconds)
    r["kernels_per_s"] = r["per_s"] * 256
    out["eager"] = r
    # the launch-bound loop as an eager engine's step, bare against the step wrapper, side by side
    out["eager_same_process"] = interleaved(call_step(Engine(1, eager)), call_step(cls(1, eager)), seconds)
    return out


def llama8b_step(torch: Any, wrap: Any = None) -> tuple[Any, Any, list[Any]]:
    """Capture a decode step of a Llama-3-8B-shaped model at batch 1 (32 layers, 7.0 B bf16 weights:
    14 GB read a step); return (step, raw step, the weights: clear them to free the memory).
    wrap(body) -> body: what is captured around the step (bench/light_agent_periods.py's stamps)."""
    hidden, ffn, layers, kv = 4096, 14336, 32, 1024

    def w(rows: int, cols: int) -> Any:
        return torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16) * 0.01

    ws = [
        (w(hidden, hidden + 2 * kv), w(hidden, hidden), w(hidden, 2 * ffn), w(ffn, hidden))
        for _ in range(layers)
    ]
    x = torch.randn(1, hidden, device="cuda", dtype=torch.bfloat16)

    def body(x: Any = x) -> Any:
        for qkv, o, gate_up, down in ws:
            q = (x @ qkv)[:, :hidden]
            x = x + (q @ o) * 0.01
            g, u = (x @ gate_up).chunk(2, dim=-1)
            x = x + (torch.nn.functional.silu(g) * u) @ down * 0.01
        return x.argmax(-1)

    step, raw_step = captured_steps(torch, wrap(body) if wrap is not None else body)
    return step, raw_step, ws


def big_decode(torch: Any, cls: Any, seconds: float) -> dict[str, Any]:
    """Time a decode step of a Llama-3-8B-shaped model at batch 1 (llama8b_step)."""
    out: dict[str, Any] = {}
    step, raw_step, ws = llama8b_step(torch)
    engine = cls(1, step)
    out["decode_8b"] = timed_loop(call_step(engine), seconds)
    out["decode_8b_same_process"] = interleaved(
        call_step(Engine(1, raw_step)), call_step(engine), seconds, block=4
    )
    ws.clear()  # free the 14 GB of weights before the next workload
    torch.cuda.empty_cache()
    return out


def agent_thread_cpu_s() -> float | None:
    """Return the CPU seconds the agent's thread (boundwatch-agent) has used so far; None if it has none."""
    total = None
    for t in threading.enumerate():
        if t.name != "boundwatch-agent" or t.ident is None:
            continue
        try:
            total = (total or 0.0) + time.clock_gettime(time.pthread_getcpuclockid(t.ident))
        except OSError:
            continue
    return total


def child(mode: str, seconds: float) -> dict[str, Any]:
    res: dict[str, Any] = {"mode": mode, "pid": os.getpid()}
    light = mode == "light"
    spans = Spans()  # what overlapped each pause: collections (either mode), the agent's ticks and swaps
    gc.callbacks.append(spans.on_gc)
    if light:
        sys.path.insert(0, ROOT)
        from exporter import agent

        res["agent_state"] = agent.start(role="generic")  # before torch: the hooks see every capture
        a = agent.current()
        if a is not None:
            spans.watch_agent(a)
    started = time.monotonic()
    res["gpu"] = gpu_workloads(light, seconds)
    if "skipped" in res["gpu"]:
        print(res["gpu"]["skipped"], file=sys.stderr, flush=True)
    # after an engine-like loop (hundreds of steps a second): what the agent's thread adds there
    res["pause_after_decode"] = pause_attributed(min(seconds, 3.0), spans)

    def cpu_body() -> int:
        return sum(range(200))

    # no step wrapper at all: what the process alone differs by
    res["plain_cpu"] = timed_loop(cpu_body, seconds)
    res["cpu_steps"] = timed_loop(call_step(engine_class(light)(8, cpu_body)), seconds)
    res["cpu_steps_same_process"] = interleaved(
        call_step(Engine(8, cpu_body)), call_step(engine_class(light)(8, cpu_body)), seconds
    )
    res["pause"] = pause_attributed(min(seconds, 5.0), spans)
    if light:
        from exporter import agent

        a = agent.current()
        res["agent"] = a.describe() if a is not None else None
        cpu = agent_thread_cpu_s()  # the most of the GIL the agent's thread can have taken from the workloads
        wall = time.monotonic() - started
        res["agent_thread"] = {
            "cpu_s": round(cpu, 6) if cpu is not None else None,
            "wall_s": round(wall, 2),
            "cpu_pct": round(100 * cpu / wall, 4) if cpu is not None else None,
        }
        res["agent_mode"] = getattr(a, "mode", "")
        agent.stop()
    return res


class Listener:
    """The sidecar's end of the agent socket: receive and count datagrams on a thread."""

    def __init__(self, path: str) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.exists(path):
            os.unlink(path)
        self.path, self.count, self.bytes = path, 0, 0
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.settimeout(0.2)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.bytes += len(self.sock.recv(65536))
                self.count += 1
            except TimeoutError:
                continue
            except OSError:
                return

    def close(self) -> None:
        self._stop.set()
        self.thread.join(1.0)
        self.sock.close()
        os.unlink(self.path)


def timed_loops(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Return a child's timed loops (calls per second) by workload: the GPU ones, cpu_steps, plain_cpu."""
    loops = {k: v for k, v in run.get("gpu", {}).items() if isinstance(v, dict) and "per_s" in v}
    loops.update({k: run[k] for k in ("cpu_steps", "plain_cpu") if isinstance(run.get(k), dict)})
    return loops


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Return light/none throughput ratios (of medians over rounds) and the pauses added."""
    by: dict[str, dict[str, list[dict[str, Any]]]] = {"none": {}, "light": {}}
    for r in runs:
        if "error" in r:
            continue
        loads = timed_loops(r)
        for name, v in loads.items():
            by[r["mode"]].setdefault(name, []).append(v)
        by[r["mode"]].setdefault("pause", []).append(r["pause"])  # after the CPU-step flood (~250k steps/s)
        by[r["mode"]].setdefault("pause_after_decode", []).append(r["pause_after_decode"])
    out: dict[str, Any] = {}
    same: dict[str, list[dict[str, Any]]] = {}
    for r in runs:  # a process without the agent ran the same pairs, bare against bare: the A/A beside
        if "error" in r:
            continue
        aa = "" if r.get("mode") == "light" else "_aa"
        for name, v in {
            **r.get("gpu", {}),
            "cpu_steps_same_process": r.get("cpu_steps_same_process"),
        }.items():
            if name.endswith("_same_process") and isinstance(v, dict):
                same.setdefault(name + aa, []).append(v)
    for name, vs in same.items():
        out[name] = {
            "cost_pct_median": round(statistics.median(v["cost_pct"] for v in vs), 4),
            "added_us_median": round(statistics.median(v["added_us"] for v in vs), 3),
            "raw_us_median": round(statistics.median(v["raw_us"] for v in vs), 3),
            "processes": len(vs),
        }
        if all("added_us_mean" in v for v in vs):
            out[name]["added_us_mean"] = round(statistics.median(v["added_us_mean"] for v in vs), 3)
            out[name]["cost_pct_mean"] = round(statistics.median(v["cost_pct_mean"] for v in vs), 4)
    threads = [
        r["agent_thread"]["cpu_pct"] for r in runs if (r.get("agent_thread") or {}).get("cpu_pct") is not None
    ]
    if threads:  # the agent thread's CPU over the child's life: an upper bound of its GIL share
        out["agent_thread_cpu_pct"] = {"median": round(statistics.median(threads), 4), "max": max(threads)}
    nones = [r for r in runs if r.get("mode") == "none" and "error" not in r]
    if len(nones) >= 2:  # the noise floor: two processes of the same code
        a, b = nones[0], nones[1]
        la, lb = timed_loops(a), timed_loops(b)
        out["noise_none_vs_none"] = {k: round(lb[k]["per_s"] / la[k]["per_s"], 4) for k in la if k in lb}
    for name, none_runs in by["none"].items():
        light_runs = by["light"].get(name)
        if not light_runs:
            continue
        if name.startswith("pause"):
            n_max = max(p["max_us"] for p in none_runs)
            worst = max(light_runs, key=lambda p: p["max_us"])
            l_max = worst["max_us"]
            out[name] = {"none_max_us": n_max, "light_max_us": l_max, "added_us": round(l_max - n_max, 1),
                         "goal_us": 100.0, "light_top": worst.get("top", [])[:4]}  # fmt: skip
            continue
        n = statistics.median(v["per_s"] for v in none_runs)
        li = statistics.median(v["per_s"] for v in light_runs)
        out[name] = {
            "none_per_s": round(n, 1),
            "light_per_s": round(li, 1),
            "ratio": round(li / n, 5) if n else None,
            "cost_pct": round(100 * (1 - li / n), 3) if n else None,
            "none_max_step_us": max(v["max_us"] for v in none_runs),
            "light_max_step_us": max(v["max_us"] for v in light_runs),
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=False, default="")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--child", default="")
    ap.add_argument(
        "--agent-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a BOUNDWATCH_AGENT_* setting for the children (the bench's own environment's are dropped)",
    )
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.seconds)), flush=True)
        return 0
    if not args.out:
        ap.error("--out is required")
    sys.path.insert(0, ROOT)
    from bench.agent_common import run_fresh

    agent_env = dict(kv.split("=", 1) for kv in args.agent_env if "=" in kv)
    if any(not k.startswith("BOUNDWATCH_AGENT_") for k in agent_env) or len(agent_env) != len(args.agent_env):
        ap.error("--agent-env takes BOUNDWATCH_AGENT_<NAME>=<value>")
    listener = Listener(f"/tmp/bwbench/light-overhead-{os.getpid()}.sock")
    order: list[str] = []
    for i in range(args.rounds):
        order += ["none", "light"] if i % 2 == 0 else ["light", "none"]
    runs = []
    try:
        for mode in order:
            t = time.perf_counter()
            r = run_fresh(__file__, "mode", mode, ["--seconds", str(args.seconds)], agent_env, listener.path)
            r["child_seconds"] = round(time.perf_counter() - t, 1)
            runs.append(r)
            print(mode, json.dumps(r.get("gpu", {}).get("skipped") or "gpu ran"), flush=True)
    finally:
        listener.close()
    summary = summarise(runs)
    result = {"order": order, "agent_env": agent_env, "runs": runs, "summary": summary, "messages_received": listener.count,
              "bytes_received": listener.bytes, "layers": LAYERS, "hidden": HIDDEN}  # fmt: skip
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=2)
    for name, s in summary.items():
        print(f"{name:10s} {json.dumps(s)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
