"""The sampler: concurrent reads, failing and hung sources, bounded history, integrated busy time."""

import asyncio
import dataclasses
import itertools
import threading

import pytest
import structlog

from exporter.config import Config, NvmlConfig
from exporter.sampling import Sampler
from exporter.snapshot.engine import EngineReading, ThreadLoad
from exporter.snapshot.host import CgroupCpu, ProcessCpu
from exporter.snapshot.totals import EngineMethod, GpuSource, Totals
from exporter.sources.base import BlockingReader, Source, SourceUnavailable
from exporter.sources.engine_scrape import raw_from_page
from exporter.sources.nvml import NvmlSource
from tests.fakes.clock import Clock
from tests.fakes.nvml_standin import FakeGpu, FakeNvml


class Broken:
    name = "engine"

    def __init__(self, exc: Exception) -> None:
        self.exc = exc
        self.reads = 0

    async def read(self):
        self.reads += 1
        raise self.exc

    def close(self) -> None:
        pass


class Hung:
    """A blocking source whose call never returns until released."""

    name = "host"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = 0
        self._reader = BlockingReader("hung", timeout=0.05)

    def _block(self):
        self.started += 1
        self.release.wait(5)
        return None

    async def read(self):
        return await self._reader.run(self._block)

    def close(self) -> None:
        self.release.set()
        self._reader.close()


async def test_a_failing_source_is_down_while_the_others_are_up():
    clock = Clock(100.0)
    broken = Broken(ValueError("page is not Prometheus text"))
    nvml = NvmlSource(NvmlConfig(), nvml=FakeNvml())  # type: ignore[arg-type]
    sampler = Sampler(Config(), [nvml, broken], clock=clock)
    for _ in range(3):
        snap = await sampler.tick()
        clock.t += 0.5
    assert snap.source("nvml").up is True
    status = snap.source("engine")
    assert status.up is False and status.errors_total == 3
    assert "not Prometheus" in status.last_error
    assert len(snap.gpus) == 1


async def test_an_absent_party_is_down_but_not_counted_as_an_error():
    sampler = Sampler(Config(), [Broken(SourceUnavailable("no engine found"))], clock=Clock(100.0))
    snap = await sampler.tick()
    assert snap.source("engine").up is False and snap.source("engine").errors_total == 0


async def test_a_hung_blocking_read_times_out_and_is_not_started_again():
    hung = Hung()
    try:
        await down_after_four_ticks(hung)
        assert hung.started == 1
    finally:
        hung.close()


async def down_after_four_ticks(source: Source) -> None:
    """Tick a Sampler of that one source four times; its host reading is down, its read still running."""
    sampler = Sampler(Config(), [source], clock=Clock(100.0))
    for _ in range(4):
        snap = await sampler.tick()
    assert snap.source("host").up is False
    assert "still running" in snap.source("host").last_error


async def test_history_is_bounded_by_history_seconds():
    cfg = Config(tick_seconds=0.5, history_seconds=2.0)
    clock = Clock(100.0)
    sampler = Sampler(cfg, [], clock=clock)
    for _ in range(20):
        await sampler.tick()
        clock.t += 0.5
    hist = sampler.history()
    assert len(hist) == 5 and hist[-1].seq == 20


async def test_nvml_and_gpm_busy_integrate_over_ticks_and_gpm_is_preferred():
    clock = Clock(100.0)
    gpu = FakeGpu(util=50, gpm={1: 27.0, 2: 26.0})
    nvml = NvmlSource(NvmlConfig(), nvml=FakeNvml([gpu]))  # type: ignore[arg-type]
    sampler = Sampler(Config(), [nvml], clock=clock)
    for _ in range(21):  # 20 intervals of 0.5 s = 10 s
        snap = await sampler.tick()
        clock.t += 0.5
    busy = snap.totals.busy.busy_seconds[GpuSource(0, "gpm")]
    observed = snap.totals.busy.observed_seconds[GpuSource(0, "gpm")]
    assert observed == pytest.approx(10.0)
    assert busy == pytest.approx(2.7)  # the seed's 27% busy over 10 s
    assert snap.totals.busy.busy_seconds[GpuSource(0, "nvml")] == pytest.approx(5.0)
    assert snap.busy[0] == (pytest.approx(0.27), "gpm")


