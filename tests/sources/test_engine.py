"""The engine source end to end: rediscovery, pages over HTTP, the daemon's sampler, API-server saturation.

Discovery itself is tested in test_engine_discovery*.py, one read of a page in test_engine_page*.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import shutil
import socket
import subprocess
import sys
import time

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from engine_fixtures import FIXTURES, HERE, PAGES, PROC

from exporter import catalogue
from exporter.analysis.engine_page import read_raw
from exporter.config import Config, EngineConfig, HostConfig
from exporter.sampling import Sampler
from exporter.serve.web import make_app
from exporter.snapshot.engine import demand
from exporter.snapshot.totals import EngineServer
from exporter.sources.engine import EngineSource
from exporter.sources.engine_discovery import EngineTarget, discover
from tests.fakes.clock import Clock
from tests.fakes.wait import wait_until_async

RUNNING = catalogue.ENGINE_RUNNING_REQUEST_SECONDS_TOTAL.name


def config(**engine: object) -> Config:
    return Config(
        engine=EngineConfig(**engine),  # type: ignore[arg-type]
        host=HostConfig(proc_root="/proc", cgroup_root="/sys/fs/cgroup"),
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_discovery_runs_again_only_when_the_process_table_changed(tmp_path, monkeypatch):
    import exporter.sources.engine as engine_module

    root = tmp_path / "proc"
    shutil.copytree(PROC, root, symlinks=True)
    (root / "uptime").write_text("100000.00 1.00\n")
    walks = []
    real = engine_module.find_engines
    monkeypatch.setattr(engine_module, "find_engines", lambda *a: walks.append(1) or real(*a))
    cfg = dataclasses.replace(config(discover=True), host=HostConfig(proc_root=str(root)))
    source = EngineSource(cfg, proc_root=str(root), discover_every=0.0)
    try:
        await source.read()
        names = sorted(t.name for t in source.targets)
        await source.read()
        await source.read()
        assert len(walks) == 1 and sorted(t.name for t in source.targets) == names
        shutil.rmtree(root / "4500")  # vllm:8002 exits
        await source.read()
        assert len(walks) == 2 and "vllm:8002" not in {t.name for t in source.targets}
        assert {t.name for t in source.targets} == {t.name for t in discover(str(root))}
    finally:
        await source.aclose()


async def test_placements_are_worked_out_once_a_process_table(tmp_path, monkeypatch):
    """Between two discoveries the table is the same: each engine's placements are made once, read alike."""
    from exporter.sources import placement

    root = tmp_path / "proc"
    shutil.copytree(PROC, root, symlinks=True)
    (root / "uptime").write_text("100000.00 1.00\n")
    made: list[tuple[int, ...]] = []
    real = placement.placements
    monkeypatch.setattr(
        placement, "placements", lambda r, pids, t=None: made.append(tuple(pids)) or real(r, pids, t)
    )
    clock = Clock()
    cfg = dataclasses.replace(config(discover=True), host=HostConfig(proc_root=str(root)))
    source = EngineSource(cfg, proc_root=str(root), discover_every=5.0, clock=clock)
    try:
        first = {r.name: r.placements for r in await source.read()}
        once = len(made)
        assert once == len(set(made)) >= 2  # each engine's once
        for _ in range(3):
            clock.t += 1.0
            assert {r.name: r.placements for r in await source.read()} == first
        assert len(made) == once
        clock.t += 5.0  # the next discovery reads the table again: made again, the same
        assert {r.name: r.placements for r in await source.read()} == first
        assert len(made) == 2 * once
        assert all(first[t.name] == real(str(root), t.engine_pids) for t in source.targets)
    finally:
        await source.aclose()


async def test_configured_file_and_dead_url_read_as_one_good_and_one_failed_engine():
    dead = f"http://127.0.0.1:{free_port()}/metrics"
    source = EngineSource(config(urls=(str(PAGES / "vllm-sim-0.11-asc4.prom"), dead), discover=False))
    try:
        good, bad = await source.read()
    finally:
        await source.aclose()
    assert good.raw is not None and good.api_server_count is None  # the source hands the page on raw
    good = read_raw(good)
    assert (good.name, good.source, good.api_server_count) == ("vllm:vllm-sim-0.11-asc4", "file", 4)
    assert bad.error and bad.running is None and bad.name == f"unknown:{dead.split(':')[2].split('/')[0]}"


