"""NVML tick on a real GPU: values while idle and under known loads, and the CPU one tick costs.

    python bench/nvml_tick.py [--out bench/results/nvml_tick.json]

Runs the real NVML and host sources through the real Sampler (0.5 s ticks). The load runs in a
separate torch process, as an engine would: phases idle, bf16 matmul back to back (~100% busy), and
a 50% duty cycle (2 ms of matmul, 2 ms of sleep). Prints one line per tick and writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import platform
import statistics
import time
from pathlib import Path

from exporter.config import Config
from exporter.sampling import Sampler
from exporter.sources.host import HostSource
from exporter.sources.nvml import NvmlSource

PHASES = (("idle", 4.0), ("matmul_100", 5.0), ("duty_50", 5.0), ("idle_after", 3.0))


def load_process(phase_q: mp.Queue, ready: mp.Event) -> None:  # runs in the child
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    small = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    ready.set()
    phase = "idle"
    while phase != "stop":
        while not phase_q.empty():
            phase = phase_q.get()
        if phase == "matmul_100":
            for _ in range(20):
                a @ b
            torch.cuda.synchronize()
        elif phase == "duty_50":
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < 0.002:
                small @ small
                torch.cuda.synchronize()
            time.sleep(0.002)
        else:
            time.sleep(0.01)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results/nvml_tick.json")
    args = parser.parse_args()
    cfg = Config()
    sampler = Sampler(cfg, [NvmlSource(cfg.nvml), HostSource(cfg.host)])
    ctx = mp.get_context("spawn")
    phase_q, ready = ctx.Queue(), ctx.Event()
    child = ctx.Process(target=load_process, args=(phase_q, ready), daemon=True)
    child.start()
    ready.wait(120)
    rows = []
    for phase, seconds in PHASES:
        phase_q.put(phase)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            cpu0, wall0 = time.process_time(), time.perf_counter()
            snap = await sampler.tick()
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            for g in snap.gpus:
                row = {
                    "phase": phase,
                    "seq": snap.seq,
                    "gpu": g.index,
                    "power_w": g.power_watts,
                    "power_limit_w": g.power_limit_watts,
                    "energy_j": g.energy_joules,
                    "sm_clock_mhz": g.sm_clock_hz / 1e6 if g.sm_clock_hz else None,
                    "sm_clock_max_mhz": g.sm_clock_max_hz / 1e6 if g.sm_clock_max_hz else None,
                    "clock_events": [k for k, v in g.clock_events().items() if v],
                    "util": g.utilization,
                    "gpm_graphics": g.gpm.graphics if g.gpm else None,
                    "gpm_sm": g.gpm.sm if g.gpm else None,
                    "gpm_sm_occupancy": g.gpm.sm_occupancy if g.gpm else None,
                    "gpm_tensor": g.gpm.tensor if g.gpm else None,
                    "gpm_dram": g.gpm.dram if g.gpm else None,
                    "tick_cpu_ms": cpu * 1e3,
                    "tick_wall_ms": wall * 1e3,
                    "nvml_read_ms": snap.source("nvml").duration_seconds * 1e3,
                    "errors": list(g.errors),
                }
                rows.append(row)
                print(
                    f"{phase:11s} tick {snap.seq:3d} P={row['power_w'] or 0:6.1f}W SM={row['sm_clock_mhz'] or 0:5.0f}MHz "
                    f"util={row['util'] or 0:.2f} gpm.gr={row['gpm_graphics'] or 0:.3f} gpm.sm={row['gpm_sm'] or 0:.3f} "
                    f"events={','.join(row['clock_events']) or '-'} cpu={row['tick_cpu_ms']:.2f}ms",
                    flush=True,
                )
            await asyncio.sleep(max(0.0, cfg.tick_seconds - wall))
    phase_q.put("stop")
    child.join(10)
    sampler.close()
    summary = {}
    for phase, _ in PHASES:
        sel = [r for r in rows if r["phase"] == phase][2:]  # skip the ramp
        if not sel:
            continue
        summary[phase] = {
            k: statistics.median([r[k] for r in sel if r[k] is not None] or [float("nan")])
            for k in (
                "power_w",
                "sm_clock_mhz",
                "util",
                "gpm_graphics",
                "gpm_sm",
                "tick_cpu_ms",
                "nvml_read_ms",
            )
        }
    cpus = [r["tick_cpu_ms"] for r in rows]
    result = {
        "machine": platform.node(),
        "gpu": rows[0]["gpu"] if rows else None,
        "tick_cpu_ms_median": statistics.median(cpus) if cpus else None,
        "tick_cpu_ms_p99": sorted(cpus)[int(0.99 * (len(cpus) - 1))] if cpus else None,
        "summary": summary,
        "ticks": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "ticks"}, indent=1))


if __name__ == "__main__":
    asyncio.run(main())
