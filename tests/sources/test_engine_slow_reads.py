"""Agent counts first, the API server's page rarely: the real sampler, engine source, agent feed and pipeline.

An engine is found in a process table of its own (a vLLM API server, pid 4500, and its EngineCore,
pid 4501) whose port is a real page server on loopback that counts its hits. The EngineCore's
light agent is the real StepTracker: its datagrams go through the real wire and feed. Time is an
injected clock, so every period below is exact and nothing waits on a sleep.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from aiohttp import web
from engine_fixtures import HERE, PROC
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest

from exporter import wire
from exporter.agent.steps import StepTracker
from exporter.analysis.verdict import gather, window
from exporter.config import AgentFeedConfig, Config, EngineConfig, HostConfig, NvmlConfig
from exporter.export.collectors import SnapshotCollector
from exporter.sampling import Sampler
from exporter.snapshot import Snapshot
from exporter.snapshot.gpu import GpuReading
from exporter.sources.agent_feed import AgentFeed
from exporter.sources.engine import EngineSource
from tests.fakes.clock import Clock

WALL0 = 1_764_400_000.0  # the wall clock at t = 0
CORE = 4501  # the EngineCore's pid in the process table below
PAGE_RUNNING, PAGE_WAITING = 99.0, 7.0  # what the page says: never the agent's figures
MS = 1_000_000


class PageServer:
    """A vLLM-shaped /metrics on loopback; tokens grow with the clock; every hit is counted with its time."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.hits: list[float] = []
        self.port = 0
        self._runner: web.AppRunner | None = None

    def page(self) -> str:
        t = self.clock.t
        labels = '{engine="0",model_name="org/model"}'
        return (
            f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{labels} {PAGE_RUNNING}\n"
            f"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{labels} {PAGE_WAITING}\n"
            f"# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{labels} {4000 * t}\n"
            f"# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total{labels} {1000 * t}\n"
        )

    async def handle(self, _request: web.Request) -> web.Response:
        self.hits.append(self.clock.t)
        return web.Response(text=self.page())

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self.handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


def process_table(root: Path, port: int) -> Path:
    """Copy a one-API-server vLLM (4500) and its EngineCore (4501) from the fixture table, on `port`."""
    proc = root / "proc"
    for pid in ("1", "4500", "4501"):
        shutil.copytree(PROC / pid, proc / pid)
    cmdline = proc / "4500" / "cmdline"
    cmdline.write_bytes(cmdline.read_bytes().replace(b"8002", str(port).encode()))
    return proc


class Gpus:
    """NVML stand-in as a source: one GPU running the EngineCore, busy 40%."""

    name = "nvml"

    async def read(self) -> tuple[GpuReading, ...]:
        return (
            GpuReading(
                index=0, uuid="GPU-0aaa", name="NVIDIA H200", driver="580", pids=(CORE,), utilization=0.4
            ),
        )

    def close(self) -> None:
        pass


class EngineCore:
    """The EngineCore's light agent: a served sequence recorded into the real StepTracker, sent as datagrams.

    Steps every 20 ms; after step i the scheduler runs (7 i) % 13 requests and (5 i) % 4 wait.
    `exact()` is the sequence's request-seconds by the left rule, from the first step's end to the last's.
    """

    def __init__(self, feed: AgentFeed, clock: Clock) -> None:
        self.feed, self.clock = feed, clock
        self.tracker = StepTracker()
        self.tracker.per_step = False  # the light agent's path
        self.tracker.engine_here = True
        self.ends: list[tuple[int, int, int]] = []  # (t1 ns, running, waiting)
        self.next_ns = clock.wall_ns()

    def serve_until_now(self) -> None:
        """Record the steps that ended by now and send what the tracker hands out, as the agent would."""
        now = self.clock.wall_ns()
        while self.next_ns + 20 * MS <= now:
            i = len(self.ends)
            t0, t1 = self.next_ns, self.next_ns + 20 * MS
            running, waiting = (7 * i) % 13, (5 * i) % 4
            self.tracker.record("vllm", t0, t1, running, running, running, waiting, 256, -1, 1)
            self.ends.append((t1, running, waiting))
            self.next_ns = t1
        self.send(self.tracker.take())

    def send(self, steps: list[wire.Steps]) -> None:
        msg = wire.Message(pid=CORE, state="running", role="vllm_engine", mode="light", steps=tuple(steps))
        self.feed.receive(wire.encode(msg))

    def exact(self) -> tuple[float, float]:
        run = wait = 0.0
        for (a, r, w), (b, _, _) in zip(self.ends, self.ends[1:], strict=False):
            run += r * (b - a) / 1e9
            wait += w * (b - a) / 1e9
        return run, wait


