"""What one engine sample costs: the sidecar's CPU (fetch, parse, integrate) and the serving process's CPU.

    python bench/engine_sample.py [--servers 4] [--engines 2] [--out bench/results/engine_sample.json]

A full vLLM page (every family of research/vllm-metrics.md §1.1, 0.33 naming, one model, `--engines`
data-parallel engines) is written by `--servers` real processes in prometheus_client's multiprocess
mode, as vLLM's API servers do. Then, all in CPU seconds (`time.process_time`):

* serving side: rendering /metrics from those files (`generate_latest` over a MultiProcessCollector,
  what each API server does per scrape), and, for reference, the same page from one process;
* sidecar side: one `EngineSource.read()` over HTTP from a server in another process (fetch, prefilter,
  parse, normalise), and its parts: prefilter, parse of the cut page, parse of the full page, normalise,
  `analysis.engine.accumulate`; and reading the multiprocess files directly (no request to the engine).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import multiprocessing as mp
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "fakes" / "engine"))

import vllm_sim  # noqa: E402  (the vLLM metric definitions the tests use)


def _writer(mp_dir: str, engines: int, seed: int) -> None:
    vllm_sim.use_multiproc_dir(mp_dir)
    metrics = vllm_sim.define("0.33")
    vllm_sim.fill(metrics, engines=tuple(str(e) for e in range(engines)), seed=seed)
    vllm_sim.fill_http(vllm_sim.define_http(), seed=seed)


def write_files(mp_dir: str, servers: int, engines: int) -> None:
    """Have `servers` processes write a full set of vLLM metrics into mp_dir."""
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(mp_dir, engines, i)) for i in range(servers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0, p.exitcode


def cpu_per_call(fn: Any, n: int) -> dict[str, float]:
    """Return median and p90 CPU ms per call over n calls (and wall ms median)."""
    cpu, wall = [], []
    fn()  # warm
    for _ in range(n):
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        cpu.append((time.process_time() - c0) * 1e3)
        wall.append((time.perf_counter() - w0) * 1e3)
    cpu.sort()
    return {
        "cpu_ms_median": round(statistics.median(cpu), 3),
        "cpu_ms_p90": round(cpu[int(0.9 * (len(cpu) - 1))], 3),
        "wall_ms_median": round(statistics.median(wall), 3),
        "calls": n,
    }


def serve_page_in_subprocess(page: bytes) -> tuple[subprocess.Popen[bytes], str]:
    """Serve the page from another process (so its CPU is not the sidecar's)."""
    path = tempfile.NamedTemporaryFile(delete=False, suffix=".prom")
    path.write(page)
    path.close()
    code = (
        "import http.server,sys\n"
        "page=open(sys.argv[1],'rb').read()\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "  protocol_version='HTTP/1.1'\n"
        "  disable_nagle_algorithm=True\n"
        "  def do_GET(self):\n"
        "    self.send_response(200);self.send_header('Content-Length',str(len(page)));self.end_headers()\n"
        "    self.wfile.write(page)\n"
        "  def log_message(self,*a): pass\n"
        "s=http.server.ThreadingHTTPServer(('127.0.0.1',0),H)\n"
        "print(s.server_address[1],flush=True)\n"
        "s.serve_forever()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, path.name], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    return proc, f"http://127.0.0.1:{port}/metrics"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "engine_sample.json"))
    args = parser.parse_args()

    from prometheus_client import CollectorRegistry, generate_latest, multiprocess

    from exporter.analysis.engine import accumulate
    from exporter.config import Config, EngineConfig
    from exporter.snapshot import Snapshot
    from exporter.sources.engine import EngineSource
    from exporter.sources.engine_discovery import discover
    from exporter.sources.engine_scrape import MultiprocReader, parse_page, prefilter_page
    from tests.fakes.engine_reads import reading_from_multiproc, reading_from_page

    result: dict[str, Any] = {
        "machine": {
            "nproc": os.cpu_count(),
            "cpu": next(
                (ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
                "",
            ),
            "python": platform.python_version(),
            "prometheus_client": importlib.metadata.version("prometheus-client"),
            "load_average": os.getloadavg(),
        },
        "setup": {"api_servers": args.servers, "engines": args.engines, "naming": "vLLM 0.33", "model": "1"},
    }
    with tempfile.TemporaryDirectory() as mp_dir:
        write_files(mp_dir, args.servers, args.engines)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, mp_dir)
        page = generate_latest(registry).decode()
        single = CollectorRegistry()
        vllm_sim.fill(
            vllm_sim.define("0.33", registry=single), engines=tuple(str(e) for e in range(args.engines))
        )
        vllm_sim.fill_http(vllm_sim.define_http(registry=single))
        from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR

        for collector in (GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR):
            single.register(collector)  # a single-process vLLM serves python_gc_*, python_info, process_*
        single_page = generate_latest(single).decode()
        Path(ROOT / "bench" / "results" / "engine_sample_page.prom").write_text(page)
        result["page"] = {
            "multiprocess_bytes": len(page),
            "multiprocess_lines": page.count("\n"),
            "single_process_bytes": len(single_page),
            "single_process_lines": single_page.count("\n"),
            "prefiltered_bytes": len(prefilter_page(page)),
            "prefiltered_lines": prefilter_page(page).count("\n"),
        }
        # --- what a scrape costs the serving process -------------------------------------------
        result["serving_render_multiprocess"] = cpu_per_call(lambda: generate_latest(registry), args.calls)
        result["serving_render_single_process"] = cpu_per_call(lambda: generate_latest(single), args.calls)
        # --- what a sample costs the sidecar -----------------------------------------------------
        result["prefilter"] = cpu_per_call(lambda: prefilter_page(page), args.calls)
        result["parse_full_page"] = cpu_per_call(lambda: parse_page(page, prefilter=False), args.calls)
        result["prefilter_and_parse"] = cpu_per_call(lambda: parse_page(page, prefilter=True), args.calls)
        result["page_to_reading"] = cpu_per_call(lambda: reading_from_page(page), args.calls)
        reader = MultiprocReader(mp_dir)  # what the source keeps per engine: the file index
        result["read_multiproc_files_to_reading"] = cpu_per_call(
            lambda: reading_from_multiproc(reader), args.calls
        )
        result["read_multiproc_files_first_read"] = cpu_per_call(lambda: reading_from_multiproc(mp_dir), 20)
        full = MultiprocRead(registry)
        result["multiprocess_collector_full_merge"] = cpu_per_call(full, args.calls)
        r1 = reading_from_page(page, name="vllm:8000")
        prev = Snapshot(seq=1, at=0.0, mono=0.0, interval=0.5, dt=0.5, engines=(r1,))
        cur = Snapshot(seq=2, at=0.5, mono=0.5, interval=0.5, dt=0.5, engines=(r1,))
        cfg = Config()
        from exporter.sources import procs

        result["discover_engines_in_proc"] = cpu_per_call(lambda: discover("/proc"), 20)
        result["proc_count"] = len(procs.pids("/proc"))
        tracker = procs.CpuTracker()
        me = procs.proc_info("/proc", os.getpid())
        result["api_server_cpu_sample_one_process"] = cpu_per_call(lambda: tracker.sample([me]), args.calls)
        result["own_threads"] = threading.active_count()
        result["accumulate"] = cpu_per_call(lambda: accumulate(cur, cfg, prev), args.calls)
        result["page_sizes"] = page_sizes(page, args.calls)

        server, url = serve_page_in_subprocess(page.encode())
        try:
            cfg = Config(engine=EngineConfig(urls=(url,), discover=False, timeout_seconds=2.0))
            result["source_read_http"] = asyncio.run(time_source(EngineSource(cfg), args.calls))
        finally:
            server.kill()
            server.wait()
    per_tick = result["source_read_http"]["cpu_ms_median"] + result["accumulate"]["cpu_ms_median"]
    result["summary"] = {
        "sidecar_cpu_ms_per_sample_http": round(per_tick, 3),
        "sidecar_core_share_at_2hz_http": round(per_tick * 2 / 1000, 5),
        "sidecar_cpu_ms_per_sample_files": result["read_multiproc_files_to_reading"]["cpu_ms_median"],
        "serving_cpu_ms_per_scrape": result["serving_render_multiprocess"]["cpu_ms_median"],
        "serving_core_share_at_2hz": round(
            result["serving_render_multiprocess"]["cpu_ms_median"] * 2 / 1000, 5
        ),
        "full_parse_over_prefiltered_parse": round(
            result["parse_full_page"]["cpu_ms_median"]
            / max(result["prefilter_and_parse"]["cpu_ms_median"], 1e-9),
            1,
        ),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


def page_sizes(page: str, calls: int) -> list[dict[str, Any]]:
    """Return, per page size, boundwatch's page path against prometheus_client's parser on the same page.

    Pages: the smallest fixture (11 lines, every sample one boundwatch reads), the real-size page,
    and that page 16 times over (16 models). Ours: `parse_page` (cut, then read the kept lines) and
    `reading_from_page` (the same plus normalising); theirs: the parser over the whole page.
    ratio > 1: boundwatch is cheaper.
    """
    from prometheus_client.parser import text_string_to_metric_families

    from exporter.sources.engine_scrape import parse_page
    from tests.fakes.engine_reads import reading_from_page

    small = (ROOT / "tests" / "fixtures" / "engine" / "vllm-0.11-multiapi8-kvcache-pid.prom").read_text()
    big = "".join(page.replace('model_name="', f'model_name="m{k}-') if k else page for k in range(16))
    rows = []
    for label, text in (("11-line fixture", small), ("real size", page), ("16x real size", big)):
        n = max(20, calls // (4 if len(text) > 500_000 else 1))
        theirs = cpu_per_call(lambda t=text: list(text_string_to_metric_families(t)), n)
        ours = cpu_per_call(lambda t=text: parse_page(t), n)
        reading = cpu_per_call(lambda t=text: reading_from_page(t), n)
        rows.append(
            {
                "page": label,
                "lines": text.count("\n"),
                "bytes": len(text),
                "prometheus_client_parser_ms": theirs["cpu_ms_median"],
                "boundwatch_parse_page_ms": ours["cpu_ms_median"],
                "boundwatch_reading_from_page_ms": reading["cpu_ms_median"],
                "ratio_parser_over_parse_page": round(theirs["cpu_ms_median"] / ours["cpu_ms_median"], 2),
                "ratio_parser_over_reading": round(theirs["cpu_ms_median"] / reading["cpu_ms_median"], 2),
            }
        )
    return rows


class MultiprocRead:
    """Collect every family from the multiprocess files (what MultiProcessCollector does for /metrics)."""

    def __init__(self, registry: Any) -> None:
        self.registry = registry

    def __call__(self) -> None:
        for _ in self.registry.collect():
            pass


async def time_source(source: Any, calls: int) -> dict[str, float]:
    """Return CPU per EngineSource.read() (fetch over loopback HTTP, prefilter, parse, normalise)."""
    cpu: list[float] = []
    wall: list[float] = []
    try:
        await source.read()  # warm: connection, discovery of the name
        for _ in range(calls):
            c0, w0 = time.process_time(), time.perf_counter()
            readings = await source.read()
            cpu.append((time.process_time() - c0) * 1e3)
            wall.append((time.perf_counter() - w0) * 1e3)
            assert not readings[0].error, readings[0].error
    finally:
        await source.aclose()
    cpu.sort()
    return {
        "cpu_ms_median": round(statistics.median(cpu), 3),
        "cpu_ms_p90": round(cpu[int(0.9 * (len(cpu) - 1))], 3),
        "wall_ms_median": round(statistics.median(wall), 3),
        "calls": calls,
    }


if __name__ == "__main__":
    threading.stack_size(0)
    main()