async def test_history_keeps_counters_on_the_newest_snapshot_only_and_they_still_integrate():
    clock = Clock(100.0)
    nvml = NvmlSource(NvmlConfig(), nvml=FakeNvml([FakeGpu(util=50) for _ in range(8)]))  # type: ignore[arg-type]
    sampler = Sampler(Config(), [nvml], clock=clock)
    for _ in range(11):
        await sampler.tick()
        clock.t += 0.5
    hist = sampler.history()
    assert all(s.totals == Totals() for s in hist[:-1])
    assert hist[-1].totals.busy.observed_seconds[GpuSource(7, "nvml")] == pytest.approx(5.0)


class PageSource:
    """An engine source that hands a page on raw, as the real one does, its counter moving each tick."""

    name = "engine"

    def __init__(self) -> None:
        self.n = 0

    async def read(self):
        self.n += 1
        page = (
            f'vllm:num_requests_running{{engine="0",model_name="m"}} 3\n'
            f'vllm:iteration_tokens_total_count{{engine="0",model_name="m"}} {10 * self.n}\n'
        )
        return (raw_from_page(page, name="vllm:8000"),)

    def close(self) -> None:
        pass


async def test_only_the_newest_snapshot_keeps_the_engines_raw_pages_and_every_one_is_normalised():
    clock = Clock(100.0)
    sampler = Sampler(Config(), [PageSource()], clock=clock)
    for _ in range(6):
        await sampler.tick()
        clock.t += 0.5
    hist = sampler.history()
    assert [s.engines[0].raw is not None for s in hist] == [False] * 5 + [True]
    newest = hist[-1].engines[0]
    assert (newest.running, newest.iteration_count, newest.steps.total) == (3.0, 60.0, 60.0)
    assert hist[-1].totals.engine.steps[EngineMethod("vllm:8000", "upper_bound")] == pytest.approx(50.0)


async def test_run_ticks_on_schedule_until_stopped():
    cfg = Config(tick_seconds=0.05, history_seconds=10)
    sampler = Sampler(cfg, [])
    stop = asyncio.Event()
    task = asyncio.create_task(sampler.run(stop))
    await asyncio.sleep(0.32)
    stop.set()
    await asyncio.wait_for(task, 1)
    assert 5 <= sampler.latest().seq <= 8


class Slow:
    """An engine that answers in `delay` seconds, like a saturated API server."""

    name = "engine"

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.reads = 0

    async def read(self):
        self.reads += 1
        await asyncio.sleep(self.delay)
        return (EngineReading(name="vllm:8000", kind="vllm", running=float(self.reads)),)

    def close(self) -> None:
        pass


async def test_a_slow_read_does_not_hold_the_tick_and_its_last_reading_is_reused():
    cfg = Config(tick_seconds=0.1, history_seconds=10)
    slow = Slow(0.0)
    sampler = Sampler(cfg, [slow])
    first = await sampler.tick()
    assert first.engines[0].running == 1
    slow.delay = 0.25  # 2.5 ticks
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    second = await sampler.tick()
    assert loop.time() - t0 < 0.2  # the tick waited its budget (80 ms), not the read
    status = second.source("engine")
    assert status.up and status.late and second.engines[0].running == 1
    for _ in range(4):
        snap = await sampler.tick()
    assert slow.reads == 3  # the slow read was awaited again, never started twice
    assert snap.engines[0].running >= 2


async def test_each_source_reports_its_own_read_time_not_that_of_the_slowest_in_the_tick():
    cfg = Config(tick_seconds=0.5, history_seconds=10)
    slow = Slow(0.15)
    nvml = NvmlSource(NvmlConfig(), nvml=FakeNvml())  # type: ignore[arg-type]
    snap = await Sampler(cfg, [nvml, slow]).tick()
    assert snap.source("engine").duration_seconds >= 0.15
    assert snap.source("nvml").duration_seconds < 0.1


async def test_a_read_that_stays_late_past_the_stale_limit_marks_the_source_down():
    cfg = Config(tick_seconds=0.05, history_seconds=10)
    slow = Slow(0.0)
    clock = Clock(100.0)
    sampler = Sampler(cfg, [slow], clock=clock)
    await sampler.tick()
    slow.delay = 10
    clock.t += 3.0  # past the 2 s stale limit
    snap = await sampler.tick()
    assert snap.source("engine").up is False and "still running" in snap.source("engine").last_error
    assert snap.engines == ()
    sampler.close()


