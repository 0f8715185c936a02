"""What scraping an API server's /metrics costs the API server: its throughput at its limit, scraped or not.

    python bench/api_server_scrape_cost.py [--rounds 20] [--segment 2] [--out bench/results/api_server_scrape_cost.json]

An API-server-shaped process: an aiohttp server whose event loop does CPU-bound "tokenising" for
every request (a fixed amount of pure-Python work per request, calibrated to `--tokenise-ms` at
start) and records vLLM's metric families on each (the 0.33 definitions of tests/fakes/engine/vllm_sim.py,
via prometheus_client, plus the HTTP families vLLM's instrumentator adds); /metrics renders them
on the same loop, as vLLM's does. A load generator keeps `--concurrency` requests in flight, so
the server runs at its limit, while a scraper reads /metrics every 0.5 s (boundwatch reading the
page every tick), every 15 s (a Prometheus scrape, or boundwatch's slow read while an agent counts
the engine) or not at all (boundwatch with agent counts between slow reads). The three run as
segments of `--segment` seconds, interleaved round by round in a rotating order (short segments,
many rounds: a neighbour's load changes more slowly than that); each ratio pools all of a period's
segments against all unscraped ones, with a bootstrap 95% interval over rounds. A period longer
than a segment scrapes once at a random point of it with probability segment / period, so every
period keeps its rate of scrapes. On a shared machine
the CPU the server gets swings more than a scrape takes, so each segment also reports requests per
CPU-second of the server (its throughput were it given a whole core): scrapes lower that figure by
exactly their share of its CPU, whatever the neighbours do.

Two server modes, each its own run of rounds: prometheus_client in single-process mode (one API
server, vLLM's default), and multiprocess mode (PROMETHEUS_MULTIPROC_DIR, a MultiProcessCollector
per scrape over the files of this server and one sibling API server's, as vLLM runs with
--api-server-count 2). CPU per scrape in the serving process is measured two ways: the event
loop thread's CPU inside the /metrics handler under load, and the whole process's CPU over a burst
of back-to-back scrapes with no other load (HTTP handling included).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import multiprocessing as mp
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "fakes" / "engine"))

import vllm_sim  # noqa: E402  (vLLM's metric definitions, as the tests use them)

MODEL = "Qwen/Qwen3-8B"
PROMPT = " ".join(f"word{i % 97}x{i % 13}" for i in range(400))  # ~4 KB of text, ~400 "words"
PERIODS: dict[str, float | None] = {"every_0.5s": 0.5, "every_15s": 15.0, "none": None}


# --- the API-server-shaped process ------------------------------------------------------------


def tokenise(text: str, rounds: int) -> int:
    """Do a fixed amount of CPU-bound pure-Python work on the prompt (a stand-in for tokenising it)."""
    n = 0
    for r in range(rounds):
        ids = [hash(w) % 151_936 for w in text.split()]
        n += len(ids) + (sum(ids) + r) % 2
    return n


def calibrate(ms: float) -> int:
    """Return the tokenise rounds that take about `ms` of CPU here."""
    rounds = 1
    while True:
        t0 = time.thread_time()
        tokenise(PROMPT, rounds)
        spent = (time.thread_time() - t0) * 1e3
        if spent >= 20 or rounds > 1 << 16:
            return max(1, round(rounds * ms / spent))
        rounds *= 2


def _sibling(mp_dir: str) -> None:
    """Write one sibling API server's full set of vLLM metrics into mp_dir (its files outlive it)."""
    vllm_sim.use_multiproc_dir(mp_dir)
    vllm_sim.fill(vllm_sim.define("0.33"), model=MODEL, seed=7)
    vllm_sim.fill_http(vllm_sim.define_http(), seed=7)