class ChangingPage:
    """Serve a vLLM page whose running and waiting change every 0.5 s; log what each request got."""

    def __init__(self, running: list[int], waiting: list[int], period: float = 0.5) -> None:
        self.running, self.waiting, self.period = running, waiting, period
        self.start = time.monotonic()
        self.served: list[tuple[float, int, int]] = []

    def value_at(self, t: float) -> tuple[int, int]:
        i = int((t - self.start) / self.period)
        if i >= len(self.running):
            return 0, 0
        return self.running[i], self.waiting[i]

    async def handle(self, _request: web.Request) -> web.Response:
        now = time.monotonic()
        run, wait = self.value_at(now)
        self.served.append((now, run, wait))
        body = (
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{engine="0",model_name="m"}} {run}\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {wait}\n'
            "# TYPE vllm:iteration_tokens_total histogram\n"
            f'vllm:iteration_tokens_total_count{{engine="0",model_name="m"}} {len(self.served) * 10}\n'
            "process_cpu_seconds_total 1.0\n"
        )
        return web.Response(text=body)


async def test_live_running_and_waiting_integrals_match_the_served_sequence():
    running = [40, 0, 10, 80, 80, 5, 120, 0, 60, 30]
    waiting = [0, 12, 0, 3, 3, 50, 0, 7, 0, 1]
    page = ChangingPage(running, waiting)
    app = web.Application()
    app.router.add_get("/metrics", page.handle)
    async with TestServer(app, host="127.0.0.1") as server:
        url, port = str(server.make_url("/metrics")), server.port
        cfg = config(urls=(url,), discover=False)
        source = EngineSource(cfg)
        snaps = []
        sampler = Sampler(cfg, [source], on_tick=snaps.append)
        stop = asyncio.Event()
        # Tick in the middle of each served period so each tick reads the next value of the sequence.
        await asyncio.sleep(page.start + page.period / 2 - time.monotonic())
        task = asyncio.create_task(sampler.run(stop))
        await asyncio.sleep(page.period * (len(running) + 2))
        async with TestClient(TestServer(make_app(cfg, sampler), host="127.0.0.1")) as client:
            text = await (await client.get("/metrics")).text()
        stop.set()
        await task
        await source.aclose()
    name = snaps[-1].engines[0].name
    assert name == f"vllm:{port}"
    readings = [next(e for e in s.engines if e.name == name) for s in snaps]
    # Each tick read what the server served at that moment.
    assert [(r.running, r.waiting) for r in readings] == [
        (float(r), float(w)) for _, r, w in page.served[: len(snaps)]
    ]
    # The sequence was read in order, each value once (ticks sat mid-period).
    assert [int(r.running) for r in readings[: len(running)]] == running
    # Left rule, tick by tick: the increment is the value read at the previous tick times dt.
    for before, after in itertools.pairwise(snaps):
        prev = next(e for e in before.engines if e.name == name)
        for field, value in (
            ("running_request_seconds", prev.running),
            ("waiting_request_seconds", prev.waiting),
        ):
            was, now = (getattr(s.totals.engine, field).get(name, 0.0) for s in (before, after))
            assert now - was == pytest.approx(value * after.dt, rel=1e-9, abs=1e-9)
    # And in total: each served value held for its 0.5 s period.
    total_run = snaps[-1].totals.engine.running_request_seconds[name]
    total_wait = snaps[-1].totals.engine.waiting_request_seconds[name]
    assert total_run == pytest.approx(0.5 * sum(running), rel=0.02)
    assert total_wait == pytest.approx(0.5 * sum(waiting), rel=0.02)
    # The trapezoid would differ by half a step at every change: 40 -> 0 alone moves it by 10 request-seconds.
    first = snaps[1].totals.engine.running_request_seconds[name] - snaps[
        0
    ].totals.engine.running_request_seconds.get(name, 0.0)
    assert first == pytest.approx(running[0] * snaps[1].dt)
    assert abs(first - (running[0] + running[1]) / 2 * snaps[1].dt) > 5
    # The daemon's /metrics serves the same integral.
    line = next(x for x in text.splitlines() if x.startswith(f'{RUNNING}{{engine="{name}"}}'))
    assert float(line.rsplit(" ", 1)[1]) == pytest.approx(total_run, rel=0.02)


