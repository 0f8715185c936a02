"""The engine's page asked for only the samples read (prometheus_client's `name[]`), against real registries.

Each engine here is prometheus_client's own WSGI app over a registry (the code vLLM and SGLang mount),
served on loopback: a single-process registry filters, a multiprocess one answers the filter with an
empty page, and a server that knows only `/metrics` answers 404. The readings through the filter
must be the readings of the whole page.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest
import vllm_sim
from prometheus_client import (
    GC_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    make_wsgi_app,
    multiprocess,
)

from exporter.snapshot.engine_names import WANTED
from exporter.sources.engine_scrape import (
    EnginePageClient,
    asked_names,
    filtered_url,
    page_client,
    raw_from_bytes,
)
from tests.fakes.engine_reads import reading_from_page


class _Quiet(WSGIRequestHandler):
    def log_message(self, *a: object) -> None:
        pass


class Served:
    """A WSGI app on loopback that records the path (with query) of every request."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self.paths: list[str] = []

        def recording(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
            query = environ.get("QUERY_STRING", "")
            self.paths.append(environ["PATH_INFO"] + ("?" + query if query else ""))
            return app(environ, start_response)

        self.server: WSGIServer = make_server("127.0.0.1", 0, recording, handler_class=_Quiet)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def single_process_registry() -> CollectorRegistry:
    """vLLM 0.33's families in one registry with the process and GC collectors, as one API server serves."""
    reg = CollectorRegistry(auto_describe=True)
    vllm_sim.fill(vllm_sim.define("0.33", registry=reg), engines=("0", "1"))
    vllm_sim.fill_http(vllm_sim.define_http(registry=reg))
    for collector in (GC_COLLECTOR, PROCESS_COLLECTOR):
        reg.register(collector)
    return reg


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[..., Any]], Served]]:
    servers: list[Served] = []

    def start(app: Callable[..., Any]) -> Served:
        servers.append(Served(app))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def reads(client: EnginePageClient, n: int) -> list[bytes]:
    try:
        return [client.get() for _ in range(n)]
    finally:
        client.close()


def samples(data: bytes) -> tuple[Any, ...]:
    """A page's raw samples (in any order: a filtered registry collects in its own) and registry mode."""
    raw = raw_from_bytes(data).raw
    assert raw is not None
    return sorted(raw.samples), raw.multiprocess


def test_the_filter_asks_each_kind_for_the_names_read_and_the_single_process_marks() -> None:
    for kind in ("vllm", "sglang"):
        names = asked_names(kind)
        assert {n for n in WANTED if n.startswith(kind + ":")} <= set(names)
        assert not any(n.startswith(("vllm:", "sglang:")) and not n.startswith(kind + ":") for n in names)
        assert {"process_cpu_seconds_total", "python_gc_objects_collected_total"} <= set(names)
    url = filtered_url("http://127.0.0.1:8000/metrics", "vllm")
    assert url.startswith("http://127.0.0.1:8000/metrics/?name%5B%5D=vllm:") and len(url) < 700
    assert filtered_url("http://127.0.0.1:8000/metrics?x=1", "vllm") == ""  # a query of its own: not asked
    assert filtered_url("http://127.0.0.1:8000/metrics", "unknown") == ""


def test_a_single_process_registry_serves_the_filtered_page_which_reads_as_the_whole_one(serve) -> None:
    reg = single_process_registry()
    engine = serve(make_wsgi_app(reg))
    client = page_client(engine.url, 5.0)
    whole, first, second = reads(client, 3)
    assert engine.paths[0] == "/metrics"  # the kind is not known before the first page shows it
    assert engine.paths[1].startswith("/metrics/?name%5B%5D=vllm:") and engine.paths[1] == engine.paths[2]
    assert client.filter_off == ""
    assert len(first) * 5 < len(whole) and first.count(b"\n") * 5 < whole.count(b"\n")
    assert b"vllm:time_to_first_token_seconds" in whole and b"vllm:time_to_first_token" not in first
    assert samples(first) == samples(whole) == samples(second)
    assert samples(first)[1] is False  # the marks came through: a single-process registry


def test_a_multiprocess_registry_answers_the_filter_empty_so_the_engine_is_read_whole(
    serve, tmp_path
) -> None:
    vllm_sim.run_sglang(str(tmp_path), tp=2, dp=2)
    reg = CollectorRegistry()
    multiprocess.MultiProcessCollector(reg, str(tmp_path))
    engine = serve(make_wsgi_app(reg))
    client = page_client(engine.url, 5.0, kind="sglang")  # discovery named the kind: asked at once
    pages = reads(client, 3)
    assert engine.paths[0].startswith("/metrics/?name%5B%5D=sglang:")
    assert engine.paths[1:] == ["/metrics", "/metrics", "/metrics"]  # read again whole at once, then always
    assert "multiprocess" in client.filter_off
    assert samples(pages[0]) == samples(pages[2]) and samples(pages[0])[1] is True