@pytest.fixture
async def host(tmp_path: Path):  # type: ignore[no-untyped-def]
    clock = Clock(0.0, wall_ns=int(WALL0) * 1_000_000_000)
    server = PageServer(clock)
    await server.start()
    proc = process_table(tmp_path, server.port)
    cfg = Config(
        engine=EngineConfig(slow_read_seconds=10.0),
        host=HostConfig(enabled=False, proc_root=str(proc), cgroup_root=str(tmp_path / "cgroup")),
        nvml=NvmlConfig(enabled=False),
        agent=AgentFeedConfig(socket=str(tmp_path / "run" / "agent.sock"), stale_seconds=5.0),
    )
    engine = EngineSource(cfg, clock=clock)
    feed = AgentFeed(cfg.agent, clock=clock, wall_ns=clock.wall_ns)
    await feed.start()
    sampler = Sampler(cfg, [Gpus(), engine, feed], clock=clock, wall=clock.wall)
    core = EngineCore(feed, clock)
    yield clock, server, engine, sampler, core
    feed.close()
    await engine.aclose()
    await server.stop()


async def tick(sampler: Sampler, clock: Clock, core: EngineCore | None = None) -> Snapshot:
    """Serve the steps up to now (when the agent lives), tick once, and move the clock by a tick."""
    if core is not None:
        core.serve_until_now()
    snap = await sampler.tick()
    clock.t += 0.5
    return snap


def metrics(snap: Snapshot) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: snap, 0.5, 5.0, clock=lambda: snap.mono))  # type: ignore[arg-type]
    return generate_latest(registry).decode()


