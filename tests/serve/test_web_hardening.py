"""The HTTP app under load and attack: one render per tick, gzip, no secrets or NaN, basic-auth timing and flood."""

import asyncio
import base64
import dataclasses
import gzip
import hashlib
import json
import statistics
import threading
import time

import pytest

from exporter.config import Config, NvmlConfig, WebConfig
from exporter.sampling import Sampler
from exporter.serve import web
from exporter.serve.web import make_app
from exporter.snapshot.engine import EngineReading
from exporter.snapshot.host import HostReading, ProcessCpu
from exporter.sources.nvml import NvmlSource
from tests.fakes.clock import Clock
from tests.fakes.nvml_standin import FakeGpu, FakeNvml

OPENMETRICS = {"Accept": "application/openmetrics-text; version=1.0.0"}


async def _sampler(clock: Clock, gpus: int = 8) -> Sampler:
    nvml = FakeNvml([FakeGpu(uuid=f"GPU-{i}") for i in range(gpus)])
    sampler = Sampler(Config(), [NvmlSource(NvmlConfig(), nvml=nvml)], clock=clock)  # type: ignore[arg-type]
    await sampler.tick()
    clock.t += 0.5
    await sampler.tick()
    return sampler


async def _client(aiohttp_client, gpus: int = 8):  # type: ignore[no-untyped-def]
    """Return a clock, a Sampler that has ticked twice on it with `gpus` stand-in GPUs, and a client of its app."""
    clock = Clock(50.0)
    sampler = await _sampler(clock, gpus)
    return clock, sampler, await aiohttp_client(make_app(Config(), sampler))


async def test_many_scrapes_in_one_tick_render_the_page_once_per_format(aiohttp_client):
    clock, sampler, client = await _client(aiohttp_client)
    pages = client.app[web.PAGES]
    bodies = await asyncio.gather(*(client.get("/metrics") for _ in range(20)))
    texts = {await r.text() for r in bodies}
    assert len(texts) == 1 and 'boundwatch_gpu_power_watts{gpu="7"} 695.0' in texts.pop()
    assert pages.renders == 1
    for _ in range(5):
        assert (await (await client.get("/metrics", headers=OPENMETRICS)).text()).endswith("# EOF\n")
    assert pages.renders == 2  # one text, one OpenMetrics
    clock.t += 0.5
    await sampler.tick()
    await client.get("/metrics")
    assert pages.renders == 3  # a new tick, a new page


async def test_ticks_without_scrapes_render_nothing(aiohttp_client):
    clock, sampler, client = await _client(aiohttp_client)
    for _ in range(10):
        clock.t += 0.5
        await sampler.tick()
    assert client.app[web.PAGES].renders == 0  # rendered on a tick's first scrape only
    await client.get("/metrics", headers={"Accept-Encoding": "identity"})
    assert client.app[web.PAGES].renders == 1 and client.app[web.PAGES].compressions == 0  # gzip when asked


async def test_a_stalled_sampler_page_still_ages(aiohttp_client):
    clock, _, client = await _client(aiohttp_client)
    first = await (await client.get("/metrics")).text()
    clock.t += 2.0  # no tick: the cached page lives at most one tick
    second = await (await client.get("/metrics")).text()
    age = [line for line in second.splitlines() if line.startswith("boundwatch_snapshot_age_seconds")]
    assert first != second and age == ["boundwatch_snapshot_age_seconds 2.0"]


async def test_gzip_when_asked_compressed_once_per_tick(aiohttp_client):
    _, _, client = await _client(aiohttp_client)
    plain = await (
        await client.get("/metrics", headers={"Accept-Encoding": "identity"}, auto_decompress=False)
    ).read()
    for _ in range(10):
        resp = await client.get(
            "/metrics", headers={"Accept-Encoding": "gzip, deflate"}, auto_decompress=False
        )
        assert resp.headers["Content-Encoding"] == "gzip"
        assert "Accept-Encoding" in resp.headers["Vary"]
        raw = await resp.read()
        assert gzip.decompress(raw) == plain and len(raw) < len(plain) / 4
    assert client.app[web.PAGES].compressions == 1
    refused = await client.get("/metrics", headers={"Accept-Encoding": "gzip;q=0"}, auto_decompress=False)
    assert "Content-Encoding" not in refused.headers and await refused.read() == plain