async def serve(mode: str, mp_dir: str, tokenise_ms: float) -> None:
    """Run the API-server-shaped process until its stdin closes; print its port once listening."""
    from aiohttp import web

    if mode == "multiprocess":
        vllm_sim.use_multiproc_dir(mp_dir)
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess

    own = CollectorRegistry()  # single-process: rendered as is; multiprocess: values go to files
    metrics = vllm_sim.define("0.33", registry=own)
    http = vllm_sim.define_http(registry=own)
    vllm_sim.fill(metrics, model=MODEL, seed=1)
    vllm_sim.fill_http(http, seed=1)
    lv = (MODEL, "0")
    m = {k: metrics[k].labels(*lv) for k in ("prompt", "generation", "req_prompt", "req_gen", "e2e", "ttft")}
    success = metrics["success"].labels(*lv, "stop")
    requests = http["requests"].labels("POST", "2xx", "/v1/completions")
    duration = http["duration"].labels("/v1/completions", "POST")
    scrapes_ok = http["requests"].labels("GET", "2xx", "/metrics")
    rounds = calibrate(tokenise_ms)
    stats = {"served": 0, "scrapes": 0, "scrape_cpu": 0.0, "page_bytes": 0}

    async def complete(request: web.Request) -> web.Response:
        t0 = time.perf_counter()
        body = await request.read()
        n = tokenise(body.decode(), rounds)
        m["prompt"].inc(n)
        m["generation"].inc(16)
        m["req_prompt"].observe(n)
        m["req_gen"].observe(16)
        took = time.perf_counter() - t0
        m["e2e"].observe(took)
        m["ttft"].observe(took)
        success.inc()
        requests.inc()
        duration.observe(took)
        stats["served"] += 1
        return web.json_response({"tokens": n})

    async def metrics_page(_request: web.Request) -> web.Response:
        c0 = time.thread_time()
        if mode == "multiprocess":
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry, path=mp_dir)
            page = generate_latest(registry)
        else:
            page = generate_latest(own)
        scrapes_ok.inc()
        response = web.Response(body=page, content_type="text/plain", charset="utf-8")
        stats["scrape_cpu"] += time.thread_time() - c0
        stats["scrapes"] += 1
        stats["page_bytes"] = len(page)
        return response

    async def report(_request: web.Request) -> web.Response:
        return web.json_response(
            {**stats, "cpu": time.process_time(), "mono": time.monotonic(), "rounds": rounds}
        )

    app = web.Application()
    app.router.add_post("/v1/completions", complete)
    app.router.add_get("/metrics", metrics_page)
    app.router.add_get("/stats", report)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(runner.addresses[0][1], flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await runner.cleanup()


# --- the load, the scraper and the rounds -------------------------------------------------------


class Load:
    """Keep `concurrency` requests in flight against the server (its limit is its event loop)."""

    def __init__(self, session: Any, base: str, concurrency: int) -> None:
        self.session, self.base, self.concurrency = session, base, concurrency
        self.errors = 0
        self._tasks: list[asyncio.Task[None]] = []

    async def _one(self) -> None:
        body = PROMPT.encode()
        while True:
            try:
                async with self.session.post(f"{self.base}/v1/completions", data=body) as resp:
                    await resp.read()
            except asyncio.CancelledError:
                raise
            except Exception:
                self.errors += 1
                await asyncio.sleep(0.01)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._one()) for _ in range(self.concurrency)]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def scrape(session: Any, base: str) -> int:
    """Read the whole page, as boundwatch and Prometheus do; return its size."""
    async with session.get(f"{base}/metrics") as resp:
        return len(await resp.read())


async def stats(session: Any, base: str) -> dict[str, Any]:
    async with session.get(f"{base}/stats") as resp:
        return dict(await resp.json())


