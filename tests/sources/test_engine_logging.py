"""One log line per change of an engine's state and per engine found or lost; stdlib records as JSON."""

from __future__ import annotations

import io
import json
import logging
import shutil
import socket
import sys

import structlog
from aiohttp import web
from aiohttp.test_utils import TestServer
from engine_fixtures import PROC
from structlog.testing import capture_logs

from exporter.config import Config, EngineConfig, HostConfig
from exporter.sampling import Sampler
from exporter.sources.engine import EngineSource
from tests.fakes.clock import Clock

GOOD = b'vllm:num_requests_running{engine="0",model_name="m"} 3\n'


def config(urls: tuple[str, ...] = (), discover: bool = False) -> Config:
    return Config(
        tick_seconds=0.5,
        engine=EngineConfig(urls=urls, discover=discover),
        host=HostConfig(proc_root="/proc", cgroup_root="/sys/fs/cgroup"),
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def events(logs: list[dict], *names: str) -> list[tuple[str, str]]:
    return [(e["event"], e.get("error", "")) for e in logs if e["event"] in names]


async def test_a_refused_engine_url_is_logged_once_not_every_tick():
    url = f"http://127.0.0.1:{free_port()}/metrics"
    cfg = config((url,))
    source = EngineSource(cfg)
    clock = Clock()
    sampler = Sampler(cfg, [source], clock=clock)
    with capture_logs() as logs:
        try:
            for _ in range(4):
                await sampler.tick()
                clock.t += 0.5
        finally:
            await source.aclose()
    down = events(logs, "engine_down", "engine_up")
    assert len(down) == 1 and down[0][0] == "engine_down"
    assert "connection refused" in down[0][1] and "ssl:default" not in down[0][1]


async def test_an_engine_logs_each_change_of_state_once_even_when_its_error_text_varies():
    state = {"mode": "garbage", "n": 0}

    async def handle(_request: web.Request) -> web.Response:
        state["n"] += 1
        if state["mode"] == "garbage":  # a parser error that quotes a line changing every read
            return web.Response(body=b'vllm:num_requests_running{engine="%d" oops\n' % state["n"])
        if state["mode"] == "gone":
            return web.Response(status=404)
        return web.Response(body=GOOD)

    app = web.Application()
    app.router.add_get("/metrics", handle)
    async with TestServer(app, host="127.0.0.1") as server:
        cfg = config((str(server.make_url("/metrics")),))
        source = EngineSource(cfg)
        clock = Clock()
        sampler = Sampler(cfg, [source], clock=clock)
        errors = []
        with capture_logs() as logs:
            try:
                for mode in ["garbage"] * 4 + ["good"] * 3 + ["gone"] * 3:
                    state["mode"] = mode
                    snap = await sampler.tick()
                    errors.append(snap.engines[0].error)
                    clock.t += 0.5
            finally:
                await source.aclose()
    assert len(set(errors[:4])) == 4  # the text differed at every read
    got = [e for e, _ in events(logs, "engine_down", "engine_up")]
    assert got == ["engine_down", "engine_up", "engine_down"]
    assert "HTTP 404" in events(logs, "engine_down")[1][1]


async def test_discovery_logs_each_engine_found_and_lost_once(tmp_path):
    root = tmp_path / "proc"
    shutil.copytree(PROC, root, symlinks=True)
    cfg = config(discover=True)
    source = EngineSource(cfg, proc_root=str(root), discover_every=0.0)
    with capture_logs() as logs:
        try:
            await source.read()
            await source.read()
            shutil.rmtree(root / "4500")  # vllm:8002 exits
            await source.read()
            await source.read()
        finally:
            await source.aclose()
    found = [e["engine"] for e in logs if e["event"] == "engine_found"]
    lost = [e["engine"] for e in logs if e["event"] == "engine_lost"]
    assert sorted(found) == ["sglang:30001", "vllm:8001", "vllm:8002", "vllm:8003", "vllm:8004"]
    assert lost == ["vllm:8002"]


def test_stdlib_records_and_their_tracebacks_go_through_the_json_log(monkeypatch):
    from exporter.logs import configure

    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        configure("info", "json")
        try:
            raise RuntimeError("handler blew up")
        except RuntimeError:
            logging.getLogger("aiohttp.server").exception("Error handling request")
        logging.getLogger("aiohttp.access").info("GET %s %d", "/metrics", 200)
        structlog.get_logger("boundwatch.test").info("own_record", x=1)
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        structlog.reset_defaults()
    lines = [json.loads(x) for x in err.getvalue().splitlines()]  # every line is one JSON record
    assert [x["event"] for x in lines] == ["Error handling request", "GET /metrics 200", "own_record"]
    assert lines[0]["level"] == "error" and lines[0]["logger"] == "aiohttp.server"
    assert "RuntimeError: handler blew up" in lines[0]["exception"]
    assert all("timestamp" in x for x in lines)


async def test_a_source_failure_whose_figures_vary_is_logged_once():
    class Slow:
        name = "engine"

        def __init__(self) -> None:
            self.n = 0

        async def read(self) -> tuple:
            self.n += 1
            raise RuntimeError(f"read took {1 + self.n / 10:.2f}s on fd {self.n + 6}")

        def close(self) -> None:
            pass

    clock = Clock()
    sampler = Sampler(config(), [Slow()], clock=clock)
    with capture_logs() as logs:
        for _ in range(5):
            snap = await sampler.tick()
            clock.t += 0.5
    assert [e["event"] for e in logs if e["event"].startswith("source_")] == ["source_down"]
    assert snap.sources[0].errors_total == 5