async def test_scheduled_probe_runs_while_idle_and_its_result_reaches_the_snapshot_and_metrics():
    from prometheus_client import CollectorRegistry, generate_latest

    from exporter.config import ProbeConfig
    from exporter.export.collectors import SnapshotCollector
    from exporter.probe import logic
    from exporter.probe.scheduled import ProbeScheduler

    calls = []

    async def probe_process(uuid, cfg, url):  # stands in for `python -m exporter probe --json` on the GPU
        calls.append(uuid)
        phase = logic.evaluate_duty_phase(0.5, 0.5, {"cupti": 0.501})
        return logic.finish({"schema": 1, "finished_at": 1.0, "duty": {"phases": [phase]}})

    cfg = Config(probe=ProbeConfig(enabled=True, interval_seconds=600, idle_seconds=2, idle_busy_max=0.02))
    clock, wall = Clock(100.0), Clock(100.0)
    idle = FakeGpu(util=0, gpm={1: 0.0, 2: 0.0})
    nvml = NvmlSource(NvmlConfig(), nvml=FakeNvml([idle]))  # type: ignore[arg-type]
    sampler = Sampler(cfg, [nvml], clock=clock, wall=wall, probes=ProbeScheduler(cfg, runner=probe_process))
    for _ in range(12):  # 6 s of idle ticks
        snap = await sampler.tick()
        clock.t += 0.5
        wall.t += 0.5
        await asyncio.sleep(0)
    assert calls == [idle.uuid]  # once: the interval holds the next run back
    assert snap.probe["0"].success is True
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(sampler.latest, 0.5, 5.0, clock=clock))  # type: ignore[arg-type]
    assert 'boundwatch_probe_success{gpu="0"} 1.0' in generate_latest(registry).decode()
    await sampler.aclose()


class _Lifecycle:
    """A source that records every lifecycle call made to it."""

    name = "engine"

    def __init__(self, fail_start: bool = False) -> None:
        self.calls: list[str] = []
        self.fail_start = fail_start

    async def start(self) -> None:
        self.calls.append("start")
        if self.fail_start:
            raise OSError("socket taken")

    async def read(self) -> tuple:
        self.calls.append("read")
        return ()

    def close(self) -> None:
        self.calls.append("close")

    async def aclose(self) -> None:
        self.calls.append("aclose")


class _SyncOnly:
    name = "host"

    def __init__(self) -> None:
        self.closed = 0

    async def read(self):
        return None

    def close(self) -> None:
        self.closed += 1


async def test_the_sampler_starts_each_source_once_and_closes_each_once_however_often_it_is_closed():
    src, plain = _Lifecycle(), _SyncOnly()
    sampler = Sampler(Config(), [src, plain], clock=Clock(100.0))
    await sampler.start()
    await sampler.tick()
    await sampler.aclose()
    await sampler.aclose()
    sampler.close()
    assert src.calls == ["start", "read", "aclose"]  # aclose where there is one, never close as well
    assert plain.closed == 1


async def test_a_source_that_cannot_start_is_logged_and_still_read_each_tick():
    src = _Lifecycle(fail_start=True)
    sampler = Sampler(Config(), [src], clock=Clock(100.0))
    with structlog.testing.capture_logs() as logs:
        await sampler.start()
    await sampler.tick()
    assert [e["event"] for e in logs] == ["source_start_failed"] and src.calls == ["start", "read"]
    sampler.close()


async def test_the_daemon_leaves_the_sources_lifecycle_to_the_sampler():
    from exporter import daemon

    cfg = Config()
    cfg = dataclasses.replace(cfg, web=dataclasses.replace(cfg.web, address="127.0.0.1", port=0))
    src = _Lifecycle()
    stop = asyncio.Event()
    await asyncio.wait_for(daemon.serve(cfg, sources=[src], stop=stop, on_ready=lambda _port: stop.set()), 30)
    assert src.calls[0] == "start" and src.calls[-1] == "aclose"
    assert src.calls.count("start") == 1 and src.calls.count("aclose") == 1 and "close" not in src.calls