@pytest.fixture
def fake_vllm(tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            str(HERE / "fake_vllm.py"),
            "vllm",
            "serve",
            "fake/model",
            "--port",
            str(port),
            "--api-server-count",
            "2",
            "--page",
            str(PAGES / "vllm-sim-0.11-asc4.prom"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    yield port, proc
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(timeout=10)


def _titled_servers(port: int) -> EngineTarget | None:
    """Return the fake engine as discovery finds it once both API servers carry their titles, else None."""
    found = (t for t in discover("/proc") if t.name == f"vllm:{port}")
    return next((t for t in found if t.servers_titled and len(t.api_server_pids) == 2), None)


async def test_a_saturated_api_server_is_reported_within_two_ticks_and_an_idle_one_is_not(fake_vllm):
    port, proc = fake_vllm
    await wait_until_async(lambda: _titled_servers(port), interval=0.05, what="the two titled API servers")
    cfg = dataclasses.replace(config(), tick_seconds=0.5)
    source = EngineSource(cfg)
    sampler = Sampler(cfg, [source])
    try:
        await sampler.tick()
        await asyncio.sleep(cfg.tick_seconds)  # a tick's real time: the servers' CPU is measured over it
        snap = await sampler.tick()
    finally:
        await source.aclose()
    name = f"vllm:{port}"
    engine = next(e for e in snap.engines if e.name == name)
    assert engine.api_server_count == 2 and engine.api_server_count_source == "processes"
    servers = dict(engine.servers())
    assert set(servers) == {"0", "1"}
    # The spinning server wants a whole core (what it gets depends on the neighbours); the idle one nothing.
    assert (demand(servers["0"]) or 0.0) >= 0.9 and servers["0"].cpu > 0.3
    assert (demand(servers["1"]) or 0.0) < 0.2
    saturated = snap.totals.engine.api_server_saturated_seconds
    assert saturated[EngineServer(name, "0")] == pytest.approx(snap.dt)
    assert saturated.get(EngineServer(name, "1"), 0.0) == 0.0
    assert engine.running == 23.0  # the page the fake engine serves
    assert proc.poll() is None


async def test_a_local_multiprocess_engine_is_read_from_its_files_with_processes_and_cgroups(tmp_path):
    import shutil

    import vllm_sim

    proc_root = tmp_path / "proc"
    shutil.copytree(PROC, proc_root, symlinks=True)
    mp_dir = tmp_path / "mp"
    mp_dir.mkdir()
    for pid in (4100, 4101, 4102, 4103, 4104, 4105):
        (proc_root / str(pid) / "cgroup").write_text("0::/kubepods.slice/pod1/ctr\n")
    for pid in (4101, 4102):
        (proc_root / str(pid) / "environ").write_bytes(f"PROMETHEUS_MULTIPROC_DIR={mp_dir}\0".encode())
    (proc_root / "4103" / "environ").write_bytes(b"CUDA_VISIBLE_DEVICES=2,3\0")
    truth, _ = vllm_sim.run_engine(str(mp_dir), n_servers=2, steps=40, concurrency=8)
    cfg = config()
    source = EngineSource(cfg, proc_root=str(proc_root), cgroup_root=str(FIXTURES / "cgroup" / "v2"))
    try:
        await source.read()
        readings = {r.name: read_raw(r) for r in await source.read()}
    finally:
        await source.aclose()
    v = readings["vllm:8001"]
    assert (v.source, v.error) == ("multiproc_files", "")  # no request to the engine
    assert v.iteration_count == truth.observations and v.generation_tokens_total == truth.generation_tokens
    assert (v.api_server_count, v.api_server_count_source) == (2, "processes")
    assert [s for s, _ in v.servers()] == ["0", "1"]
    assert all(p.cpu == 0.0 for p in v.api_servers)  # the fixture's CPU counters did not move
    assert [(c.path, c.quota_cores) for c in v.cgroups] == [("/kubepods.slice/pod1/ctr", 0.5)]
    assert v.cuda_visible_devices == "2,3" and set(v.pids) == {4100, 4101, 4102, 4103, 4104, 4105}
    assert v.steps is not None and v.steps.lower <= truth.steps_with_output <= v.steps.upper
    # The other engines of the tree have no server behind their ports: read, failed, still listed.
    assert readings["sglang:30001"].error and readings["vllm:8002"].error


async def test_api_servers_moved_into_a_throttled_cgroup_show_it_at_the_next_read(tmp_path):
    import shutil

    proc_root = tmp_path / "proc"
    shutil.copytree(PROC, proc_root, symlinks=True)
    cgroup_root = tmp_path / "cgroup"
    shutil.copytree(FIXTURES / "cgroup" / "v2", cgroup_root)
    for pid in (4100, 4101, 4102, 4103, 4104, 4105):
        (proc_root / str(pid) / "cgroup").write_text("0::/kubepods.slice/pod1\n")
    source = EngineSource(config(), proc_root=str(proc_root), cgroup_root=str(cgroup_root))
    try:
        await source.read()  # CPU figures need a first sample
        before = {r.name: r for r in await source.read()}["vllm:8001"]
        for pid in (
            4101,
            4102,
        ):  # what a quota on the API servers alone does: move them (the lab, an operator)
            (proc_root / str(pid) / "cgroup").write_text("0::/kubepods.slice/pod1/ctr\n")
        after = {r.name: r for r in await source.read()}["vllm:8001"]
    finally:
        await source.aclose()
    assert {p.cgroup for p in before.api_servers} == {"/kubepods.slice/pod1"}
    assert {p.cgroup for p in after.api_servers} == {
        "/kubepods.slice/pod1/ctr"
    }  # not a discovery period later
    assert ("/kubepods.slice/pod1/ctr", 0.5) in [(c.path, c.quota_cores) for c in after.cgroups]


async def test_spec_decode_counters_are_read_raw_and_their_window_taken_in_the_pipeline(tmp_path):
    page = tmp_path / "spec.prom"

    def write(drafted: int, accepted: int) -> None:
        page.write_text(
            f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {drafted}\n'
            f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {accepted}\n'
        )

    cfg = config(urls=(str(page),), discover=False)
    source = EngineSource(cfg)
    sampler = Sampler(cfg, [source])
    try:
        write(1000, 900)  # a long history at 90%
        first = await sampler.tick()
        write(1200, 950)  # the last 200 drafted tokens: 25% accepted
        second = await sampler.tick()
        (raw,) = await source.read()
    finally:
        await sampler.aclose()
    assert raw.raw is not None and raw.spec_draft_tokens_total is None  # normalised in the pipeline
    raw = read_raw(raw)
    assert (raw.spec_draft_tokens_total, raw.spec_accepted_tokens_total, raw.spec_acceptance) == (
        1200,
        950,
        None,
    )
    assert first.engines[0].spec_acceptance is None
    assert second.engines[0].spec_acceptance == pytest.approx(0.25)


def test_inspect_of_a_local_engine_lists_its_api_server_processes(fake_vllm, capsys):
    import json

    from exporter.cli import main

    port, _ = fake_vllm
    assert main(["inspect", "engine", f"http://127.0.0.1:{port}/metrics"]) == 0
    data = json.loads(capsys.readouterr().out)
    servers = data["api_servers"]
    assert (servers["count"], servers["count_from"]) == (2, "processes")
    assert [p["server"] for p in servers["processes"]] == [0, 1]
    assert data["steps"]["method"] == "output_steps" and data["steps"]["total"] == data["steps"]["lower"]


async def test_between_discoveries_a_tick_is_one_call_in_the_source_thread_with_the_same_readings():
    import structlog

    dead = f"http://127.0.0.1:{free_port()}/metrics"
    page = str(PAGES / "vllm-sim-0.11-asc4.prom")
    by_start = EngineSource(config(urls=(page, dead), discover=False))
    by_read = EngineSource(config(urls=(page, dead), discover=False))
    try:
        with structlog.testing.capture_logs() as started_logs:
            first = by_start.start_read()
            assert not isinstance(first, asyncio.Task)  # configured engines: no discovery, no task
            started = await first
        with structlog.testing.capture_logs() as read_logs:
            read = await by_read.read()
    finally:
        await by_start.aclose()
        await by_read.aclose()

    def same(r):  # the time a read took is the only field that differs
        return dataclasses.replace(r, scrape_seconds=None)

    assert [same(r) for r in started] == [same(r) for r in read]
    assert [(e["event"], e["engine"]) for e in started_logs] == [(e["event"], e["engine"]) for e in read_logs]
    assert {e["event"] for e in started_logs} == {"engine_up", "engine_down"}


async def test_a_discovery_tick_or_a_disabled_source_reads_through_read_in_a_task(tmp_path):
    (tmp_path / "proc").mkdir()
    src = EngineSource(config(urls=()), proc_root=str(tmp_path / "proc"))
    try:
        due = src.start_read()
        assert isinstance(due, asyncio.Task) and await due == ()
    finally:
        await src.aclose()


async def test_an_engine_in_more_cgroups_than_are_read_has_the_first_read_and_the_rest_counted(
    tmp_path, monkeypatch
):
    import shutil

    import exporter.sources.engine as engine_module

    proc_root = tmp_path / "proc"
    shutil.copytree(PROC, proc_root, symlinks=True)
    cgroup_root = tmp_path / "cgroup"
    shutil.copytree(FIXTURES / "cgroup" / "v2", cgroup_root)
    for pid in (4100, 4101, 4102, 4103, 4104, 4105):  # vllm:8001's main process, 2 API servers, 3 more
        (cgroup_root / "kubepods.slice" / f"c{pid}").mkdir()
        (cgroup_root / "kubepods.slice" / f"c{pid}" / "cpu.stat").write_text("usage_usec 1000\n")
        (proc_root / str(pid) / "cgroup").write_text(f"0::/kubepods.slice/c{pid}\n")
    monkeypatch.setattr(engine_module, "MAX_CGROUPS", 3)
    source = EngineSource(config(), proc_root=str(proc_root), cgroup_root=str(cgroup_root))
    try:
        await source.read()
        engine = {r.name: r for r in await source.read()}["vllm:8001"]
        # the main process's and the API servers' cgroups are the ones read; the other three counted
        assert [c.path for c in engine.cgroups] == [f"/kubepods.slice/c{pid}" for pid in (4100, 4101, 4102)]
        assert source.over_bound == 3
    finally:
        await source.aclose()


async def test_a_page_nothing_serves_is_read_again_after_a_back_off_and_every_tick_once_it_answers():
    port = free_port()
    clock = Clock(0.0)
    source = EngineSource(config(urls=(f"http://127.0.0.1:{port}/metrics",), discover=False), clock=clock)
    reads_at: list[float] = []
    errors: list[str] = []
    runner = None
    try:
        for _ in range(16):  # 0 .. 7.5 s at 0.5 s ticks: refused
            before = source.page_reads
            (reading,) = await source.read()
            errors.append(reading.error)
            if source.page_reads > before:
                reads_at.append(clock.t)
            clock.t += 0.5
        # read at once again, then 1, 2 and 4 s after, then every 4 s
        assert reads_at == [0.0, 0.5, 1.5, 3.5, 7.5]
        assert len(set(errors)) == 1 and "refused" in errors[0]  # a skipped tick keeps the refusal
        app = web.Application()

        async def page(_request: web.Request) -> web.Response:
            return web.Response(
                text='# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 2\n'
            )

        app.router.add_get("/metrics", page)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        got = []
        for _ in range(10):  # 8 .. 12.5 s: the engine listens; it is read at 11.5 s and every tick after
            before = source.page_reads
            (reading,) = await source.read()
            got.append((clock.t, source.page_reads - before, reading.error == ""))
            clock.t += 0.5
        assert [t for t, n, _ in got if n] == [11.5, 12.0, 12.5]
        assert all(ok for t, _, ok in got if t >= 11.5) and not any(ok for t, _, ok in got if t < 11.5)
    finally:
        await source.aclose()
        if runner is not None:
            await runner.cleanup()


async def test_a_page_that_answers_badly_is_read_every_tick():
    app = web.Application()

    async def broken(_request: web.Request) -> web.Response:
        return web.Response(status=500, text="busy")

    app.router.add_get("/metrics", broken)
    async with TestServer(app, host="127.0.0.1") as server:
        clock = Clock(0.0)
        url = f"http://127.0.0.1:{server.port}/metrics"
        source = EngineSource(config(urls=(url,), discover=False), clock=clock)
        try:
            for _ in range(8):
                (reading,) = await source.read()
                assert "HTTP 500" in reading.error
                clock.t += 0.5
        finally:
            await source.aclose()
        assert source.page_reads == 8  # an answer, however bad, is no sign that nothing serves