async def segment(
    session: Any, base: str, period: float | None, seconds: float, rng: random.Random
) -> dict[str, Any]:
    """Run one segment with a scraper at `period` (None: none); return the server's throughput over it."""
    s0 = await stats(session, base)
    start = time.monotonic()
    if period is None:
        times: list[float] = []
    elif period >= seconds:
        times = [rng.uniform(0, seconds)] if rng.random() < seconds / period else []
    else:
        times = [k * period for k in range(int(seconds / period))]
    done = 0
    for at in times:
        await asyncio.sleep(max(0.0, start + at - time.monotonic()))
        await scrape(session, base)
        done += 1
    await asyncio.sleep(max(0.0, start + seconds - time.monotonic()))
    s1 = await stats(session, base)
    span = s1["mono"] - s0["mono"]
    served = s1["served"] - s0["served"]
    cpu = s1["cpu"] - s0["cpu"]
    return {
        "requests_per_second": served / span,
        "requests_per_server_cpu_second": served / cpu if cpu > 0 else 0.0,
        "server_cpu_per_second": cpu / span,
        "scrapes": done,
        "scrape_cpu_ms": (s1["scrape_cpu"] - s0["scrape_cpu"]) * 1e3,
        "served": served,
        "seconds": span,
    }


async def run_mode(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """Start a server in one prometheus_client mode and run the interleaved rounds against it."""
    import aiohttp

    with tempfile.TemporaryDirectory() as mp_dir:
        if mode == "multiprocess":
            p = mp.get_context("spawn").Process(target=_sibling, args=(mp_dir,))
            p.start()
            p.join(60)
        proc = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--serve",
                mode,
                "--mp-dir",
                mp_dir,
                "--tokenise-ms",
                str(args.tokenise_ms),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None and proc.stdin is not None
        base = f"http://127.0.0.1:{int(proc.stdout.readline())}"
        rng = random.Random(args.seed)
        try:
            connector = aiohttp.TCPConnector(limit=args.concurrency + 4)
            async with aiohttp.ClientSession(connector=connector) as session:
                # CPU per scrape with nothing else running: the whole process, HTTP handling included
                burst0 = await stats(session, base)
                sizes = [await scrape(session, base) for _ in range(args.burst)]
                burst1 = await stats(session, base)
                load = Load(session, base, args.concurrency)
                load.start()
                await asyncio.sleep(args.warmup)
                names = list(PERIODS)
                rounds = []
                for r in range(args.rounds):
                    order = names[r % len(names) :] + names[: r % len(names)]
                    rounds.append(
                        {
                            name: await segment(session, base, PERIODS[name], args.segment, rng)
                            for name in order
                        }
                    )
                await load.stop()
                final = await stats(session, base)
        finally:
            proc.stdin.close()
            proc.wait(timeout=30)
    burst_cpu_ms = (burst1["cpu"] - burst0["cpu"]) * 1e3 / args.burst
    handler_ms = [s["scrape_cpu_ms"] / s["scrapes"] for rd in rounds for s in rd.values() if s["scrapes"]]
    none = [rd["none"] for rd in rounds]
    cpu_per_request_ms = statistics.median(
        s["server_cpu_per_second"] / s["requests_per_second"] * 1e3 for s in none
    )
    out: dict[str, Any] = {
        "page_bytes": sizes[-1],
        "tokenise_rounds": final["rounds"],
        "cpu_per_request_ms": round(cpu_per_request_ms, 3),
        "cpu_per_scrape_ms": {
            "process_idle_burst": round(burst_cpu_ms, 3),
            "handler_under_load_median": round(statistics.median(handler_ms), 3) if handler_ms else None,
        },
        "load_errors": load.errors,
        "by_period": {},
        "rounds": rounds,
    }
    rng = random.Random(args.seed)
    for name, period in PERIODS.items():
        expected = None
        if period is not None:  # the throughput the scrapes' CPU alone would take away
            expected = 1.0 - (burst_cpu_ms / period / 1e3)
        out["by_period"][name] = {
            "requests_per_second": round(_rate(rounds, name, "seconds"), 2),
            "ratio_to_none": _ratio(rounds, name, "seconds", rng),
            "server_cores": round(
                sum(rd[name]["server_cpu_per_second"] * rd[name]["seconds"] for rd in rounds)
                / sum(rd[name]["seconds"] for rd in rounds),
                3,
            ),
            "requests_per_server_cpu_second": round(_rate(rounds, name, "cpu"), 2),
            "per_cpu_ratio_to_none": _ratio(rounds, name, "cpu", rng),
            "ratio_expected_from_cpu_per_scrape": None if expected is None else round(expected, 5),
            "scrapes": sum(rd[name]["scrapes"] for rd in rounds),
        }
    return out


def _rate(rounds: list[dict[str, dict[str, Any]]], name: str, per: str) -> float:
    """Return requests served over all of one period's segments, per second of wall or server CPU."""
    served = sum(rd[name]["served"] for rd in rounds)
    if per == "cpu":
        return served / sum(rd[name]["server_cpu_per_second"] * rd[name]["seconds"] for rd in rounds)
    return served / sum(rd[name]["seconds"] for rd in rounds)


def _ratio(
    rounds: list[dict[str, dict[str, Any]]], name: str, per: str, rng: random.Random
) -> dict[str, Any]:
    """Return a period's rate over the unscraped rate (all segments pooled), with a bootstrap 95% interval
    over rounds and the per-round ratios' median."""
    point = _rate(rounds, name, per) / _rate(rounds, "none", per)
    boot = []
    for _ in range(2000):
        pick = [rounds[rng.randrange(len(rounds))] for _ in rounds]
        boot.append(_rate(pick, name, per) / _rate(pick, "none", per))
    boot.sort()
    key = "requests_per_second" if per == "seconds" else "requests_per_server_cpu_second"
    each = [rd[name][key] / rd["none"][key] for rd in rounds]
    return {
        "pooled": round(point, 4),
        "ci95": [round(boot[int(0.025 * len(boot))], 4), round(boot[int(0.975 * len(boot)) - 1], 4)],
        "median_of_rounds": round(statistics.median(each), 4),
    }


def machine() -> dict[str, Any]:
    return {
        "nproc": os.cpu_count(),
        "cpu": next(
            (ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), ""
        ),
        "python": platform.python_version(),
        "aiohttp": importlib.metadata.version("aiohttp"),
        "prometheus_client": importlib.metadata.version("prometheus-client"),
        "load_average_at_start": os.getloadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--segment", type=float, default=2.0, help="seconds per scrape-mode segment")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--tokenise-ms", type=float, default=3.0, help="CPU per request on the event loop")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--burst", type=int, default=200, help="back-to-back scrapes for the idle CPU figure")
    parser.add_argument("--modes", default="single,multiprocess")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "api_server_scrape_cost.json"))
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--mp-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve, args.mp_dir, args.tokenise_ms))
        return
    result: dict[str, Any] = {
        "command": "python " + " ".join([os.path.relpath(__file__, ROOT), *sys.argv[1:]]),
        "machine": machine(),
        "setup": {
            "rounds": args.rounds,
            "segment_seconds": args.segment,
            "concurrency": args.concurrency,
            "tokenise_ms": args.tokenise_ms,
            "naming": "vLLM 0.33 families (tests/fakes/engine/vllm_sim.py) + HTTP instrumentator families",
            "multiprocess_writers": 2,
        },
        "modes": {},
    }
    started = time.monotonic()
    for mode in args.modes.split(","):
        result["modes"][mode] = asyncio.run(run_mode(mode, args))
    result["wall_seconds"] = round(time.monotonic() - started, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for mode, r in result["modes"].items():
        print(
            f"{mode}: page {r['page_bytes']} B, CPU/request {r['cpu_per_request_ms']} ms, "
            f"CPU/scrape {r['cpu_per_scrape_ms']}"
        )
        for name, p in r["by_period"].items():
            print(
                f"  {name:>10}: {p['requests_per_second']:7.1f} req/s, ratio {p['ratio_to_none']}; "
                f"{p['requests_per_server_cpu_second']:7.1f} req per server CPU-s, ratio {p['per_cpu_ratio_to_none']}; "
                f"expected {p['ratio_expected_from_cpu_per_scrape']}"
            )


if __name__ == "__main__":
    main()