class ChangingEngine:
    """An engine stand-in whose queue grows and drains, so verdicts move between ticks."""

    name = "engine"

    def __init__(self) -> None:
        self.n = 0

    async def read(self):
        n = self.n = self.n + 1
        load = (n * 37 % 100) / 100.0
        server = ProcessCpu(
            4101, "VLLM::APIServer_0", (), load, ThreadLoad(4101, "asyncio", load, min(1.0, load + 0.1))
        )
        throttled = CgroupCpu(
            "/engine",
            2.0,
            usage_seconds=n * 0.9,
            throttled_seconds=n * (n % 4) * 0.05,
            throttled_periods=n * (n % 4),
            periods=n * 5,
        )
        return (
            EngineReading(
                name="vllm:8000",
                kind="vllm",
                running=float(n % 7),
                waiting=float(n % 3),
                gpus=(0, 1, 2, 3),
                api_servers=(server,),
                api_server_count=1,
                cgroups=(throttled,),
                prompt_tokens_total=n * 100.0,
                generation_tokens_total=n * 40.0,
            ),
        )

    def close(self) -> None:
        pass


async def _run(compacting: bool, monkeypatch, ticks: int = 60):
    import exporter.sampling as sampling

    if not compacting:
        monkeypatch.setattr(sampling, "compact", lambda snap, gpus=None: snap)
    clock = Clock(100.0)
    gpus = [FakeGpu(uuid=f"GPU-{i}") for i in range(4)]
    nvml = NvmlSource(NvmlConfig(), nvml=FakeNvml(gpus))  # type: ignore[arg-type]
    sampler = Sampler(Config(tick_seconds=0.5, history_seconds=10.0), [nvml, ChangingEngine()], clock=clock)
    seen = []
    for k in range(ticks):
        for i, g in enumerate(gpus):
            g.util = (k * 13 + i * 29) % 101
            g.gpm = {1: float((k * 7 + i * 11) % 100), 2: float((k * 5 + i) % 100)}
            g.reasons = 0x4 if (k + i) % 9 < 3 else 0
        snap = await sampler.tick()
        seen.append((snap.verdicts, snap.totals, dict(snap.busy)))
        clock.t += 0.5
    monkeypatch.undo()
    return sampler, seen


async def test_compact_older_snapshots_change_no_verdict_and_no_counter(monkeypatch):
    compacting, with_compact = await _run(True, monkeypatch)
    whole, without = await _run(False, monkeypatch)
    assert with_compact == without
    hist = compacting.history()
    assert len(hist) == 21
    old, newest = hist[0], hist[-1]
    assert all(v.evidence == () for v in old.verdicts) and any(v.evidence for v in newest.verdicts)
    assert old.gpus[0].power_watts is None and old.gpus[0].utilization is not None
    kept = whole.history()[0]  # the same tick, not compacted
    assert old.seq == kept.seq and kept.gpus[0].power_watts is not None
    assert old.engines[0].running == kept.engines[0].running is not None
    assert [(v.gpu, v.verdict, v.reasons) for v in old.verdicts] == [
        (v.gpu, v.verdict, v.reasons) for v in kept.verdicts
    ]
    # the windows' reach (1.5 s) and two ticks to spare stay whole: 4.5 s before the newest is compact
    whole = [s for s in hist if s.gpus and s.gpus[0].power_watts is not None]
    assert 5 <= len(whole) <= 8 and whole[-1] is newest


def test_a_compact_record_keeps_what_the_full_one_had_but_evidence_and_readings():
    from exporter import sampling
    from exporter.snapshot import GpuReading, Snapshot
    from exporter.snapshot.verdict import Verdict

    kept = ("gpu", "verdict", "reasons", "busy_ratio", "busy_source", "evidence", "raw", "streak", "offered")
    assert tuple(f.name for f in dataclasses.fields(Verdict)) == (
        *kept,
        "edges",
    )  # a new field: keep it in without_evidence, or drop it there as edges (only the newest's are read)
    v = Verdict(
        3, "host", ("unknown",), 0.4, "gpm", (("busy", 0.4),), raw="gpu", streak=1, offered=True, edges=(0.7,)
    )
    assert v.without_evidence() == dataclasses.replace(v, evidence=(), edges=())
    gpus = tuple(
        GpuReading(i, f"GPU-{i}", "H200", "580", power_watts=300.0, utilization=u)
        for i, u in enumerate((0.5, 0.0, -0.0, 1, 1.0, None))
    )
    snap = Snapshot(seq=1, at=0.0, mono=0.0, interval=0.5, dt=0.5, gpus=gpus, verdicts=(v,))
    shared = sampling.CompactGpus()
    firsts = sampling.compact(snap, shared).gpus
    for share in (shared, None):  # again from the shared records, then from none
        old = sampling.compact(snap, share)
        assert old.verdicts == (dataclasses.replace(v, evidence=(), edges=()),)
        assert [repr(g) for g in old.gpus] == [
            repr(GpuReading(g.index, g.uuid, g.name, g.driver, utilization=g.utilization)) for g in gpus
        ]
        # one record per kind where shared (0.0 and -0.0 never: one key, two values); a history's own
        assert [a is b for a, b in zip(old.gpus, firsts, strict=True)] == (
            [True, False, False, True, True, True] if share else [False] * 6
        )
    tiny = sampling.CompactGpus(size=2)  # bounded: past its size it starts afresh
    for i in range(5):
        tiny(GpuReading(i, f"GPU-{i}", "H200", "580", utilization=0.5))
    assert len(tiny._kept) <= 2


