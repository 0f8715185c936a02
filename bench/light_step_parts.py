"""Where the light agent's per-step cost goes on a GPU decode step: each part alone, paired, in one process.

`bench/light_agent_overhead.py` measured the light step wrapper at 3-14 us a step on H200 decode
steps against 0.5-1.2 us for the same code around a CPU-only step, with a resolution of about
+-1.5 us. This bench takes the wrapper apart on the same captured graph, in one process with the
light agent running (its thread, its tracker), each variant against the bare step:

- aa: the bare step against another bare step (the resolution of the measure);
- frame: a plain Python pass-through wrapper (one more frame, *args / **kwargs);
- frame_self: the same taking only self (the signature wrap_step now gives vLLM's step);
- frame_time_ns: the same with two time.time_ns() reads;
- wrap_fast: the plugin's wrap_step with the engine's thread never handing over (the per-step path
  alone; the agent's thread hands over);
- wrap_time_all: wrap_step timing every step (session 5's shipped behaviour; session 5 also measured
  the engine's thread handing over every 10 ms / 100 ms: bench/README.md);
- wrap_shipped: wrap_step as shipped now (the agent's thread hands over at its tick, every 0.5 s;
  every step counted, one in plugins.TIME_EVERY timed);
- hook: the bare step replaying through the light CUDAGraph hook;
- light: wrap_step as shipped with the hooked replay;
- vllm_light: the vLLM plugin's own EngineCore patch (scheduler patched at the first step, no
  frame of its own) with the hooked replay.

Those variants keep their hooks in all the time (the switch stopped: exporter.agent.switch), so
each is a part's full cost. The sampled ones run as shipped, the agent's thread swapping the hooks
in for hook_share of each tick and out between:

- light_sampled: the step hook through the switch (plugins.hook_step) with the sampled replay hook;
- vllm_sampled: the vLLM plugin's EngineCore patch with the sampled replay hook: what a vLLM
  engine core runs.

Every step is called through an attribute lookup at each call (light_agent_overhead.call_step), as
vLLM's step_fn is, so a hook swapped out of the class is out of the step.

Pairs of blocks (bare, variant) alternate their order; the result per variant is the median of the
paired per-step differences with a distribution-free 95% interval of that median (order statistics),
and the same as a share of the bare step; and their mean with a normal 95% interval (the figure for
the sampled variants, whose hooks are in for one block in eight: a median skips those). It also times the clock reads themselves and names the
machine's clocksource (a clock read that leaves the vDSO costs microseconds in a VM).

    python bench/light_step_parts.py --out /tmp/light_parts.json [--seconds 5] [--only cpu,b1,8b]
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))


def median_ci(diffs: list[float]) -> tuple[float, float, float]:
    """Return the median of diffs and a distribution-free ~95% interval for it (binomial order statistics)."""
    xs = sorted(diffs)
    n = len(xs)
    if n == 0:
        return math.nan, math.nan, math.nan
    half = 1.96 * math.sqrt(n) / 2
    lo = max(0, math.floor(n / 2 - half))
    hi = min(n - 1, math.ceil(n / 2 + half))
    return statistics.median(xs), xs[lo], xs[hi]


def paired(raw: Any, variant: Any, seconds: float, block: int) -> dict[str, Any]:
    """Alternate blocks of raw() and variant(); return the per-step paired difference in us."""
    for _ in range(10):
        raw()
        variant()
    diffs: list[float] = []
    raws: list[float] = []
    t_end = time.perf_counter() + seconds
    i = 0
    while time.perf_counter() < t_end:
        got = {}
        order = (("raw", raw), ("var", variant)) if i % 2 == 0 else (("var", variant), ("raw", raw))
        for name, fn in order:
            a = time.perf_counter_ns()
            for _ in range(block):
                fn()
            got[name] = (time.perf_counter_ns() - a) / block / 1e3
        diffs.append(got["var"] - got["raw"])
        raws.append(got["raw"])
        i += 1
    med, lo, hi = median_ci(diffs)
    raw_us = statistics.median(raws)
    # The mean, for the sampled variants: their hooks are in for 1/8 of the blocks, which a median skips.
    mean = statistics.fmean(diffs)
    half = 1.96 * statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else math.nan
    return {
        "pairs": len(diffs),
        "block_steps": block,
        "raw_step_us": round(raw_us, 2),
        "added_us": round(med, 3),
        "added_us_ci95": [round(lo, 3), round(hi, 3)],
        "cost_pct": round(100 * med / raw_us, 4),
        "cost_pct_ci95": [round(100 * lo / raw_us, 4), round(100 * hi / raw_us, 4)],
        "added_us_mean": round(mean, 3),
        "added_us_mean_ci95": [round(mean - half, 3), round(mean + half, 3)],
        "cost_pct_mean": round(100 * mean / raw_us, 4),
    }


def clock_costs() -> dict[str, Any]:
    """Return ns per call of the clocks the agent may read, and the kernel's clocksource."""
    out: dict[str, Any] = {}
    for name in ("time_ns", "perf_counter_ns", "monotonic_ns"):
        fn = getattr(time, name)
        best = math.inf
        for _ in range(5):
            a = time.perf_counter_ns()
            for _ in range(100_000):
                fn()
            best = min(best, (time.perf_counter_ns() - a) / 100_000)
        out[name + "_ns"] = round(best, 1)
    try:
        with open("/sys/devices/system/clocksource/clocksource0/current_clocksource") as fh:
            out["clocksource"] = fh.read().strip()
        with open("/sys/devices/system/clocksource/clocksource0/available_clocksource") as fh:
            out["available"] = fh.read().strip()
    except OSError as exc:
        out["clocksource"] = f"unreadable: {exc}"
    return out