async def test_any_accept_version_is_one_of_a_few_pages_and_a_bad_one_is_the_default(aiohttp_client):
    """A version is echoed in the answer's type: each new one would be a page rendered and kept for good."""
    _, _, client = await _client(aiohttp_client, gpus=1)
    pages = client.app[web.PAGES]
    types = set()
    for n in range(300):
        for media in ("application/openmetrics-text", "text/plain"):
            resp = await client.get("/metrics", headers={"Accept": f"{media}; version={n}.{n % 7}.1"})
            assert resp.status == 200
            types.add(resp.headers["Content-Type"])
    assert len(types) == 4 and len(pages._pages) == 4 and pages.renders == 4  # OM 1/2, text 1.0.0/0.0.4
    for bad in ("abc", "1.x", "1" * 5000, "", "1.0.0.0.0"):  # prometheus_client's parser raises on "abc"
        resp = await client.get(
            "/metrics", headers={"Accept": f"application/openmetrics-text; version={bad}"}
        )
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
        assert (await resp.text()).endswith("# EOF\n")
    ranges = ",".join(
        f"text/plain;version={n}.0.0;escaping=x{n}" for n in range(5000)
    )  # past MAX_ACCEPT_PARTS
    assert (await client.get("/metrics", headers={"Accept": ranges[:8000]})).status == 200
    assert len(pages._pages) <= 13


async def test_snapshot_json_is_rendered_once_per_tick_and_gzipped_when_asked(aiohttp_client):
    clock, sampler, client = await _client(aiohttp_client)
    cache = client.app[web.SNAPSHOT_PAGE]
    answers = await asyncio.gather(*(client.get("/api/snapshot") for _ in range(20)))
    bodies = {await r.read() for r in answers}
    assert len(bodies) == 1 and cache.renders == 1  # a flood of it takes one render a tick from sampling
    data = json.loads(bodies.pop())
    assert data["seq"] == sampler.latest().seq and len(data["gpus"]) == 8
    assert answers[0].headers["Content-Type"] == "application/json; charset=utf-8"
    raw = await client.get("/api/snapshot", headers={"Accept-Encoding": "gzip"}, auto_decompress=False)
    assert raw.headers["Content-Encoding"] == "gzip" and json.loads(gzip.decompress(await raw.read())) == data
    clock.t += 0.5
    await sampler.tick()
    assert json.loads(await (await client.get("/api/snapshot")).read())["seq"] == data["seq"] + 1
    assert cache.renders == 2


def test_accept_encoding_is_read_as_prometheus_and_browsers_send_it():
    assert web.accepts_gzip("gzip")
    assert web.accepts_gzip("deflate, gzip;q=1.0, *;q=0.5")
    assert not web.accepts_gzip("identity")
    assert not web.accepts_gzip("gzip;q=0")
    assert not web.accepts_gzip("")


class _Provider:
    """A Snapshot provider that serves one given Snapshot (the sampler's own, edited)."""

    def __init__(self, sampler: Sampler, edit) -> None:
        self._sampler = sampler
        self._edit = edit

    def latest(self, max_age=None):
        snap = self._sampler.latest(max_age)
        return None if snap is None else self._edit(snap)

    def history(self):
        return tuple(self._edit(snap) for snap in self._sampler.history())

    def now(self) -> float:
        return self._sampler.now()


SECRET = "sk-live-0123456789abcdef"


def _with_secrets(snap):
    proc = ProcessCpu(
        pid=41,
        name="vllm",
        cmdline=("vllm", "serve", "m", "--api-key", SECRET),
        cpu=float("nan"),
        busiest_thread=None,
    )
    engine = EngineReading(
        name="vllm:8000", kind="vllm", url="http://u:pw@127.0.0.1:8000/metrics", api_servers=(proc,)
    )
    host = HostReading(cpus=2, cpu_busy=float("inf"))
    busy = dataclasses.replace(snap.totals.busy, graph_busy_seconds={0: float("nan")})
    totals = dataclasses.replace(snap.totals, busy=busy)
    return dataclasses.replace(snap, host=host, engines=(engine,), totals=totals)