def test_a_snapshot_finds_each_gpu_by_index_the_first_of_a_repeated_index():
    from exporter.snapshot import GpuReading, Snapshot

    for n in (3, 64):
        gpus = tuple(
            GpuReading(i % (n - 1), f"GPU-{i}", "H200", "580") for i in range(n)
        )  # the last repeats 0
        snap = Snapshot(seq=1, at=0.0, mono=0.0, interval=0.5, dt=0.5, gpus=gpus)
        assert [snap.gpu(i).uuid for i in range(n - 1)] == [f"GPU-{i}" for i in range(n - 1)]  # type: ignore[union-attr]
        assert snap.gpu(n) is None and snap == Snapshot(
            seq=1, at=0.0, mono=0.0, interval=0.5, dt=0.5, gpus=gpus
        )


async def test_the_daemon_collects_young_objects_less_often_while_serving_and_restores_the_collector():
    import gc

    from exporter import daemon

    cfg = Config()
    cfg = dataclasses.replace(cfg, web=dataclasses.replace(cfg.web, address="127.0.0.1", port=0))
    before = gc.get_threshold()
    seen: list[tuple[int, ...]] = []
    stop = asyncio.Event()

    def ready(_port: int) -> None:
        asyncio.get_running_loop().call_later(0.2, lambda: (seen.append(gc.get_threshold()), stop.set()))

    await asyncio.wait_for(daemon.serve(cfg, sources=[_Lifecycle()], stop=stop, on_ready=ready), 30)
    assert seen and seen[0][0] == max(before[0], daemon.GC_YOUNG_THRESHOLD) and seen[0][1:] == before[1:]
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


class Started:
    """A source with start_read(): the Sampler takes its future and never calls read()."""

    name = "host"

    def __init__(self, reader: BlockingReader, fn) -> None:
        self.reader, self.fn = reader, fn
        self.reads = self.starts = 0

    async def read(self):
        self.reads += 1
        return await self.reader.run(self.fn)

    def start_read(self):
        self.starts += 1
        return self.reader.submit(self.fn)

    def close(self) -> None:
        self.reader.close()


async def test_a_source_with_start_read_is_read_through_its_future_without_a_task():
    from exporter.snapshot.host import HostReading

    reading = HostReading(cpus=4, cpu_busy=0.25)
    src = Started(BlockingReader("started", timeout=1.0), lambda: reading)
    sampler = Sampler(Config(), [src], clock=Clock(100.0))
    try:
        snap = await sampler.tick()
        snap = await sampler.tick()
    finally:
        src.close()
    assert src.starts == 2 and src.reads == 0
    assert snap.host == reading and snap.source("host").up is True


async def test_a_hung_read_through_start_read_is_down_as_through_read_and_not_started_again():
    hung = Hung()
    release = threading.Event()
    started = []

    def block():
        started.append(1)
        release.wait(5)

    src = Started(hung._reader, block)
    try:
        await down_after_four_ticks(src)
        assert len(started) == 1
    finally:
        release.set()
        hung.close()


async def test_a_start_read_that_raises_fails_that_source_only():
    class Raising:
        name = "host"

        async def read(self):
            raise AssertionError("read() is not called when start_read() exists")

        def start_read(self):
            raise RuntimeError("can't start new thread")

        def close(self) -> None:
            pass

    nvml = NvmlSource(NvmlConfig(), nvml=FakeNvml())  # type: ignore[arg-type]
    sampler = Sampler(Config(), [nvml, Raising()], clock=Clock(100.0))
    try:
        snap = await sampler.tick()
    finally:
        nvml.close()
    assert snap.source("nvml").up is True
    assert snap.source("host").up is False and "can't start new thread" in snap.source("host").last_error