def variants(raw_step: Any, hooked_step: Any, batch: int, sampled: bool) -> dict[str, Any]:
    """Return name -> a step callable for every variant, over the same captured graph.

    sampled False: the parts, each with its hooks in for good; True: the hooks as shipped (sampled).
    """
    import light_agent_overhead as lao

    from exporter.agent import plugins
    from exporter.agent.switch import SWITCHED

    batch_of = lambda core, n: (core.scheduler.batch * n, core.scheduler.batch * n)  # noqa: E731

    def wrap(period_ns: int, body: Any, time_every: int = plugins.TIME_EVERY) -> Any:
        cls = type("EngineCore", (lao.Engine,), {})
        step = plugins.wrap_step(
            lao.Engine.step, "vllm", batch_of, plugins.vllm_counts, sample_ns=period_ns, time_every=time_every
        )
        setattr(
            step, SWITCHED, True
        )  # installed by hand but counted here as a part: not a hold on the switch
        cls.step = step  # type: ignore[method-assign]
        return lao.call_step(cls(batch, body))

    def hooked(body: Any) -> Any:
        cls = type("EngineCore", (lao.Engine,), {"step": lao.Engine.step})
        plugins.hook_step(cls, "step", "vllm", batch_of, plugins.vllm_counts)
        return lao.call_step(cls(batch, body))

    def vllm_patched(body: Any) -> Any:
        import types

        cls = type("EngineCore", (lao.Engine,), {"step": lao.Engine.step})
        plugins._patched.discard("vllm_engine")  # once per process otherwise; one class per workload here
        plugins._patch_vllm_engine_core(types.SimpleNamespace(EngineCore=cls))
        return lao.call_step(cls(batch, body))

    if sampled:
        return {"aa_sampled": lao.call_step(lao.Engine(batch, raw_step)), "light_sampled": hooked(hooked_step),
                "vllm_sampled": vllm_patched(hooked_step)}  # fmt: skip

    def frame(clock: Any = None, only_self: bool = False) -> Any:
        inner = lao.Engine.step

        if only_self:

            def w(self: Any) -> Any:
                return inner(self)
        elif clock is None:

            @functools.wraps(inner)
            def w(self: Any, *args: Any, **kwargs: Any) -> Any:
                return inner(self, *args, **kwargs)
        else:

            @functools.wraps(inner)
            def w(self: Any, *args: Any, **kwargs: Any) -> Any:
                t0 = clock()
                r = inner(self, *args, **kwargs)
                t1 = clock()
                acc[0] += t1 - t0
                return r

        acc = [0]
        cls = type("EngineCore", (lao.Engine,), {"step": w})
        return lao.call_step(cls(batch, raw_step))

    return {
        "aa": lao.call_step(lao.Engine(batch, raw_step)),
        "frame": frame(),
        "frame_self": frame(only_self=True),
        "frame_time_ns": frame(time.time_ns),
        "wrap_fast": wrap(10**15, raw_step),
        "wrap_time_all": wrap(0, raw_step, time_every=1),
        "wrap_shipped": wrap(0, raw_step),
        "hook": lao.call_step(lao.Engine(batch, hooked_step)),
        "light": wrap(0, hooked_step),
        "vllm_light": vllm_patched(hooked_step),
    }


