"""What the status page costs: one render of `/` from the history, beside one render of `/metrics`.

    python bench/status_page.py --out bench/results/status_page.json

Histories come from the demo's sources through the real Sampler and pipeline on a stepped clock
(0.5 s ticks, no sleeping): 240 Snapshots x 8 GPUs is the default window (120 s) on an 8-GPU host.
Also timed: 1 and 64 GPUs (the page draws 16), a worst case whose verdict flips every tick, and a
one-hour history (7,200 Snapshots, sampled down to 300 columns). Each case times (wall, and this
process's CPU time, which holds on a contended machine) the page's render,
its size plain and gzipped, and beside it, in the same run, the `/metrics` render of the newest
Snapshot and a cached hit of the page (what every other view in the same tick costs): median and p90
of `--repeat` rounds in which the cases take turns, so that all of them see the same load.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gzip
import itertools
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client import generate_latest

from exporter.commands.demo import World, demo_sources
from exporter.config import Config
from exporter.sampling import Sampler
from exporter.serve import statuspage
from exporter.serve.web import PageCache, make_registry
from exporter.snapshot import Snapshot


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _summary(runs: list[float]) -> dict[str, float]:
    runs = sorted(runs)
    return {"median_ms": statistics.median(runs), "p90_ms": runs[int(0.9 * (len(runs) - 1))]}


def _ms(fn: Callable[[], object]) -> tuple[float, float]:
    """Return (wall ms, this process's CPU ms) of one call: on a contended machine the CPU figure holds."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return (time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3


async def demo_sampler(gpus: int, ticks: int, history_seconds: float) -> tuple[Sampler, Config, Clock]:
    """Return a Sampler that has ticked the demo's GPUs `ticks` times (a stepped clock, 0.5 s a tick)."""
    clock = Clock()
    cfg = dataclasses.replace(Config(), history_seconds=history_seconds)
    world = World(gpus=gpus, phase_seconds=20.0, clock=clock)
    sampler = Sampler(cfg, demo_sources(world, cfg), clock=clock)
    for _ in range(ticks):
        await sampler.tick()
        clock.t += cfg.tick_seconds
    return sampler, cfg, clock


def flapping(history: Sequence[Snapshot]) -> list[Snapshot]:
    """Return the history with each GPU's verdict flipping between GPU-bound and host-bound every tick."""
    out = []
    for i, snap in enumerate(history):
        verdicts = tuple(
            dataclasses.replace(v, verdict="gpu", reasons=())
            if (i + v.gpu) % 2
            else dataclasses.replace(v, verdict="host", reasons=("api_server_saturated", "step_overhead"))
            for v in snap.verdicts
        )
        out.append(dataclasses.replace(snap, verdicts=verdicts))
    return out


def render(history: Sequence[Snapshot], cfg: Config, now: float) -> str:
    """Render the page as the web app does."""
    return statuspage.render(
        history, version="bench", window=cfg.history_seconds, now=now, stale_after=5.0, banner="bench"
    )


@dataclasses.dataclass
class Case:
    """One history and what is timed on it."""

    name: str
    gpus: int
    history: Sequence[Snapshot]
    page: Callable[[], str]
    cached: Callable[[], bytes]
    metrics: Callable[[], bytes]
    times: dict[str, list[float]] = dataclasses.field(default_factory=dict)

    def add(self, name: str, wall_cpu: tuple[float, float]) -> None:
        """Keep one timing: wall under `name`, CPU under `name`_cpu."""
        self.times.setdefault(name, []).append(wall_cpu[0])
        self.times.setdefault(f"{name}_cpu", []).append(wall_cpu[1])


async def build(name: str, gpus: int, ticks: int, history_seconds: float, flap: bool) -> Case:
    """Return a case: the demo's history (flipping verdicts when `flap`), its page, cache and /metrics."""
    sampler, cfg, clock = await demo_sampler(gpus, ticks, history_seconds)
    history: Sequence[Snapshot] = sampler.history()
    if flap:
        history = flapping(history)
    registry = make_registry(sampler, cfg)
    cache = PageCache(registry, sampler, cfg.tick_seconds)

    def page() -> str:
        return render(history, cfg, clock.t)

    def cached() -> bytes:
        return cache.get("text/html", lambda _r: page().encode(), False)

    return Case(name, gpus, history, page, cached, lambda: generate_latest(registry))


def report(c: Case) -> dict:
    """Return a case's figures."""
    page = c.page().encode()
    out = {
        "case": c.name,
        "gpus": c.gpus,
        "gpus_drawn": min(c.gpus, statuspage.MAX_GPUS),
        "snapshots": len(c.history),
        "verdict_changes_gpu0": sum(
            1 for a, b in itertools.pairwise(c.history) if a.verdicts[0].verdict != b.verdicts[0].verdict
        ),
        **{k: _summary(v) for k, v in c.times.items()},
        "page_bytes": len(page),
        "page_gzip_bytes": len(gzip.compress(page, compresslevel=6)),
        "metrics_bytes": len(c.metrics()),
    }
    out["page_over_metrics"] = out["page_render"]["median_ms"] / out["metrics_render"]["median_ms"]
    out["page_over_metrics_cpu"] = (
        out["page_render_cpu"]["median_ms"] / out["metrics_render_cpu"]["median_ms"]
    )
    return out


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=60)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    specs = [
        ("240 x 8 GPUs (the default window on an 8-GPU host)", 8, 241, 120.0, False),
        ("240 x 1 GPU", 1, 241, 120.0, False),
        ("240 x 64 GPUs (16 drawn)", 64, 241, 120.0, False),
        ("240 x 8 GPUs, verdict flipping every tick", 8, 241, 120.0, True),
        ("7,200 x 8 GPUs (history_seconds = 3600, 300 drawn)", 8, 7201, 3600.0, False),
    ]
    cases = [await build(*spec) for spec in specs]
    load0 = os.getloadavg()
    for _ in range(args.repeat):  # round-robin: every case sees the same load
        for c in cases:
            c.add("page_render", _ms(c.page))
            c.add("page_cached_hit", _ms(c.cached))
            c.add("metrics_render", _ms(c.metrics))
    results = [report(c) for c in cases]
    for r in results:
        print(
            f"{r['case']}: page {r['page_render']['median_ms']:.2f} ms (p90 {r['page_render']['p90_ms']:.2f}; "
            f"CPU {r['page_render_cpu']['median_ms']:.2f}), /metrics CPU {r['metrics_render_cpu']['median_ms']:.2f} ms, "
            f"cached {r['page_cached_hit']['median_ms'] * 1e3:.1f} us, "
            f"/metrics {r['metrics_render']['median_ms']:.2f} ms, "
            f"{r['page_bytes'] / 1024:.1f} KiB ({r['page_gzip_bytes'] / 1024:.1f} KiB gzip)"
        )
    out = {
        "bench": "status_page",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_before": load0,
            "load_after": os.getloadavg(),
        },
        "repeat": args.repeat,
        "cases": results,
    }
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