async def test_reads_in_threads_come_back_together_each_with_its_own_read_time():
    import time

    from exporter.snapshot.host import HostReading

    def slow_read():
        time.sleep(0.15)
        return ()

    fast = Started(BlockingReader("fast", timeout=1.0), lambda: HostReading(cpus=4, cpu_busy=0.25))
    slow = Started(BlockingReader("slow", timeout=1.0), slow_read)
    slow.name = "nvml"
    sampler = Sampler(Config(tick_seconds=0.5, history_seconds=10), [fast, slow], clock=Clock(100.0))
    try:
        snap = await sampler.tick()
    finally:
        fast.close()
        slow.close()
    assert (
        snap.source("host").up and snap.source("nvml").up and snap.host == HostReading(cpus=4, cpu_busy=0.25)
    )
    assert snap.source("nvml").duration_seconds >= 0.15
    assert snap.source("host").duration_seconds < 0.1  # its own read, not the wait for the slow one


async def test_a_hung_read_in_a_thread_holds_the_others_back_only_until_the_budget():
    from exporter.snapshot.host import HostReading

    hung = Hung()
    release = threading.Event()
    stuck = Started(hung._reader, lambda: release.wait(5))
    stuck.name = "nvml"
    fast = Started(BlockingReader("fast", timeout=1.0), lambda: HostReading(cpus=2, cpu_busy=0.5))
    cfg = Config(tick_seconds=0.1, history_seconds=10)
    sampler = Sampler(cfg, [stuck, fast], clock=Clock(100.0))
    loop = asyncio.get_running_loop()
    try:
        for _ in range(3):
            t0 = loop.time()
            snap = await sampler.tick()
            assert loop.time() - t0 < 0.5  # the budget (80 ms), not the hung read
            assert snap.source("host").up and snap.host == HostReading(cpus=2, cpu_busy=0.5)
            assert snap.source("host").duration_seconds < 0.08
        assert snap.source("nvml").up is False
    finally:
        release.set()
        hung.close()
        fast.close()


MS = 1_000_000


class CuptiAgents:
    """An agent feed stand-in: per GPU one process's 0.5 s CUPTI window a tick (two on GPU 1 every third
    tick, unioned in analysis), its packed busy intervals moving, and its engine core's steps."""

    name = "agent"

    def __init__(self, uuids: list[str]) -> None:
        from exporter.snapshot.agent import AgentState

        self.uuids = uuids
        self.n = 0
        self.states = tuple(
            AgentState(pid=900 + i, gpu=i, state="running", role="vllm_worker", uuid=u)
            for i, u in enumerate(uuids)
        )

    def window(self, pid: int, t0: int, k: int):
        from exporter import wire
        from exporter.snapshot.agent import AgentWindow

        starts = [t0 + (s * 40 + k % 9) * MS for s in range(12)]
        spans = [(a, a + (1 + (k * 7 + j * pid) % 30) * MS) for j, a in enumerate(starts)]
        iv, slack = wire.pack_intervals(spans, t0)
        busy = sum(e - s for s, e in spans)
        gaps = tuple((k + pid + j) % 3 for j in range(wire.IDLE_GAP_BUCKET_COUNT))
        return AgentWindow(
            pid,
            t0,
            t0 + 500 * MS,
            busy,
            kernels=12 + k,
            gap_counts=gaps,
            gap_sum_ns=sum(gaps) * MS,
            iv=iv,
            slack_ns=slack,
        )

    async def read(self):
        from exporter.snapshot.agent import AgentReading, EngineSteps, GpuWindows

        k = self.n = self.n + 1
        t0 = 1_764_400_000_000_000_000 + k * 500 * MS
        windows = []
        for i, u in enumerate(self.uuids):
            own = [self.window(900 + i, t0, k)]
            if i == 1 and k % 3 == 0:  # a second process on GPU 1: the union counts their overlap once
                own.append(self.window(990, t0, k + 5))
            windows.append(GpuWindows(gpu=i, uuid=u, running=len(own), windows=tuple(own)))
        steps = (
            EngineSteps(
                "vllm:8000", steps=10 + k % 5, wall_ns=400 * MS, gpu_busy_ns=0, pid=4100, running=float(k % 7)
            ),
        )
        return AgentReading(agents=self.states, steps=steps, messages=len(windows), windows=tuple(windows))

    def close(self) -> None:
        pass