async def test_snapshot_json_has_no_command_line_and_no_bare_nan(aiohttp_client):
    sampler = await _sampler(Clock(50.0), gpus=1)
    client = await aiohttp_client(make_app(Config(), _Provider(sampler, _with_secrets)))  # type: ignore[arg-type]
    resp = await client.get("/api/snapshot")
    text = await resp.text()
    assert resp.status == 200 and SECRET not in text and "--api-key" not in text

    def no_constant(name: str) -> None:
        raise AssertionError(f"bare {name} in /api/snapshot")

    data = json.loads(text, parse_constant=no_constant)
    server = data["engines"][0]["api_servers"][0]
    assert server["name"] == "vllm" and server["pid"] == 41 and server["cpu"] is None
    assert server["cmdline"] == ["vllm"]  # the title, which diagnose --url reads; no arguments
    assert data["host"]["cpu_busy"] is None and "pw@" not in text
    assert data["counters"]["boundwatch_gpu_graph_busy_seconds_total{0}"] is None
    assert data["totals"]["busy"]["graph_busy_seconds"] == {"0": None}
    resp = await client.get("/")
    page = await resp.text()
    assert resp.status == 200 and "vllm:8000" in page  # the engine is shown, by name only
    assert SECRET not in page and "--api-key" not in page and "pw@" not in page


def test_served_data_drops_credentials_in_urls():
    assert web.served({"url": "http://prom:pw@127.0.0.1:8000/metrics"}) == {
        "url": "http://127.0.0.1:8000/metrics"
    }
    assert web.served({"environ": {"HF_TOKEN": "x"}, "n": 1}) == {"n": 1}


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


async def _auth_client(aiohttp_client, tmp_path, clock, **web):
    import bcrypt

    users = tmp_path / "users"
    users.write_text(
        f"prom:{bcrypt.hashpw(b's3cret', bcrypt.gensalt(rounds=web.pop('rounds', 4))).decode()}\n"
    )
    cfg = Config(web=WebConfig(basic_auth_file=str(users), **web))
    sampler = await _sampler(Clock(50.0), gpus=1)
    return await aiohttp_client(make_app(cfg, sampler, **({} if clock is None else {"clock": clock})))


@pytest.mark.timeout(60)
async def test_unknown_user_takes_as_long_as_a_wrong_password(aiohttp_client, tmp_path):
    client = await _auth_client(aiohttp_client, tmp_path, None, rounds=9)  # 8 failures: within the burst

    async def seconds(user: str) -> float:
        start = time.perf_counter()
        assert (await client.get("/metrics", headers=_basic(user, "wrong"))).status == 401
        return time.perf_counter() - start

    known, unknown = [], []
    for _ in range(4):
        known.append(await seconds("prom"))
        unknown.append(await seconds("nobody"))
    # bcrypt at cost 9 takes ~20-40 ms; a plain look-up would answer an unknown user in < 1 ms, and
    # a second dummy check for an unknown user (as before session 44) in twice the time
    assert statistics.median(known) > 0.002
    assert 0.6 < statistics.median(unknown) / statistics.median(known) < 1.6


async def test_failures_from_addresses_that_change_share_their_networks_and_one_bucket_for_all():
    """A local user can send from any 127/8 address, a remote one walk its /24s: neither outruns the limit."""
    from exporter.serve.auth import BasicAuth

    clock = Clock(50.0)
    sha = hashlib.sha256(b"s3cret").hexdigest()
    auth = BasicAuth({"prom": sha}, burst=3, rate=0.5, at_once=2, clock=clock)
    wrong = _basic("prom", "x")["Authorization"]
    loopback = [await auth.allowed(wrong, f"127.0.{i}.{i}") for i in range(20)]
    assert loopback == [401] * 3 + [429] * 17  # one bucket for every loopback address
    walk = [await auth.allowed(wrong, f"10.{i}.0.1") for i in range(20)]
    assert walk == [401] * 9 + [429] * 11  # a /24 each, but 4 x 3 checks shared by all, 3 spent
    assert auth.checks == 12 and auth.refused == 28
    clock.t += 10.0  # 2 checks a second for all: full again
    good = _basic("prom", "s3cret")["Authorization"]
    assert await auth.allowed(good, "192.168.7.7") == 200
    assert await auth.allowed(wrong, "::1") == 401  # IPv6 loopback: the loopback bucket, full again too