def run(seconds: float, only: set[str]) -> dict[str, Any]:
    from exporter import agent

    res: dict[str, Any] = {"agent_state": agent.start(role="generic")}  # before torch, as an engine would
    res["clocks"] = clock_costs()
    import light_agent_overhead as lao

    if "cpu" in only:  # the same variants around a pure-Python step: runs anywhere
        res["cpu_step"] = measure(
            lambda: sum(range(200)), lambda: sum(range(200)), 8, 200, seconds, "cpu_step"
        )

    try:
        import torch
    except ImportError as exc:
        res["skipped"] = f"torch not importable: {exc}"
        return res
    if not torch.cuda.is_available():
        res["skipped"] = "no CUDA device"
        return res
    res["torch"] = torch.__version__
    res["gpu"] = torch.cuda.get_device_name(0)
    ws = [torch.randn(lao.HIDDEN, lao.HIDDEN, device="cuda", dtype=torch.float16) * 0.005 for _ in range(8)]
    loads: dict[str, Any] = {}
    if "b1" in only:
        x = torch.randn(1, lao.HIDDEN, device="cuda", dtype=torch.float16)

        def body(x: Any = x) -> Any:
            for i in range(lao.LAYERS):
                y = torch.relu(x @ ws[i % 8]) * 0.5
                x = x + y
            return x.argmax(-1)

        hooked, raw = lao.captured_steps(torch, body)
        loads["decode_b1"] = (hooked, raw, 1, 8)
    if "8b" in only:
        hooked, raw, _weights = lao.llama8b_step(torch)
        loads["decode_8b"] = (hooked, raw, 1, 4)
    for name, (hooked, raw, batch, block) in loads.items():
        res[name] = measure(hooked, raw, batch, block, seconds, name)
    a = agent.current()
    res["agent"] = a.describe() if a is not None else None
    agent.stop()
    return res


def measure(hooked: Any, raw: Any, batch: int, block: int, seconds: float, name: str) -> dict[str, Any]:
    """Return variant -> its paired cost against the bare step over raw."""
    import light_agent_overhead as lao

    from exporter.agent.switch import SWITCH

    bare = lao.call_step(lao.Engine(batch, raw))
    rows = {}
    for sampled in (False, True):
        if sampled:
            rows["switch"] = {"cycling": SWITCH.start_cycle(), "held": SWITCH.held}
            time.sleep(
                1.0
            )  # the agent's thread, in a plain wait while the switch was stopped, picks the cycle up
        else:
            SWITCH.stop_cycle()  # every hook in for good: each part's full cost
        for vname, fn in variants(raw, hooked, batch, sampled).items():
            rows[vname] = paired(bare, fn, seconds, block)
            print(name, vname, json.dumps(rows[vname]), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=5.0, help="per variant and workload")
    ap.add_argument(
        "--only",
        default="cpu,b1,8b",
        help="workloads: cpu (a pure-Python step), b1 (1.4 ms, ~800 kernels), 8b (Llama-3-8B step)",
    )
    args = ap.parse_args()
    os.environ.setdefault("BOUNDWATCH_AGENT_SOCKET", f"/tmp/bwbench/parts-{os.getpid()}.sock")
    res = run(args.seconds, set(args.only.split(",")))
    with open(args.out, "w") as fh:
        json.dump(res, fh, indent=2)
    print(json.dumps(res.get("clocks")))
    for load in ("cpu_step", "decode_b1", "decode_8b"):
        for vname, r in res.get(load, {}).items():
            if vname == "switch":
                continue
            print(
                f"| {load} | {vname} | {r['raw_step_us']} | {r['added_us']} {r['added_us_ci95']} | {r['cost_pct']}% "
                f"| {r['added_us_mean']} {r['added_us_mean_ci95']} | {r['cost_pct_mean']}% |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