def test_a_server_that_knows_only_its_path_answers_404_and_the_engine_is_read_whole(serve) -> None:
    app = make_wsgi_app(single_process_registry())

    def only_metrics(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ["PATH_INFO"] != "/metrics":
            start_response("404 Not Found", [("Content-Length", "0")])
            return [b""]
        return app(environ, start_response)

    engine = serve(only_metrics)
    client = page_client(engine.url, 5.0, kind="vllm")
    pages = reads(client, 2)
    assert client.filter_off == "the filtered page answered HTTP 404"
    assert engine.paths[1:] == ["/metrics", "/metrics"] and samples(pages[0]) == samples(pages[1])


def test_an_engine_not_serving_its_metrics_yet_is_read_whole_until_it_does_then_asked(serve) -> None:
    reg = CollectorRegistry(auto_describe=True)
    reg.register(PROCESS_COLLECTOR)
    engine = serve(make_wsgi_app(reg))
    client = page_client(engine.url, 5.0, kind="vllm")
    reads(client, 2)  # asked, nothing of vLLM's: read whole at once, then whole while it serves none
    assert engine.paths[0].startswith("/metrics/?") and engine.paths[1:] == ["/metrics", "/metrics"]
    vllm_sim.fill(vllm_sim.define("0.33", registry=reg), engines=("0",))
    reads(client, 2)  # the engine is up: this read shows it, the next one is asked again
    assert engine.paths[3] == "/metrics" and engine.paths[4].startswith("/metrics/?name%5B%5D=vllm:")
    assert client.filter_off == ""


def test_page_filter_off_reads_the_whole_page_every_time(serve) -> None:
    engine = serve(make_wsgi_app(single_process_registry()))
    reads(page_client(engine.url, 5.0, ask=False, kind="vllm"), 3)
    assert engine.paths == ["/metrics"] * 3


def test_the_filtered_page_gives_the_whole_pages_figures(serve) -> None:
    engine = serve(make_wsgi_app(single_process_registry()))
    whole, filtered = reads(page_client(engine.url, 5.0), 2)
    a, b = (reading_from_page(p.decode()) for p in (whole, filtered))
    assert replace(a, raw=None) == replace(b, raw=None)
    assert (a.running, a.waiting, a.prompt_tokens_total) == (b.running, b.waiting, b.prompt_tokens_total)


def test_a_registry_without_process_or_gc_collectors_still_reads_as_single_process_through_the_filter(
    serve,
) -> None:
    # a registry of the engine's own (the lab's): only a counter's _created sample tells its mode
    reg = CollectorRegistry(auto_describe=True)
    vllm_sim.fill(vllm_sim.define("0.33", registry=reg), engines=("0",))
    engine = serve(make_wsgi_app(reg))
    whole, filtered = reads(page_client(engine.url, 5.0), 2)
    assert b"process_cpu" not in whole and b"vllm:prompt_tokens_created" in filtered
    assert samples(whole) == samples(filtered) and samples(filtered)[1] is False


async def test_the_engine_source_says_once_that_an_engine_is_read_whole_and_why(serve, tmp_path) -> None:
    from structlog.testing import capture_logs

    from exporter.config import Config, EngineConfig, HostConfig
    from exporter.sources.engine import EngineSource

    vllm_sim.run_sglang(str(tmp_path), tp=1, dp=1)
    reg = CollectorRegistry()
    multiprocess.MultiProcessCollector(reg, str(tmp_path))
    engine = serve(make_wsgi_app(reg))
    cfg = Config(
        engine=EngineConfig(urls=(engine.url,), discover=False),
        host=HostConfig(proc_root="/proc", cgroup_root="/sys/fs/cgroup"),
    )
    source = EngineSource(cfg)
    with capture_logs() as logs:
        try:
            readings = [(await source.read())[0] for _ in range(4)]
        finally:
            await source.aclose()
    said = [e for e in logs if e["event"] == "engine_page_read_whole"]
    assert len(said) == 1 and "multiprocess" in said[0]["reason"] and said[0]["url"] == engine.url, logs
    assert all(not r.error and r.kind == "sglang" for r in readings), readings
    assert engine.paths[0] == "/metrics" and engine.paths[1].startswith("/metrics/?")  # whole, then asked
    assert engine.paths[2:] == ["/metrics"] * 3  # the same read again whole, then the next two


def test_an_engine_that_ignores_the_filter_is_read_whole_after_one_filtered_read(serve) -> None:
    page = make_wsgi_app(single_process_registry())

    def own_route(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        environ["QUERY_STRING"] = ""  # a route of the engine's own: the whole page at any path, any query
        return page(environ, start_response)

    engine = serve(own_route)
    client = page_client(engine.url, 5.0, kind="vllm")
    pages = reads(client, 3)
    assert client.filter_off.startswith("the engine ignores the filter"), client.filter_off
    assert engine.paths[0].startswith("/metrics/?name") and engine.paths[1:] == ["/metrics", "/metrics"]
    assert samples(pages[0]) == samples(pages[1]) == samples(pages[2])
