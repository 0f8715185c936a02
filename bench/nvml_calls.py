"""What each NVML call of a tick costs on a real GPU, and the whole tick's read through NvmlSource.

Times every call `exporter/sources/nvml.py` makes per tick (CPU time and wall time, median and p99
over `--reps` calls), the same values through one `nvmlDeviceGetFieldValues` batch, and
`NvmlSource.read_blocking()` itself (the daemon's per-tick NVML cost), so a change to the source
can be judged by the numbers it moves.

    python3 bench/nvml_calls.py --out bench/results/nvml_calls_h200.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def timed(fn: Callable[[], Any], reps: int) -> dict[str, Any]:
    """Return the median and p99 CPU and wall microseconds of fn over reps calls, or its error."""
    cpu, wall = [], []
    try:
        fn()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    for _ in range(reps):
        c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
        fn()
        cpu.append((time.thread_time_ns() - c0) / 1e3)
        wall.append((time.perf_counter_ns() - w0) / 1e3)
    cpu.sort()
    wall.sort()
    return {
        "cpu_us_median": round(statistics.median(cpu), 2),
        "cpu_us_p99": round(cpu[int(0.99 * (len(cpu) - 1))], 2),
        "wall_us_median": round(statistics.median(wall), 2),
        "wall_us_p99": round(wall[int(0.99 * (len(wall) - 1))], 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=500)
    ap.add_argument("--ticks", type=int, default=100, help="reads per gpm_every_ticks value, 0.1 s apart")
    ap.add_argument("--busy-seconds", type=float, default=10.0, help="seconds of 0.5 s ticks per busy way")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    import pynvml as n

    from exporter.config import NvmlConfig
    from exporter.sources.nvml import NvmlSource

    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    calls: dict[str, Callable[[], Any]] = {
        "power": lambda: n.nvmlDeviceGetPowerUsage(h),
        "power_limit": lambda: n.nvmlDeviceGetEnforcedPowerLimit(h),
        "sm_clock": lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
        "clock_events": lambda: n.nvmlDeviceGetCurrentClocksEventReasons(h),
        "utilization": lambda: n.nvmlDeviceGetUtilizationRates(h),
        "memory": lambda: n.nvmlDeviceGetMemoryInfo(h),
        "processes": lambda: n.nvmlDeviceGetComputeRunningProcesses(h),
        "energy": lambda: n.nvmlDeviceGetTotalEnergyConsumption(h),
    }
    # NVML's own utilization samples (one per 200 ms period on the H200): their mean over a tick would
    # be the busy share without GPM, if the call were cheap; as a tick would make it (the samples of the
    # last ~0.5 s) and for the whole buffer
    _, buf = n.nvmlDeviceGetSamples(h, n.NVML_GPU_UTILIZATION_SAMPLES, 0)
    stamps = sorted(int(x.timeStamp) for x in buf)
    since = stamps[-1] - 500_000 if stamps else 0
    calls["utilization_samples_tick"] = lambda: n.nvmlDeviceGetSamples(
        h, n.NVML_GPU_UTILIZATION_SAMPLES, since
    )
    calls["utilization_samples_whole_buffer"] = lambda: n.nvmlDeviceGetSamples(
        h, n.NVML_GPU_UTILIZATION_SAMPLES, 0
    )
    steps = [b - a for a, b in itertools.pairwise(stamps)]
    sample = n.nvmlGpmSampleAlloc()
    calls["gpm_sample_get"] = lambda: n.nvmlGpmSampleGet(h, sample)
    fields = [
        getattr(n, name)
        for name in ("NVML_FI_DEV_POWER_INSTANT", "NVML_FI_DEV_POWER_AVERAGE", "NVML_FI_DEV_MEMORY_TEMP")
        if hasattr(n, name)
    ]
    if fields:
        calls["field_values_batch"] = lambda: n.nvmlDeviceGetFieldValues(h, fields)
    if hasattr(n, "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION"):  # energy through the batch call instead
        energy_field = [n.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION]
        calls["energy_field_value"] = lambda: n.nvmlDeviceGetFieldValues(h, energy_field)
    sample2 = n.nvmlGpmSampleAlloc()
    n.nvmlGpmSampleGet(h, sample)
    time.sleep(0.2)
    n.nvmlGpmSampleGet(h, sample2)
    ids = [n.NVML_GPM_METRIC_GRAPHICS_UTIL, n.NVML_GPM_METRIC_SM_UTIL, n.NVML_GPM_METRIC_SM_OCCUPANCY]
    ids += [n.NVML_GPM_METRIC_ANY_TENSOR_UTIL, n.NVML_GPM_METRIC_DRAM_BW_UTIL]

    def gpm_request() -> Any:
        req = n.c_nvmlGpmMetricsGet_t()
        req.version, req.numMetrics, req.sample1, req.sample2 = (
            n.NVML_GPM_METRICS_GET_VERSION,
            len(ids),
            sample,
            sample2,
        )
        for i, metric_id in enumerate(ids):
            req.metrics[i].metricId = metric_id
        return req

    built = gpm_request()
    calls["gpm_request_build"] = gpm_request
    calls["gpm_metrics_get_fresh_request"] = lambda: n.nvmlGpmMetricsGet(gpm_request())
    calls["gpm_metrics_get_built_once"] = lambda: n.nvmlGpmMetricsGet(built)
    # does nvmlGpmMetricsGet cost by metric? each metric alone, then the verdict's one (graphics)
    for const in ("GRAPHICS_UTIL", "SM_UTIL", "SM_OCCUPANCY", "ANY_TENSOR_UTIL", "DRAM_BW_UTIL"):
        one = n.c_nvmlGpmMetricsGet_t()
        one.version, one.numMetrics, one.sample1, one.sample2 = (
            n.NVML_GPM_METRICS_GET_VERSION,
            1,
            sample,
            sample2,
        )
        one.metrics[0].metricId = getattr(n, f"NVML_GPM_METRIC_{const}")
        calls[f"gpm_metrics_get_only_{const.lower()}"] = lambda one=one: n.nvmlGpmMetricsGet(one)
    out: dict[str, Any] = {"reps": args.reps, "calls": {k: timed(f, args.reps) for k, f in calls.items()}}
    out["utilization_samples"] = {
        "in_buffer": len(stamps),
        "period_us_median": statistics.median(steps) if steps else None,
    }
    src = NvmlSource(NvmlConfig())
    src.read_blocking()
    out["read_blocking"] = timed(src.read_blocking, max(50, args.reps // 5))
    src.close()
    # the daemon's NVML work at 0.5 s ticks for --busy-seconds each, CPU per second: the default and
    # with nvml.gpm_graphics off. The GPU is idle here, so the default asks for GRAPHICS_UTIL only
    # where SM_UTIL is above 0 (never, unless something else runs): this is an idle GPU's cost
    out["busy_ways"] = {}
    for name, cfg in (
        ("default_idle_gpu", NvmlConfig()),
        ("gpm_graphics_off", NvmlConfig(gpm_graphics=False)),
    ):
        src = NvmlSource(cfg)
        src.read_blocking()
        ticks, tick_ns, t_end = 0, 0, time.monotonic() + args.busy_seconds
        while time.monotonic() < t_end:
            time.sleep(0.5)
            c0 = time.thread_time_ns()
            src.read_blocking()
            tick_ns += time.thread_time_ns() - c0
            ticks += 1
        src.close()
        out["busy_ways"][name] = {
            "ticks": ticks,
            "tick_cpu_us_mean": round(tick_ns / max(ticks, 1) / 1e3, 1),
            "cpu_ms_per_second": round(tick_ns / 1e6 / args.busy_seconds, 3),
        }
    # nvml.gpm_every_ticks: the mean per-tick read (GPM read every Nth tick), ticks 0.1 s apart so
    # each GPM pair is a valid one (samples more than 100 ms apart)
    out["read_blocking_gpm_every_ticks"] = {}
    for every in (1, 2, 4):
        src = NvmlSource(NvmlConfig(gpm_every_ticks=every))
        src.read_blocking()
        cpu = []
        for _ in range(args.ticks):
            time.sleep(0.1)
            c0 = time.thread_time_ns()
            src.read_blocking()
            cpu.append((time.thread_time_ns() - c0) / 1e3)
        src.close()
        out["read_blocking_gpm_every_ticks"][str(every)] = {
            "ticks": len(cpu),
            "cpu_us_mean": round(statistics.fmean(cpu), 2),
            "cpu_us_median": round(statistics.median(cpu), 2),
        }
    out["driver"] = n.nvmlSystemGetDriverVersion()
    print(json.dumps(out, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