def value(text: str, name: str, **labels: str) -> float | None:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    m = re.search(rf"^{re.escape(name)}\{{{re.escape(want)}\}} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


async def test_agent_counts_serve_the_integrals_exactly_and_the_page_is_read_every_slow_period(host) -> None:
    clock, server, engine, sampler, core = host
    snaps = [await tick(sampler, clock, core) for _ in range(60)]  # 30 s
    e = snaps[-1].engines[0]
    name = e.name
    assert name == f"vllm:{server.port}" and e.pids == (4500, CORE)
    # Tick 0 saw no step yet, so ticks 0 and 1 read the page; from then on every 10 s of the clock.
    assert server.hits == [0.0, 0.5, 10.5, 20.5]
    assert engine.page_reads == 4
    assert [s.engines[0].counts_source for s in snaps[:3]] == ["page", "agent", "agent"]
    assert [s.engines[0].page_read for s in snaps[:3]] == [True, True, False]
    # Running and waiting are the agent's newest counts, never the page's 99 / 7.
    *_, (_, last_running, last_waiting) = core.ends
    assert (e.running, e.waiting) == (last_running, last_waiting)
    # The integrals are the sequence's exact request-seconds (the page's figures would give 99 x 29.5 s).
    run, wait = core.exact()
    assert run > 100 and wait > 20
    assert snaps[-1].totals.engine.running_request_seconds[name] == pytest.approx(run, rel=1e-9)
    assert snaps[-1].totals.engine.waiting_request_seconds[name] == pytest.approx(wait, rel=1e-9)
    # /metrics says which source served the counts, and how old the page's figures are.
    text = metrics(snaps[-1])
    assert value(text, "boundwatch_engine_counts_source", engine=name, source="agent") == 1.0
    assert value(text, "boundwatch_engine_counts_source", engine=name, source="page") == 0.0
    assert value(text, "boundwatch_engine_page_age_seconds", engine=name) == pytest.approx(29.5 - 20.5)
    assert value(text, "boundwatch_engine_requests_running", engine=name) == last_running
    # The token counters and the model still come from the page, as of its last read.
    assert value(text, "boundwatch_engine_generation_tokens_total", engine=name) == 1000 * 20.5
    assert 'model="org/model"' in text


async def test_a_token_delta_seen_at_a_slow_read_is_not_one_ticks_movement(host) -> None:
    clock, _server, _engine, sampler, core = host
    snaps = [await tick(sampler, clock, core) for _ in range(24)]
    cfg = sampler.cfg.verdict
    read_at = next(i for i, s in enumerate(snaps) if i > 2 and s.engines[0].page_read)
    assert snaps[read_at].mono == 10.5
    for i in (read_at - 1, read_at, read_at + 1):
        facts = gather(window(snaps[: i + 1], cfg.window_seconds), 0, cfg)
        # The page moved 10 s of tokens at the read: that is no movement within the newest tick ...
        assert "tokens" not in (facts.offered_by or "")
        # ... and a tick without a read is no rate at all, not a rate of 0 (decode is not ruled out).
        assert facts.generation_tokens_per_second is None and facts.decoding
        # The agent's counts offer the work, and they are where the counts came from.
        assert facts.offered and "engine_steps" in (facts.offered_by or "")
        assert facts.counts_source == "agent"


async def test_counts_that_stop_fall_back_to_the_page_read_every_tick(host) -> None:
    clock, server, engine, sampler, core = host
    for _ in range(60):
        await tick(sampler, clock, core)
    name = sampler.latest().engines[0].name  # type: ignore[union-attr]
    held = core.ends[-1][1:]
    # The agent falls silent at t = 29.5: its last counts are held while it is alive (5 s) ...
    quiet = [await tick(sampler, clock) for _ in range(16)]  # t = 30 .. 37.5
    alive = [s for s in quiet if s.mono <= 34.5]
    assert all(s.engines[0].counts_source == "agent" for s in alive)
    assert all((s.engines[0].running, s.engines[0].waiting) == held for s in alive)
    assert [h for h in server.hits if 29.5 < h <= 35.0] == [30.5]  # ... the page still at the slow period
    # ... then it is stale: the page serves the counts. Its last read was 4.5 s before, so at that
    # tick no count is served at all; from the next tick on the page is read every tick.
    stale = next(i for i, s in enumerate(quiet) if s.engines[0].counts_source == "page")
    assert quiet[stale].mono == 35.0
    assert (quiet[stale].engines[0].running, quiet[stale].engines[0].page_read) == (None, False)
    after = quiet[stale + 1 :]
    assert [s.engines[0].page_read for s in after] == [True] * len(after)
    assert server.hits[-len(after) :] == [s.mono for s in after]
    assert all((s.engines[0].running, s.engines[0].waiting) == (PAGE_RUNNING, PAGE_WAITING) for s in after)
    # The page's gauges integrate from its second fresh tick on (the held value before it)...
    total = [s.totals.engine.running_request_seconds[name] for s in quiet]
    assert total[stale] == total[0]  # nothing for the agent's silence, nothing across the change
    assert total[-1] - total[stale + 1] == pytest.approx(PAGE_RUNNING * 0.5 * (len(after) - 1))
    text = metrics(quiet[-1])
    assert value(text, "boundwatch_engine_counts_source", engine=name, source="page") == 1.0
    assert value(text, "boundwatch_engine_counts_source", engine=name, source="agent") == 0.0
    assert value(text, "boundwatch_engine_page_age_seconds", engine=name) == 0.0
    # The agent comes back: its counts serve again, and the page goes back to the slow period.
    back = [await tick(sampler, clock, core) for _ in range(4)]
    assert [s.engines[0].counts_source for s in back] == ["agent"] * 4
    reads = len(server.hits)
    assert [s.engines[0].page_read for s in back[1:]] == [False] * 3
    assert engine.page_reads == reads


async def test_an_engine_read_from_its_multiprocess_files_is_read_every_tick_beside_agent_counts(
    tmp_path,
) -> None:
    # The files cost the engine nothing: with agent counts they are still read every tick, never its page.
    mp_dir = tmp_path / "mp"
    mp_dir.mkdir()
    writer = (
        "import sys; sys.path.insert(0, sys.argv[2]); import vllm_sim\n"
        "vllm_sim.use_multiproc_dir(sys.argv[1]); vllm_sim.fill(vllm_sim.define('0.33'))\n"
    )
    subprocess.run([sys.executable, "-c", writer, str(mp_dir), str(HERE)], check=True)
    clock = Clock(0.0, wall_ns=int(WALL0) * 1_000_000_000)
    server = PageServer(clock)
    await server.start()
    proc = process_table(tmp_path, server.port)
    (proc / "4500" / "environ").write_bytes(f"PROMETHEUS_MULTIPROC_DIR={mp_dir}\0".encode())
    cfg = Config(
        engine=EngineConfig(slow_read_seconds=10.0),
        host=HostConfig(enabled=False, proc_root=str(proc), cgroup_root=str(tmp_path / "cgroup")),
        nvml=NvmlConfig(enabled=False),
        agent=AgentFeedConfig(socket=str(tmp_path / "run" / "agent.sock"), stale_seconds=5.0),
    )
    engine = EngineSource(cfg, clock=clock)
    feed = AgentFeed(cfg.agent, clock=clock, wall_ns=clock.wall_ns)
    await feed.start()
    sampler = Sampler(cfg, [Gpus(), engine, feed], clock=clock, wall=clock.wall)
    core = EngineCore(feed, clock)
    try:
        snaps = [await tick(sampler, clock, core) for _ in range(8)]
    finally:
        feed.close()
        await engine.aclose()
        await server.stop()
    readings = [s.engines[0] for s in snaps]
    assert {r.source for r in readings} == {"multiproc_files"} and all(r.page_read for r in readings)
    assert [r.counts_source for r in readings[1:]] == ["agent"] * 7
    assert readings[-1].running == core.ends[-1][1]  # the agent's, not the files' gauge
    assert readings[-1].generation_tokens_total is not None  # the files' counters, read this tick
    assert server.hits == [] and engine.page_reads == 0
