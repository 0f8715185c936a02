"""Hostile engine pages on loopback: bad bytes, NaN and negative values, huge pages and labels.

Each engine's page is served by a small aiohttp server and read by the daemon's own sampler;
one bad engine must never hide the others, poison a counter or take the source down.
"""

from __future__ import annotations

import json
import math

import pytest
from aiohttp.test_utils import TestClient, TestServer

from exporter import catalogue
from exporter.export.collectors import counter_series
from exporter.sampling import Sampler
from exporter.serve.web import make_app
from exporter.sources.engine import EngineSource
from exporter.sources.engine_scrape import DEFAULT_LIMITS
from tests.fakes.clock import Clock
from tests.fakes.vllm_pages import Pages, engine_config, page

RUNNING = catalogue.ENGINE_RUNNING_REQUEST_SECONDS_TOTAL.name


def strict_json(text: str) -> object:
    def refuse(constant: str) -> None:
        raise ValueError(f"bare {constant} in JSON")

    return json.loads(text, parse_constant=refuse)


async def test_a_non_utf8_byte_on_one_page_leaves_every_engine_read():
    pages = Pages()
    pages.body["good"] = page(running="7")
    pages.body["bad"] = b"# \xff a comment that is not UTF-8\n" + page(running="3")
    async with TestServer(pages.app(), host="127.0.0.1") as server:
        urls = (str(server.make_url("/good/metrics")), str(server.make_url("/bad/metrics")))
        cfg = engine_config(urls)
        source = EngineSource(cfg)
        clock = Clock()
        sampler = Sampler(cfg, [source], clock=clock)
        try:
            snaps = []
            for _ in range(3):
                snaps.append(await sampler.tick())
                clock.t += cfg.tick_seconds
        finally:
            await source.aclose()
    for snap in snaps:
        assert [s.up for s in snap.sources if s.name == "engine"] == [True]
        good, bad = snap.engines
        assert (good.error, good.running, good.page_decode_errors) == ("", 7.0, 0)
        assert (bad.error, bad.running, bad.waiting) == ("", 3.0, 2.0)
        assert bad.page_decode_errors == 1
    running = snaps[-1].totals.engine.running_request_seconds
    assert running[good.name] == pytest.approx(7.0 * 2 * cfg.tick_seconds)
    assert running[bad.name] == pytest.approx(3.0 * 2 * cfg.tick_seconds)


async def test_a_nan_for_one_tick_never_reaches_the_request_seconds_and_the_snapshot_stays_json():
    pages = Pages()
    async with TestServer(pages.app(), host="127.0.0.1") as server:
        url = str(server.make_url("/e/metrics"))
        cfg = engine_config((url,))
        source = EngineSource(cfg)
        clock = Clock()
        sampler = Sampler(cfg, [source], clock=clock)
        served = ["10", "NaN", "10", "+Inf", "10", "-4", "10"]
        try:
            for value in served:
                pages.body["e"] = page(running=value, prompt="-1" if value == "NaN" else "100")
                snap = await sampler.tick()
                clock.t += cfg.tick_seconds
            async with TestClient(TestServer(make_app(cfg, sampler), host="127.0.0.1")) as client:
                api = await (await client.get("/api/snapshot")).text()
                metrics = await (await client.get("/metrics")).text()
        finally:
            await source.aclose()
    name = snap.engines[0].name
    total = snap.totals.engine.running_request_seconds[name]
    # Only the intervals that began on a sound reading count: 10 held for three of the six intervals.
    assert math.isfinite(total) and total == pytest.approx(3 * 10 * cfg.tick_seconds)
    assert all(math.isfinite(v) and v >= 0 for v in counter_series(snap).values())
    data = strict_json(api)
    assert isinstance(data, dict) and data["counters"][f"{RUNNING}{{{name}}}"] == pytest.approx(total)
    line = next(x for x in metrics.splitlines() if x.startswith(f'{RUNNING}{{engine="{name}"}}'))
    assert float(line.rsplit(" ", 1)[1]) == pytest.approx(total)


