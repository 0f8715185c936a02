"""Scrape flood: N concurrent scrapers against the real daemon with an 8-GPU page; do ticks stay at 2/s?

The daemon runs in its own process (`python -m tests.fakes.standin_daemon 8 run ...`: the NVML stand-in
with 8 GPUs, plus the vLLM fixture page as an engine), on a free loopback port. The scrapers are
asyncio tasks in this process, each on its own kept-alive connection, back to back as fast as
the daemon answers; they ask as Prometheus does (gzip; half of them OpenMetrics). An observer
reads /healthz once a second for the tick count, first `--baseline` seconds without scrapers (the
machine's own contention), then during the flood. This process runs at `--nice` 10 once the daemon
has started: real scrapers run on other hosts, not on the sidecar's cores. Everything is loopback
and every loop ends at the deadline.

    python bench/scrape_flood.py --duration 60 --out bench/results/scrape_flood.json
    python bench/scrape_flood.py --daemon-root /tmp/bw-main --duration 30   # the same on another checkout
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fakes.promserver import ENGINE_FIXTURE, _stop, _wait_http, free_port  # noqa: E402

OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def _scraper(
    session: aiohttp.ClientSession, url: str, i: int, deadline: float, out: dict[str, Any]
) -> None:
    headers = {"Accept-Encoding": "gzip", "Accept": OPENMETRICS if i % 2 else "text/plain"}
    while time.monotonic() < deadline:
        start = time.perf_counter()
        try:
            async with session.get(url, headers=headers, auto_decompress=False) as resp:
                body = await resp.read()
                if resp.status != 200:
                    out["errors"].append(f"HTTP {resp.status}")
                    continue
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            out["errors"].append(repr(exc))
            await asyncio.sleep(0.05)
            continue
        out["latency"].append(time.perf_counter() - start)
        out["bytes"].append(len(body))
        if len(out["latency"]) % 500 == 1:  # check a sample of the pages in full
            page = gzip.decompress(body) if resp.headers.get("Content-Encoding") == "gzip" else body
            if b'boundwatch_gpu_power_watts{gpu="7"}' not in page:
                out["errors"].append("page without 8 GPUs")


async def _observer(
    session: aiohttp.ClientSession, url: str, deadline: float, ticks: list[tuple[float, int]]
) -> None:
    while time.monotonic() < deadline:
        try:
            async with session.get(url) as resp:
                data = await resp.json()
                ticks.append((time.monotonic(), int(data["seq"])))
        except (aiohttp.ClientError, TimeoutError, OSError, KeyError, ValueError):
            pass
        await asyncio.sleep(1.0)


async def watch(port: int, duration: float) -> list[tuple[float, int]]:
    """Read the tick count once a second for `duration` seconds, without scrapers."""
    ticks: list[tuple[float, int]] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        url = f"http://127.0.0.1:{port}/healthz"
        await _observer(session, url, time.monotonic() + duration, ticks)
    return ticks


async def flood(port: int, scrapers: int, duration: float) -> dict[str, Any]:
    """Run the scrapers and the observer for `duration` seconds; return what they saw."""
    out: dict[str, Any] = {"latency": [], "bytes": [], "errors": []}
    ticks: list[tuple[float, int]] = []
    timeout = aiohttp.ClientTimeout(total=30)
    connector = aiohttp.TCPConnector(limit=scrapers + 1)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        deadline = time.monotonic() + duration
        base = f"http://127.0.0.1:{port}"
        tasks = [_scraper(session, f"{base}/metrics", i, deadline, out) for i in range(scrapers)]
        await asyncio.gather(_observer(session, f"{base}/healthz", deadline, ticks), *tasks)
    out["ticks"] = ticks
    return out


def _tick_rates(ticks: list[tuple[float, int]], window: float = 5.0) -> tuple[float, float]:
    """Return the tick rate over the whole run and the lowest over any `window` seconds."""
    if len(ticks) < 2:
        return float("nan"), float("nan")
    overall = (ticks[-1][1] - ticks[0][1]) / (ticks[-1][0] - ticks[0][0])
    lowest = overall
    for i, (t0, s0) in enumerate(ticks):
        for t1, s1 in ticks[i + 1 :]:
            if t1 - t0 >= window:
                lowest = min(lowest, (s1 - s0) / (t1 - t0))
                break
    return overall, lowest


def main() -> int:
    """Start the daemon, flood it, write the JSON and print a summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapers", type=int, default=200)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of flood (default 60)")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--daemon-root", type=Path, default=ROOT, help="checkout whose daemon runs")
    parser.add_argument("--out", type=Path, default=None, help="JSON results file")
    parser.add_argument(
        "--baseline", type=float, default=15.0, help="seconds of ticks watched before the flood"
    )
    parser.add_argument(
        "--nice",
        type=int,
        default=10,
        help="niceness of this load generator (real scrapers run on other hosts; default 10)",
    )
    args = parser.parse_args()
    if not 1 <= args.scrapers <= 1000 or not 1 <= args.duration <= 3600:
        parser.error("--scrapers must be 1-1000 and --duration 1-3600 s")

    workdir = Path(tempfile.mkdtemp(prefix="scrape-flood-"))
    port = free_port()
    log = workdir / "boundwatch.log"
    cmd = [
        sys.executable,
        "-m",
        "tests.fakes.standin_daemon",
        str(args.gpus),
        "run",
        "--address",
        "127.0.0.1",
    ]
    cmd += ["--port", str(port), "--agent-socket", str(workdir / "agent.sock"), "--log-format", "json"]
    cmd += ["--engine-url", str(ENGINE_FIXTURE)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOUNDWATCH_")}
    env["PYTHONPATH"] = str(args.daemon_root)
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, cwd=args.daemon_root, env=env, stdout=fh, stderr=subprocess.STDOUT)
    try:
        _wait_http(proc, f"http://127.0.0.1:{port}/metrics", log, 60.0)
        os.nice(args.nice)  # after the daemon started: it keeps the default priority
        quiet = asyncio.run(watch(port, args.baseline))
        cpu0, wall0 = _cpu_seconds(proc.pid), time.monotonic()
        seen = asyncio.run(flood(port, args.scrapers, args.duration))
        cpu1, wall1 = _cpu_seconds(proc.pid), time.monotonic()
    finally:
        _stop(proc)
    events = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    overall, lowest = _tick_rates(seen["ticks"])
    quiet_rate, quiet_lowest = _tick_rates(quiet)
    lat = seen["latency"]
    result = {
        "command": " ".join(["python", "bench/scrape_flood.py", *sys.argv[1:]]),
        "daemon_root": str(args.daemon_root),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "nproc": os.cpu_count(),
            "cpu": platform.processor() or platform.machine(),
            "python": platform.python_version(),
            "loadavg_after": os.getloadavg(),
            "note": "2-core box shared with other sessions; the scrapers run on the same cores",
        },
        "scrapers": args.scrapers,
        "gpus": args.gpus,
        "duration_s": round(wall1 - wall0, 2),
        "requests": len(lat),
        "errors": len(seen["errors"]),
        "error_samples": sorted(set(seen["errors"]))[:10],
        "scrapes_per_s": round(len(lat) / (wall1 - wall0), 1),
        "latency_ms": {
            "p50": round(1000 * _percentile(lat, 0.50), 2),
            "p90": round(1000 * _percentile(lat, 0.90), 2),
            "p99": round(1000 * _percentile(lat, 0.99), 2),
            "max": round(1000 * max(lat, default=float("nan")), 2),
        },
        "bytes_per_scrape_median": int(statistics.median(seen["bytes"])) if seen["bytes"] else None,
        "client_nice": args.nice,
        "ticks_per_s_without_scrapers": round(quiet_rate, 3),
        "ticks_per_s_without_scrapers_lowest_5s": round(quiet_lowest, 3),
        "ticks_per_s": round(overall, 3),
        "ticks_per_s_lowest_5s": round(lowest, 3),
        "source_down_events": sum(1 for e in events if e.get("event") == "source_down"),
        "log_lines": len(events),
        "daemon_cpu_cores": round((cpu1 - cpu0) / (wall1 - wall0), 3),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0 if result["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
