"""What engine pages lose is exported per engine and reason: hostile pages on loopback, read off /metrics.

A page server on 127.0.0.1 serves each tick's bytes; the daemon's engine source, sampler,
pipeline and web app read them, and every tick's /metrics is parsed. The counters count each
read once (a tick that reused a late read adds nothing) and never decrease.
"""

from __future__ import annotations

import asyncio
import math

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from exporter.catalogue import METRICS
from exporter.sampling import Sampler
from exporter.serve.web import make_app
from exporter.snapshot.engine import PAGE_REFUSED_REASONS
from exporter.sources.engine import EngineSource
from tests.fakes.clock import Clock
from tests.fakes.vllm_pages import Pages, engine_config

REFUSED = "boundwatch_engine_page_refused_total"


def page(
    running: str = "10", waiting: str = "2", prompt: str = "100", model: str = "m", head: str = ""
) -> bytes:
    """Return a small vLLM page (engine 0) with the given values."""
    labels = f'engine="0",model_name="{model}"'
    return (
        f"{head}"
        "# TYPE vllm:num_requests_running gauge\n"
        f"vllm:num_requests_running{{{labels}}} {running}\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        f"vllm:num_requests_waiting{{{labels}}} {waiting}\n"
        "# TYPE vllm:prompt_tokens_total counter\n"
        f"vllm:prompt_tokens_total{{{labels}}} {prompt}\n"
    ).encode()


def refused(text: str) -> dict[tuple[str, str], float]:
    """Return boundwatch_engine_page_refused_total from a /metrics page, by (engine, reason)."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == REFUSED:
                out[(s.labels["engine"], s.labels["reason"])] = s.value
    return out


# (what the hostile engine serves this tick, what this read adds by reason)
HOSTILE_TICKS: list[tuple[bytes, dict[str, int]]] = [
    (page(), {}),
    (page(running="NaN"), {"nan": 1}),
    (page(running="+Inf", waiting="-Inf"), {"infinite": 2}),
    (page(waiting="-3", prompt="-1"), {"negative": 2}),
    (page(running="1e300", prompt="1e300"), {"too_large": 2}),
    (b"# \xff\xfe not UTF-8\n" + page(), {"undecodable": 2}),
    (page(model="x" * 1000), {"label": 3, "model": 1}),  # cut, and another name than the one served: held
    (b'vllm:num_requests_running{engine="0" 1\n{{{', {"unparsable": 1}),
    (b"#\n" * 300 + page(), {"lines": 1}),  # past max_page_lines: only comments are left
    (page(prompt="1" + "0" * 9000), {"bytes": 1}),  # past max_page_bytes, so cut before prompt
    (page(running="NaN", waiting="NaN", prompt="NaN"), {"nan": 3}),  # every value refused: engine down
    (page(), {}),
]


async def test_a_hostile_page_counts_each_loss_by_reason_and_the_counters_never_decrease() -> None:
    """Every reason moves by exactly what its tick's page lost; the good engine beside it stays at 0."""
    pages = Pages()
    pages.body["good"] = page(running="7")
    async with TestServer(pages.app(), host="127.0.0.1") as server:
        urls = (str(server.make_url("/good/metrics")), str(server.make_url("/bad/metrics")))
        cfg = engine_config(urls, max_page_lines=200, max_page_bytes=8192)
        source = EngineSource(cfg)
        clock = Clock()
        sampler = Sampler(cfg, [source], clock=clock)
        try:
            async with TestClient(TestServer(make_app(cfg, sampler), host="127.0.0.1")) as client:
                expected = dict.fromkeys(PAGE_REFUSED_REASONS, 0)
                before: dict[tuple[str, str], float] = {}
                for body, adds in HOSTILE_TICKS:
                    pages.body["bad"] = body
                    snap = await sampler.tick()
                    clock.t += cfg.tick_seconds
                    good, bad = (e.name for e in snap.engines)
                    now = refused(await (await client.get("/metrics")).text())
                    for reason, n in adds.items():
                        expected[reason] += n
                    assert {r: now[(bad, r)] for r in PAGE_REFUSED_REASONS} == expected, body[:80]
                    assert {r: now[(good, r)] for r in PAGE_REFUSED_REASONS} == dict.fromkeys(
                        PAGE_REFUSED_REASONS, 0
                    )
                    assert all(math.isfinite(v) and v >= before.get(k, 0.0) for k, v in now.items())
                    before = now
        finally:
            await source.aclose()
    assert all(expected[r] > 0 for r in PAGE_REFUSED_REASONS if r != "files")  # every page reason was hit
    (spec,) = [m for m in METRICS if m.name == REFUSED]
    assert spec.kind == "counter" and spec.labels == ("engine", "reason")
    assert all(r in spec.help for r in PAGE_REFUSED_REASONS)


async def test_a_tick_that_reuses_a_late_read_adds_nothing_and_the_late_read_counts_once() -> None:
    """A read that outlasts the tick is reused; its NaN is counted when the read itself comes in."""
    pages = Pages()
    pages.body["e"] = page(running="NaN")
    async with TestServer(pages.app(), host="127.0.0.1") as server:
        cfg = engine_config((str(server.make_url("/e/metrics")),))
        source = EngineSource(cfg)
        clock = Clock()
        sampler = Sampler(cfg, [source], clock=clock)
        try:
            async with TestClient(TestServer(make_app(cfg, sampler), host="127.0.0.1")) as client:

                async def tick() -> tuple[bool, float]:
                    snap = await sampler.tick()
                    clock.t += cfg.tick_seconds
                    name = snap.engines[0].name
                    late = [s.late for s in snap.sources if s.name == "engine"] == [True]
                    return late, refused(await (await client.get("/metrics")).text())[(name, "nan")]

                assert await tick() == (False, 1.0)
                pages.delay = 0.6  # past the tick's budget (0.8 tick): the first reading is reused
                assert await tick() == (True, 1.0)
                pages.delay = 0.0
                await asyncio.sleep(0.7)  # the late read comes in before the next tick
                assert await tick() == (False, 2.0)
                assert await tick() == (False, 3.0)
        finally:
            await source.aclose()