async def test_a_page_past_the_line_budget_is_read_in_part_and_the_source_stays_up():
    lines = 600_000  # about 30 MB of lines the reader keeps
    body = b"# TYPE vllm:num_requests_running gauge\n" + b"".join(
        b'vllm:num_requests_running{engine="%d",model_name="m"} 1\n' % i for i in range(lines)
    )
    assert len(body) > 25_000_000
    pages = Pages()
    pages.body["big"] = body
    async with TestServer(pages.app(), host="127.0.0.1") as server:
        cfg = engine_config((str(server.make_url("/big/metrics")),), tick=5.0)
        source = EngineSource(cfg)
        sampler = Sampler(cfg, [source], clock=Clock())
        try:
            snap = await sampler.tick()
        finally:
            await source.aclose()
    assert [s.up for s in snap.sources if s.name == "engine"] == [True]
    (r,) = snap.engines
    assert r.error == "" and r.page_truncated
    assert r.running == DEFAULT_LIMITS.max_kept_lines - 1  # the kept lines within the budget, TYPE first


async def test_a_hundred_thousand_model_names_give_a_bounded_engine_info_label():
    body = (
        "# TYPE vllm:num_requests_running gauge\n"
        + "".join(
            f'vllm:num_requests_running{{engine="0",model_name="model-{i:06d}"}} 0\n' for i in range(100_000)
        )
    ).encode()
    pages = Pages()
    pages.body["many"] = body
    async with TestServer(pages.app(), host="127.0.0.1") as server:
        cfg = engine_config((str(server.make_url("/many/metrics")),), tick=5.0)
        source = EngineSource(cfg)
        sampler = Sampler(cfg, [source], clock=Clock())
        try:
            snap = await sampler.tick()
            async with TestClient(TestServer(make_app(cfg, sampler), host="127.0.0.1")) as client:
                metrics = await (await client.get("/metrics")).text()
        finally:
            await source.aclose()
    (r,) = snap.engines
    assert r.error == "" and len(r.model) <= cfg.engine.max_label_chars
    info = [x for x in metrics.splitlines() if x.startswith("boundwatch_engine_info{")]
    assert info and all(len(x) < 400 for x in info)


async def test_configured_engines_never_share_a_name_with_each_other_or_a_discovered_one():
    from exporter.sources.engine_discovery import EngineTarget

    pages = Pages()
    pages.body["a"] = page(running="1")
    pages.body["b"] = page(running="2")
    async with TestServer(pages.app(), host="127.0.0.1") as server:
        urls = (str(server.make_url("/a/metrics")), str(server.make_url("/b/metrics")))
        source = EngineSource(engine_config(urls))
        try:
            first = await source.read()
            # Discovery now finds a local engine named like the first configured one.
            local = EngineTarget(url="", kind="vllm", name=first[0].name, root_pid=None)
            source._targets = [*source._targets, local]
            second = await source.read()
        finally:
            await source.aclose()
    assert len({r.name for r in first}) == 2
    assert len({r.name for r in second}) == 3


SERVE_BIG = """
import http.server, sys
body = b"# TYPE vllm:num_requests_running gauge\\n" + b"".join(
    b'vllm:num_requests_running{engine="%d",model_name="m"} 1\\n' % i for i in range(1_000_000))

class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except OSError:
            pass

    def log_message(self, *a):
        pass

server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(server.server_address[1], len(body), flush=True)
server.serve_forever()
"""

READ_ONCE = """
import asyncio, json, resource, sys
from exporter.config import Config, EngineConfig
from exporter.sources.engine import EngineSource

before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
src = EngineSource(Config(engine=EngineConfig(urls=(sys.argv[1],), discover=False)))
async def main():
    try:
        return await src.read()
    finally:
        await src.aclose()
(r,) = asyncio.run(main())
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"grew_mib": (after - before) / 1024, "error": r.error, "truncated": r.page_truncated}))
"""


def test_a_50_mb_page_costs_the_reader_tens_of_mib_not_hundreds():
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    server = subprocess.Popen([sys.executable, "-c", SERVE_BIG], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port, size = map(int, server.stdout.readline().split())
        assert size > 50_000_000
        out = subprocess.run(
            [sys.executable, "-c", READ_ONCE, f"http://127.0.0.1:{port}/metrics"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(root)},
        )
    finally:
        server.kill()
        server.wait()
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["error"] == "" and got["truncated"]
    assert got["grew_mib"] < 100