async def _run_agents(keep_windows: bool, monkeypatch, ticks: int = 30):
    import exporter.sampling as sampling

    if keep_windows:  # as before: a retired Snapshot kept its agents' raw windows
        real = sampling.retire
        monkeypatch.setattr(
            sampling, "retire", lambda snap: dataclasses.replace(real(snap), agent=snap.agent)
        )
    clock = Clock(100.0)
    gpus = [FakeGpu(uuid=f"GPU-{i}") for i in range(4)]
    nvml = NvmlSource(NvmlConfig(), nvml=FakeNvml(gpus))  # type: ignore[arg-type]
    sources = [nvml, ChangingEngine(), CuptiAgents([g.uuid for g in gpus])]
    sampler = Sampler(Config(tick_seconds=0.5, history_seconds=10.0), sources, clock=clock)
    seen, made = [], []
    for k in range(ticks):
        for i, g in enumerate(gpus):
            g.util = (k * 13 + i * 29) % 101
            g.gpm = {1: float((k * 7 + i * 11) % 100), 2: float((k * 5 + i) % 100)}
        snap = await sampler.tick()
        seen.append((snap.verdicts, snap.totals, dict(snap.busy), snap.agent))
        made.append(snap)
        clock.t += 0.5
    monkeypatch.undo()
    return sampler, seen, made


async def test_only_the_newest_snapshot_keeps_the_agents_raw_windows_and_nothing_read_changes(monkeypatch):
    """A retired Snapshot drops its agents' raw windows (their intervals) as it drops the engines' pages:
    every tick's verdicts with their evidence, counters, busy figures and agent reading are the same."""
    dropping, with_drop, made = await _run_agents(False, monkeypatch)
    keeping, without, _ = await _run_agents(True, monkeypatch)
    assert with_drop == without  # each tick's newest Snapshot, its raw windows included
    hist, kept = dropping.history(), keeping.history()
    assert [bool(s.agent and s.agent.windows) for s in hist] == [False] * (len(hist) - 1) + [True]
    assert sum(bool(s.agent and s.agent.windows) for s in kept) >= 5  # before: every whole one its windows
    whole = [s for s in hist if s.agent is not None]  # the compact records keep no agent reading at all
    assert 5 <= len(whole) <= 8 and whole[-1] is hist[-1]
    by_seq = {s.seq: s for s in made}
    for s in whole[:-1]:
        # the reading's other parts are the very objects analysis read, so what it found is found again
        a, b = s.agent, by_seq[s.seq].agent
        assert a.activity is b.activity and a.agents is b.agents and a.steps is b.steps and a.union is b.union
        assert a.activity and b.windows and a == dataclasses.replace(b, windows=())
    assert any(a.processes == 2 for s in whole for a in s.agent.activity)  # a union among them


async def test_the_sampler_hands_each_verdicts_edges_to_nvml_which_then_reads_graphics_only_near_one():
    """The verdict (analysis) says where it could turn; the NVML source (through follow) reads GRAPHICS_UTIL only there."""
    clock = Clock(100.0)
    gpu = FakeGpu(gpm={1: 99.0, 2: 95.0})  # no engine: the verdict could turn at idle_busy and busy_high only
    nvml_module = FakeNvml([gpu])
    graphics_reads = []
    real = nvml_module.nvmlGpmMetricsGet

    def counted(req):  # type: ignore[no-untyped-def]
        ids = {req.metrics[i].metricId for i in range(req.numMetrics)}
        graphics_reads.append(nvml_module.NVML_GPM_METRIC_GRAPHICS_UTIL in ids)
        return real(req)

    nvml_module.nvmlGpmMetricsGet = counted  # type: ignore[method-assign]
    gated = NvmlConfig(graphics_estimate=True)
    sampler = Sampler(Config(), [NvmlSource(gated, nvml=nvml_module)], clock=clock)  # type: ignore[arg-type]
    snaps = []
    for _ in range(17):
        snaps.append(await sampler.tick())
        clock.t += 0.5
    assert snaps[-1].verdicts[0].edges == (0.02, 0.85)
    assert (
        sum(graphics_reads) == 3
    )  # the first read (no verdict yet), then every eighth: 0.99 is far from both
    estimated = [s.gpus[0].gpm.graphics_estimated for s in snaps]  # type: ignore[union-attr]
    assert [i for i, e in enumerate(estimated) if not e] == [0, 8, 16]
    assert all(s.verdicts[0].verdict == "gpu" for s in snaps)
    gpu.gpm = {1: 80.0, 2: 77.0}  # SM moved: read at once, and 0.80 is near 0.85: read while it stays
    for _ in range(3):
        snap = await sampler.tick()
        clock.t += 0.5
        assert snap.gpus[0].gpm is not None and not snap.gpus[0].gpm.graphics_estimated
    assert snap.busy[0] == (pytest.approx(0.80), "gpm")