async def test_checks_waiting_for_a_thread_are_bounded():
    from exporter.serve.auth import BasicAuth

    auth = BasicAuth({"prom": hashlib.sha256(b"s").hexdigest()}, burst=1000, rate=0.0, at_once=1)
    release = threading.Event()
    auth.verify = lambda user, password: release.wait(5) and False  # type: ignore[method-assign]
    wrong = _basic("prom", "x")["Authorization"]
    tasks = [asyncio.ensure_future(auth.allowed(wrong, f"10.0.{i}.1")) for i in range(10)]
    await asyncio.sleep(0.05)
    release.set()
    answers = await asyncio.gather(*tasks)
    assert sorted(answers) == [401, 401] + [429] * 8 and auth.checks == 2  # 2 x at_once in flight at most
    auth.close()


async def test_a_wrong_password_flood_runs_few_checks_and_gets_429(aiohttp_client, tmp_path):
    clock = Clock(50.0)
    client = await _auth_client(aiohttp_client, tmp_path, clock, auth_failure_burst=3)
    auth = client.app[web.AUTH]
    answers = await asyncio.gather(*(client.get("/metrics", headers=_basic("prom", "x")) for _ in range(12)))
    statuses = sorted(r.status for r in answers)
    assert statuses == [401] * 3 + [429] * 9 and auth.checks == 3
    assert (await client.get("/metrics", headers=_basic("prom", "s3cret"))).status == 429  # bucket empty
    clock.t += 4.0  # 0.5 a second: two checks back
    assert (await client.get("/metrics", headers=_basic("prom", "s3cret"))).status == 200
    for _ in range(4):
        await client.get("/metrics", headers=_basic("prom", "x"))
    # the scraper that already logged in is remembered: it passes without a check while others are refused
    assert (await client.get("/metrics", headers=_basic("prom", "s3cret"))).status == 200
    assert (await client.get("/metrics", headers=_basic("nobody", "x"))).status == 429
    await client.app[web.SAMPLER].tick()  # a new page (the cached one lives one tick)
    page = await (await client.get("/metrics", headers=_basic("prom", "s3cret"))).text()
    assert f'boundwatch_http_refused_total{{cause="auth_failed"}} {auth.failures:.1f}' in page
    assert f'boundwatch_http_refused_total{{cause="auth_rate_limited"}} {auth.refused:.1f}' in page
    assert auth.failures == 3 + 2 and auth.refused >= 9


async def test_a_stale_snapshot_is_logged_once_not_per_scrape(aiohttp_client):
    import structlog

    clock, sampler, client = await _client(aiohttp_client, gpus=1)
    with structlog.testing.capture_logs() as logs:
        for _ in range(10):
            clock.t += 1.0  # ticks stopped: each scrape sees an older snapshot and a new page
            await client.get("/metrics")
        await sampler.tick()
        await client.get("/metrics")
    assert [e["event"] for e in logs if e["event"].startswith("snapshot_")] == [
        "snapshot_stale",
        "snapshot_fresh",
    ]


def test_users_of_different_bcrypt_costs_are_warned_of_once():
    """A wrong password takes its user's cost: timing tells a cheaper user from an unknown one."""
    import bcrypt
    import structlog

    from exporter.serve.auth import BasicAuth

    users = {
        n: bcrypt.hashpw(b"x", bcrypt.gensalt(rounds=r)).decode() for n, r in (("a", 4), ("b", 5), ("c", 5))
    }
    with structlog.testing.capture_logs() as logs:
        BasicAuth(users).close()
        BasicAuth({"a": users["a"]}).close()  # one cost: nothing to say
    assert [(e["event"], e["costs"]) for e in logs] == [("basic_auth_costs_differ", [4, 5])]