class Ahead(Started):
    """A source read in a reader thread of its own (as NVML and the engine are): `run` may start it ahead."""

    reads_in_thread = True


async def test_run_starts_threaded_reads_ahead_so_the_loop_wakes_once_a_tick_and_reads_stay_on_time():
    import time

    from exporter.snapshot.host import HostReading

    ran: list[float] = []

    def read():
        ran.append(time.monotonic())
        return ()

    class OnLoop:  # read on the event loop when the tick starts, as the host and the agents' feed are
        name = "host"
        starts = 0

        async def read(self):
            raise AssertionError("start_read() is used")

        def start_read(self):
            self.starts += 1
            future = asyncio.get_running_loop().create_future()
            future.set_result(HostReading(cpus=2, cpu_busy=0.5))
            return future

        def close(self) -> None:
            pass

    nvml, host = Ahead(BlockingReader("nvml", timeout=1.0), read), OnLoop()
    nvml.name = "nvml"
    monos: list[float] = []
    sampler = Sampler(
        Config(tick_seconds=0.1, history_seconds=10), [nvml, host], on_tick=lambda s: monos.append(s.mono)
    )
    loop = asyncio.get_running_loop()
    waits = []
    select = loop._selector.select  # type: ignore[attr-defined]

    def counted(timeout=None):
        events = select(timeout)
        if timeout is None or timeout > 0:
            waits.append((timeout, len(events)))
        return events

    loop._selector.select = counted  # type: ignore[attr-defined]
    stop = asyncio.Event()
    try:
        task = asyncio.create_task(sampler.run(stop))
        await asyncio.sleep(0.35)
        waits.clear()
        ticks0, ran0 = sampler.latest().seq, len(ran)
        await asyncio.sleep(1.0)
        ticks, reads = sampler.latest().seq - ticks0, len(ran) - ran0
        stop.set()
        await asyncio.wait_for(task, 1)
    finally:
        loop._selector.select = select  # type: ignore[attr-defined]
        nvml.close()
    assert 8 <= ticks <= 11 and reads == ticks
    # the loop sleeps until the thread hands the read back: one wake a tick, where starting the read at
    # the tick's time made two (the tick's timer, then the hand-back)
    assert len(waits) <= ticks + 2, waits
    # each tick's read ran at its time (the tick's, as it was due): not a tick early
    assert all(any(abs(m - r) < 0.02 for r in ran) for m in monos[1:]), (monos, ran)
    assert all(b - a > 0.05 for a, b in itertools.pairwise(ran)), ran  # one read a tick
    snap = sampler.latest()
    assert snap.host == HostReading(cpus=2, cpu_busy=0.5)
    assert snap.source("nvml").duration_seconds < 0.05  # its read, not the wait for its time
    assert (
        len(ran) <= nvml.starts <= len(ran) + 1 and host.starts == snap.seq
    )  # one ahead of the stop: dropped


async def test_a_tick_read_ahead_is_timed_by_when_its_reads_were_due_not_by_the_slowest_one():
    import time

    starts: list[float] = []

    def read():  # every other read takes 60 ms of a 100 ms tick, as an engine's page can
        starts.append(time.monotonic())
        if len(starts) % 2 == 0:
            time.sleep(0.06)
        return ()

    nvml = Ahead(BlockingReader("nvml", timeout=1.0), read)
    nvml.name = "nvml"
    snaps = []
    sampler = Sampler(Config(tick_seconds=0.1, history_seconds=10), [nvml], on_tick=snaps.append)
    stop = asyncio.Event()
    try:
        task = asyncio.create_task(sampler.run(stop))
        await asyncio.sleep(1.0)
        stop.set()
        await asyncio.wait_for(task, 1)
    finally:
        nvml.close()
    assert len(snaps) >= 8
    # each tick is timed by its read's start (due then), so dt spans what the reads span: a tick timed by
    # its wake would sit 60 ms after every other read, and dt would swing 0.04 / 0.16 s
    for snap in snaps[1:]:
        assert min(abs(snap.mono - r) for r in starts) < 0.01, (snap.mono, starts)
        assert snap.dt == pytest.approx(snap.mono - snaps[snaps.index(snap) - 1].mono)
    assert snaps[-1].source("nvml").up
