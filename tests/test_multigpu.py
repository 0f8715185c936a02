"""Eight GPUs: every GPU's verdict, reasons and figures from its own engine, through the real pipeline and /metrics.

Each shape's engines are real, titled processes in a PID namespace of their own
(tests/fakes/multigpu_tree.py), with CUDA_VISIBLE_DEVICES set per process as vLLM and SGLang set it;
discovery and placement read that process table. The NVML stand-in plays eight H200s, with
process lists filled (bare metal) or empty (a container), and the daemon's sampler, pipeline and
collectors do the rest.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.analysis import pipeline
from exporter.config import Config, NvmlConfig
from exporter.export.collectors import SnapshotCollector
from exporter.sampling import Sampler
from exporter.snapshot import Snapshot
from exporter.snapshot.agent import AgentReading, AgentState, EngineSteps, GpuActivity
from exporter.snapshot.engine import EngineReading, Placement, ThreadLoad
from exporter.snapshot.gpu import GpuReading
from exporter.snapshot.host import ProcessCpu
from exporter.snapshot.totals import GpuSource
from exporter.sources.nvml import NvmlSource
from tests.fakes.clock import Clock
from tests.fakes.nvml_standin import FakeGpu, FakeNvml

HERE = Path(__file__).parent
TREE = HERE / "fakes" / "multigpu_tree.py"
UUIDS = [f"GPU-{i:08x}-1111-2222-3333-444455556666" for i in range(8)]
TICK_NS = 500_000_000

needs_namespace = pytest.mark.skipif(
    shutil.which("unshare") is None or os.geteuid() != 0, reason="needs unshare and root for a PID namespace"
)


# --- the process table ----------------------------------------------------------------------


def node(title: str, cvd: str | None = None, children: list[dict] | None = None) -> dict:
    return {
        "argv": [title],
        "env": {"CUDA_VISIBLE_DEVICES": cvd} if cvd is not None else {},
        "children": children or [],
    }


def vllm(port: int, cores: list[dict], extra: tuple[str, ...] = ()) -> dict:
    """Return `vllm serve` with one API server and the given engine cores."""
    return {
        "argv": ["vllm", "serve", "m", "--port", str(port), *extra],
        "children": [node("VLLM::APIServer_0"), *cores],
    }


def core(tp: int, cvd: str | None, dp: int | None = None) -> dict:
    """Return a vLLM EngineCore with `tp` workers, each started with `cvd` (workers inherit it)."""
    suffix = f"_DP{dp}" if dp is not None else ""
    workers = [node(f"VLLM::Worker{suffix}_TP{r}", cvd) for r in range(tp)]
    return node(f"VLLM::EngineCore{suffix}", cvd, workers if tp > 1 else [])


def tree(spec: list[dict]) -> dict[str, dict]:
    """Start the processes in a PID namespace; return each discovered engine, with `titles` by pid."""
    out = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, str(TREE), json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=HERE.parent,
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    engines = {e["name"]: e for e in data["engines"]}
    for e in engines.values():
        assert e["source_placements"] == e["placements"]  # the engine source's readings carry them
        e["titles"] = {int(pid): t for pid, t in data["titles"].items() if int(pid) in e["engine_pids"]}
    return engines


def pid_of(engine: dict, title: str) -> int:
    return next(pid for pid, t in engine["titles"].items() if t == title)


# --- readings -------------------------------------------------------------------------------


def server(pid: int, thread_cpu: float) -> ProcessCpu:
    main = ThreadLoad(tid=pid, name="python3", cpu=thread_cpu, runnable=min(1.0, thread_cpu + 0.01))
    return ProcessCpu(pid, "VLLM::APIServer_0", ("VLLM::APIServer_0",), thread_cpu + 0.03, main)


def reading(found: dict, running: float, waiting: float, api_cpu: float = 0.05) -> EngineReading:
    """Return an engine's reading as the engine source builds it: the page's figures, its processes."""
    return EngineReading(
        name=found["name"],
        kind=found["kind"],
        running=running,
        waiting=waiting,
        max_num_seqs=256,
        api_servers=tuple(server(p, api_cpu) for p in found["api_server_pids"]),
        api_server_count=len(found["api_server_pids"]),
        pids=tuple(found["engine_pids"]),
        cuda_visible_devices=found["cuda_visible_devices"],
        placements=tuple(Placement(**p) for p in found["placements"]),
    )


def gpus(busy: dict[int, float], pids: dict[int, tuple[int, ...]] | None = None) -> list[FakeGpu]:
    """Return eight stand-in H200s at the given GPM busy shares (0 elsewhere), with NVML's process lists."""
    out = []
    for i in range(8):
        b = busy.get(i, 0.0)
        out.append(
            FakeGpu(
                uuid=UUIDS[i], util=round(b * 100), gpm={1: b * 100, 2: b * 100}, pids=(pids or {}).get(i, ())
            )
        )
    return out


def steps(
    pid: int,
    n: int,
    step_s: float,
    running: float | None = None,
    waiting: float | None = None,
    dp: int | None = None,
) -> EngineSteps:
    """Return one tick of agent steps counted in an engine core (named by kind only, joined by pid)."""
    return EngineSteps(
        engine="vllm", steps=n, wall_ns=round(n * step_s * 1e9), gpu_busy_ns=0, gpu_measured=False,
        pid=pid, running=running, waiting=waiting, dp_rank=dp,
    )  # fmt: skip


class Fixed:
    """A source that returns the same reading every tick (the scene is steady)."""

    def __init__(self, name: str, value: object) -> None:
        self.name, self.value = name, value

    async def read(self) -> object:
        return self.value

    def close(self) -> None:
        pass


async def run(
    fake: list[FakeGpu] | None,
    engines: list[EngineReading],
    agent: AgentReading | None = None,
    ticks: int = 9,
) -> tuple[Snapshot, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    """Run the daemon's sampler for `ticks` half-second ticks; return the newest Snapshot and /metrics."""
    clock, wall = Clock(1000.0), Clock(1_764_400_000.0)
    sources: list[object] = [Fixed("engine", tuple(engines))]
    if fake is not None:
        sources.append(NvmlSource(NvmlConfig(), nvml=FakeNvml(fake), clock=clock))  # type: ignore[arg-type]
    if agent is not None:
        sources.append(Fixed("agent", agent))
    sampler = Sampler(Config(), sources, clock=clock, wall=wall)  # type: ignore[arg-type]
    for _ in range(ticks):
        await sampler.tick()
        clock.t += 0.5
        wall.t += 0.5
    for s in sources:
        s.close()  # type: ignore[attr-defined]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(sampler.latest, 0.5, 5.0, clock=clock))  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    page = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }
    snap = sampler.latest()
    assert snap is not None
    return snap, page


def bound(page: dict, gpu: int) -> str:
    """Return the verdict /metrics shows for a GPU (the one-hot series at 1)."""
    hot = [
        dict(k[1])["verdict"]
        for k, v in page.items()
        if k[0] == "boundwatch_bound" and dict(k[1])["gpu"] == str(gpu) and v == 1.0
    ]
    assert len(hot) == 1, hot
    return hot[0]


def reasons(page: dict, gpu: int) -> set[str]:
    return {
        dict(k[1])["reason"]
        for k, v in page.items()
        if k[0] == "boundwatch_bound_reason" and dict(k[1])["gpu"] == str(gpu) and v == 1.0
    }


def engine_gpus(page: dict, engine: str) -> dict[int, str]:
    """Return the GPUs /metrics lists for an engine, with how each was found."""
    return {
        int(dict(k[1])["gpu"]): dict(k[1])["placed_by"]
        for k in page
        if k[0] == "boundwatch_engine_gpu_info" and dict(k[1])["engine"] == engine
    }


def evidence(snap: Snapshot, gpu: int) -> dict[str, object]:
    return dict(next(v for v in snap.verdicts if v.gpu == gpu).evidence)


# --- shapes ---------------------------------------------------------------------------------


@needs_namespace
@pytest.mark.parametrize("tp", [2, 4, 8])
async def test_tensor_parallel_engine_drives_its_workers_gpus_and_the_rest_idle(tp):
    found = tree([vllm(8000, [core(tp, None)])])["vllm:8000"]  # bare metal: no CUDA_VISIBLE_DEVICES
    workers = [pid_of(found, f"VLLM::Worker_TP{r}") for r in range(tp)]
    fake = gpus({i: 0.97 for i in range(tp)}, {i: (workers[i],) for i in range(tp)})
    snap, page = await run(fake, [reading(found, 100, 10)])
    assert engine_gpus(page, "vllm:8000") == {i: "nvml_pids" for i in range(tp)}
    assert page[("boundwatch_engine_gpus", (("engine", "vllm:8000"),))] == tp
    for gpu in range(8):
        if gpu < tp:
            assert bound(page, gpu) == "gpu"
            assert (evidence(snap, gpu)["running"], evidence(snap, gpu)["waiting"]) == (100.0, 10.0)
        else:
            assert bound(page, gpu) == "idle" and "running" not in evidence(snap, gpu)


def _two_engines(cvd: bool) -> list[dict]:
    return [
        vllm(8000, [core(4, "0,1,2,3" if cvd else None)]),
        vllm(8001, [core(4, "4,5,6,7" if cvd else None)]),
    ]


def _probe_scene(found: dict[str, dict]) -> tuple[list[EngineReading], AgentReading]:
    """Return the issue's probe: A host-bound (API server saturated, 160 running), B GPU-bound (64 + 20)."""
    a, b = found["vllm:8000"], found["vllm:8001"]
    engines = [reading(a, 160, 0, api_cpu=0.99), reading(b, 64, 20)]
    agent = AgentReading(
        steps=(
            steps(pid_of(a, "VLLM::EngineCore"), 7, 0.072),
            steps(pid_of(b, "VLLM::EngineCore"), 25, 0.020),
        )
    )
    return engines, agent


def _assert_probe(snap: Snapshot, page: dict, placed_by: str) -> None:
    assert engine_gpus(page, "vllm:8000") == {i: placed_by for i in range(4)}
    assert engine_gpus(page, "vllm:8001") == {i: placed_by for i in range(4, 8)}
    for gpu in range(4):
        ev = evidence(snap, gpu)
        assert bound(page, gpu) == "host" and "api_server_saturated" in reasons(page, gpu)
        assert (ev["running"], ev["waiting"]) == (160.0, 0.0)
        assert ev["step_seconds"] == pytest.approx(0.072)
        assert ev["steps_per_second"] == pytest.approx(14.0)
        assert ev["api_server_thread_cpu"] == pytest.approx(0.99)
    for gpu in range(4, 8):
        ev = evidence(snap, gpu)
        assert bound(page, gpu) == "gpu" and reasons(page, gpu) == set()
        assert (ev["running"], ev["waiting"]) == (64.0, 20.0)  # B's alone: never 224
        assert ev["step_seconds"] == pytest.approx(0.020)
        assert ev["api_server_thread_cpu"] == pytest.approx(0.05)  # A's saturated server is not B's evidence
    steps_a = page[("boundwatch_engine_steps_total", (("engine", "vllm:8000"), ("method", "agent")))]
    steps_b = page[("boundwatch_engine_steps_total", (("engine", "vllm:8001"), ("method", "agent")))]
    assert steps_a > 0 and steps_a / 7 == pytest.approx(steps_b / 25)  # each engine's own steps, once


@needs_namespace
async def test_two_tp4_engines_mapped_by_nvml_process_lists():
    found = tree(_two_engines(cvd=False))
    pids = {
        i + 4 * k: (pid_of(found[name], f"VLLM::Worker_TP{i}"),)
        for k, name in enumerate(("vllm:8000", "vllm:8001"))
        for i in range(4)
    }
    engines, agent = _probe_scene(found)
    fake = gpus({**{i: 0.27 for i in range(4)}, **{i: 0.97 for i in range(4, 8)}}, pids)
    snap, page = await run(fake, engines, agent)
    _assert_probe(snap, page, "nvml_pids")


@needs_namespace
async def test_two_tp4_engines_in_a_container_mapped_by_each_workers_cuda_visible_devices():
    found = tree(_two_engines(cvd=True))
    engines, agent = _probe_scene(found)
    fake = gpus({**{i: 0.27 for i in range(4)}, **{i: 0.97 for i in range(4, 8)}})  # NVML lists no process
    snap, page = await run(fake, engines, agent)
    _assert_probe(snap, page, "placement")


@needs_namespace
async def test_mapping_failure_says_no_gpu_mapping_instead_of_summing_engines():
    found = tree(_two_engines(cvd=False))
    engines, agent = _probe_scene(found)
    fake = gpus({**{i: 0.27 for i in range(4)}, **{i: 0.97 for i in range(4, 8)}})  # no process list, no CVD
    snap, page = await run(fake, engines, agent)
    for gpu in range(8):
        assert bound(page, gpu) == "unknown" and reasons(page, gpu) == {"no_gpu_mapping"}
        ev = evidence(snap, gpu)
        assert "running" not in ev and "api_server_thread_cpu" not in ev and "step_seconds" not in ev
    assert engine_gpus(page, "vllm:8000") == {} and engine_gpus(page, "vllm:8001") == {}
    assert page[("boundwatch_engine_gpus", (("engine", "vllm:8000"),))] == 0
    # Per-engine figures stay right: each engine's own steps, once.
    steps_a = page[("boundwatch_engine_steps_total", (("engine", "vllm:8000"), ("method", "agent")))]
    steps_b = page[("boundwatch_engine_steps_total", (("engine", "vllm:8001"), ("method", "agent")))]
    assert steps_a / 7 == pytest.approx(steps_b / 25)


@needs_namespace
async def test_two_tp4_engines_in_a_container_mapped_by_their_workers_light_agents_devices():
    """The mapping failure's shape (no process list, no CUDA_VISIBLE_DEVICES: a pod's sidecar), but each
    worker runs the default light agent, whose graph counts name its CUDA device: both engines placed."""
    found = tree(_two_engines(cvd=False))
    engines, agent = _probe_scene(found)
    workers = [
        AgentState(
            pid=pid_of(found[name], f"VLLM::Worker_TP{i}"),
            gpu=-1,
            state="running",
            role="vllm_worker",
            mode="light",
            graphs_uuid=UUIDS[i + 4 * k],
        )
        for k, name in enumerate(("vllm:8000", "vllm:8001"))
        for i in range(4)
    ]
    agent = dataclasses.replace(agent, agents=tuple(workers))
    fake = gpus({**{i: 0.27 for i in range(4)}, **{i: 0.97 for i in range(4, 8)}})  # NVML lists no process
    snap, page = await run(fake, engines, agent)
    _assert_probe(snap, page, "agent")
    running = {
        dict(k[1])["gpu"]: v
        for k, v in page.items()
        if k[0] == "boundwatch_agents" and dict(k[1])["state"] == "running"
    }
    assert running == {str(i): 1 for i in range(8)}  # each worker's agent counted for its own GPU


@needs_namespace
async def test_steps_no_engine_owns_count_for_the_gpu_their_light_agent_names():
    """Two vLLM engines (steps named by kind alone cannot tell whose); steps from processes that neither
    engine lists join neither. Each came from a light agent whose graph counts name its device: they
    count for that GPU alone (resolve_agent_gpus names the agent's GPU), as a CUPTI agent's would."""
    found = tree(_two_engines(cvd=True))
    engines, _ = _probe_scene(found)
    strangers = (990_001, 990_002)  # not among either engine's processes
    agent = AgentReading(
        steps=(steps(strangers[0], 7, 0.072), steps(strangers[1], 25, 0.020)),
        agents=tuple(
            AgentState(pid=pid, gpu=-1, state="running", role="generic", mode="light", graphs_uuid=UUIDS[gpu])
            for pid, gpu in zip(strangers, (1, 6), strict=True)
        ),
    )
    fake = gpus({**{i: 0.27 for i in range(4)}, **{i: 0.97 for i in range(4, 8)}})
    snap, _ = await run(fake, engines, agent)
    assert evidence(snap, 1)["step_seconds"] == pytest.approx(0.072)
    assert evidence(snap, 6)["step_seconds"] == pytest.approx(0.020)
    for gpu in (0, 2, 3, 4, 5, 7):  # the same engines' other GPUs: no agent of theirs sent these steps
        assert "step_seconds" not in evidence(snap, gpu), gpu


@needs_namespace
async def test_data_parallel_ranks_each_drive_their_own_four_gpus():
    spec = [vllm(8000, [core(4, "0,1,2,3", dp=0), core(4, "4,5,6,7", dp=1)], ("--data-parallel-size", "2"))]
    found = tree(spec)["vllm:8000"]
    dp0, dp1 = pid_of(found, "VLLM::EngineCore_DP0"), pid_of(found, "VLLM::EngineCore_DP1")
    agent = AgentReading(steps=(steps(dp0, 10, 0.040, 30, 0, dp=0), steps(dp1, 16, 0.025, 50, 5, dp=1)))
    snap, page = await run(gpus({i: 0.97 for i in range(8)}), [reading(found, 80, 5)], agent)
    assert engine_gpus(page, "vllm:8000") == {i: "placement" for i in range(8)}
    assert dict(snap.engines[0].core_gpus) == {dp0: (0, 1, 2, 3), dp1: (4, 5, 6, 7)}
    for gpu in range(8):
        ev = evidence(snap, gpu)
        assert bound(page, gpu) == "gpu" and ev["counts_source"] == "agent"
        want = (30.0, 0.0, 0.040) if gpu < 4 else (50.0, 5.0, 0.025)
        assert (ev["running"], ev["waiting"], ev["step_seconds"]) == pytest.approx(want)
    total = page[("boundwatch_engine_steps_total", (("engine", "vllm:8000"), ("method", "agent")))]
    assert total > 0 and total % 26 == 0  # both ranks' steps, each once per tick


@needs_namespace
async def test_data_parallel_ranks_that_each_see_every_gpu_take_their_rank_s_share():
    # vLLM sets each rank's devices in the environment; a launcher that does not leaves all eight
    # visible to both ranks: rank r's TP rank t then uses ordinal r x TP + t.
    every = ",".join(str(i) for i in range(8))
    spec = [vllm(8000, [core(4, every, dp=0), core(4, every, dp=1)], ("--data-parallel-size", "2"))]
    found = tree(spec)["vllm:8000"]
    dp0, dp1 = pid_of(found, "VLLM::EngineCore_DP0"), pid_of(found, "VLLM::EngineCore_DP1")
    snap, page = await run(gpus({i: 0.97 for i in range(8)}), [reading(found, 80, 5)])
    assert dict(snap.engines[0].core_gpus) == {dp0: (0, 1, 2, 3), dp1: (4, 5, 6, 7)}
    assert engine_gpus(page, "vllm:8000") == {i: "placement" for i in range(8)}


@needs_namespace
async def test_sglang_tp8_schedulers_each_on_their_gpu_count_the_engines_steps_once():
    sched = [node(f"sglang::scheduler_TP{r}", ",".join(UUIDS)) for r in range(8)]
    spec = [
        {
            "argv": [
                "python",
                "-m",
                "sglang.launch_server",
                "--enable-metrics",
                "--port",
                "30000",
                "--tp",
                "8",
            ],
            "children": sched,
        }
    ]
    found = tree(spec)["sglang:30000"]
    pids = [pid_of(found, f"sglang::scheduler_TP{r}") for r in range(8)]
    # Every TP rank's scheduler counts the same batch; the engine made 20 steps per tick, not 160.
    agent = AgentReading(
        steps=tuple(dataclasses.replace(steps(p, 20, 0.030, 96, 0), engine="sglang") for p in pids)
    )
    engine = dataclasses.replace(reading(found, 96, 0), api_servers=())
    snap, page = await run(gpus({i: 0.95 for i in range(8)}), [engine], agent)
    assert engine_gpus(page, "sglang:30000") == {i: "placement" for i in range(8)}
    for gpu in range(8):
        ev = evidence(snap, gpu)
        assert bound(page, gpu) == "gpu"
        assert (ev["running"], ev["steps_per_second"], ev["step_seconds"]) == pytest.approx(
            (96.0, 40.0, 0.030)
        )
    one = page[("boundwatch_engine_steps_total", (("engine", "sglang:30000"), ("method", "agent")))]
    two = (await run(gpus({i: 0.95 for i in range(8)}), [engine], AgentReading(steps=agent.steps[:1])))[1]
    assert one == two[("boundwatch_engine_steps_total", (("engine", "sglang:30000"), ("method", "agent")))]


@needs_namespace
async def test_two_engines_sharing_one_gpu_both_drive_it_and_the_other_seven_are_idle():
    found = tree([vllm(8000, [core(1, "3")]), vllm(8001, [core(1, "3")])])  # one process each, no workers
    engines = [reading(found["vllm:8000"], 10, 0), reading(found["vllm:8001"], 20, 2)]
    snap, page = await run(gpus({3: 0.5}), engines)
    assert engine_gpus(page, "vllm:8000") == {3: "placement"} and engine_gpus(page, "vllm:8001") == {
        3: "placement"
    }
    ev = evidence(snap, 3)
    assert (ev["running"], ev["waiting"]) == (30.0, 2.0)  # both engines on it
    assert bound(page, 3) == "host"
    assert all(bound(page, g) == "idle" for g in range(8) if g != 3)


@needs_namespace
async def test_an_engine_on_a_subset_leaves_idle_gpus_beside_it_by_uuid_in_cuda_visible_devices():
    found = tree([vllm(8000, [core(2, f"{UUIDS[6]},{UUIDS[7][:12]}")])])["vllm:8000"]
    snap, page = await run(gpus({6: 0.98, 7: 0.98}), [reading(found, 40, 0)])
    assert engine_gpus(page, "vllm:8000") == {6: "placement", 7: "placement"}
    assert [bound(page, g) for g in range(8)] == ["idle"] * 6 + ["gpu", "gpu"]
    assert evidence(snap, 6)["running"] == 40.0 and "running" not in evidence(snap, 5)


# --- no process table needed ----------------------------------------------------------------


async def test_single_gpu_host_places_an_unmapped_engine_on_its_gpu():
    engine = EngineReading(name="vllm:8000", kind="vllm", running=160.0, waiting=0.0)
    snap, page = await run([FakeGpu(uuid=UUIDS[0], util=27, gpm={1: 27.0})], [engine])
    assert engine_gpus(page, "vllm:8000") == {0: "lone_gpu"}
    assert bound(page, 0) == "host" and evidence(snap, 0)["running"] == 160.0


async def test_gpus_a_reading_names_itself_stay_and_say_so():
    engine = EngineReading(name="vllm:8000", kind="vllm", running=4.0, waiting=0.0, gpus=(5,))
    snap, page = await run(gpus({5: 0.98}), [engine])
    assert engine_gpus(page, "vllm:8000") == {5: "reading"}
    assert bound(page, 5) == "gpu" and bound(page, 4) == "idle"
    assert snap.engines[0].gpus_from == "reading"


def _activity(uuid: str, busy: float) -> GpuActivity:
    b = round(busy * TICK_NS)
    return GpuActivity(
        gpu=0, uuid=uuid, observed_ns=TICK_NS, busy_ns=b, last_window_busy_ns=b, last_window_ns=TICK_NS
    )


def _agent_snap(seq: int, acts: list[GpuActivity], gpus_: tuple[GpuReading, ...] = ()) -> Snapshot:
    agents = tuple(AgentState(pid=100 + i, gpu=0, state="running", uuid=a.uuid) for i, a in enumerate(acts))
    return Snapshot(
        seq=seq, at=seq * 0.5, mono=seq * 0.5, interval=0.5, dt=0.5 if seq else 0.0, gpus=gpus_,
        agent=AgentReading(activity=tuple(acts), agents=agents),
    )  # fmt: skip


def test_without_nvml_two_agents_on_ordinal_0_are_two_gpus_with_stable_indices():
    u1, u2 = "GPU-aaaaaaaa-0000", "GPU-bbbbbbbb-0000"
    cfg = Config()
    history: list[Snapshot] = []
    for seq, acts in enumerate([[_activity(u1, 0.3), _activity(u2, 0.9)]] * 3 + [[_activity(u2, 0.8)]]):
        history.append(pipeline.advance(history, _agent_snap(seq, acts), cfg))
    first, last = history[2], history[-1]
    assert first.busy == {0: (0.3, "cupti"), 1: (0.9, "cupti")}
    assert last.busy[1] == (0.8, "cupti")  # u2 keeps index 1 after u1 stops reporting
    assert last.gpu_uuids == (u1, u2)
    observed = last.totals.busy.observed_seconds
    assert observed[GpuSource(0, "cupti")] == pytest.approx(1.5) and observed[
        GpuSource(1, "cupti")
    ] == pytest.approx(2.0)


def test_with_nvml_an_unknown_uuid_gets_an_index_past_nvmls_never_one_of_its_gpus():
    nvml = tuple(GpuReading(index=i, uuid=UUIDS[i], name="NVIDIA H200", driver="580") for i in range(8))
    mig = "MIG-5c4f1e2a-0000"
    snap = pipeline.advance(
        [], _agent_snap(0, [_activity(UUIDS[5], 0.5), _activity(mig, 0.2)], nvml), Config()
    )
    assert snap.agent is not None
    assert sorted((a.uuid, a.gpu) for a in snap.agent.activity) == [(UUIDS[5], 5), (mig, 8)]
    assert {a.uuid: a.gpu for a in snap.agent.agents} == {UUIDS[5]: 5, mig: 8}


def test_uuid_indices_are_bounded():
    many = [_activity(f"GPU-{i:04d}", 0.1) for i in range(pipeline.MAX_UUID_INDICES + 5)]
    snap = pipeline.resolve_agent_gpus(_agent_snap(0, many))
    assert len(snap.gpu_uuids) == pipeline.MAX_UUID_INDICES
    assert (
        snap.agent is not None and len(snap.agent.activity) == pipeline.MAX_UUID_INDICES
    )  # the rest dropped


def test_uuids_that_came_and_went_give_their_places_to_a_gpu_that_comes_later():
    """64 made-up UUIDs, then forgotten by the feed: a real GPU's agent still gets an index and its busy."""
    cfg = Config()
    junk = [_activity(f"GPU-junk-{i:02d}", 0.0) for i in range(pipeline.MAX_UUID_INDICES)]
    history = [pipeline.advance([], _agent_snap(0, junk), cfg)]
    assert len(history[-1].gpu_uuids) == pipeline.MAX_UUID_INDICES
    real = "GPU-6f5e0000-real"
    history.append(pipeline.advance(history, _agent_snap(1, [*junk[1:], _activity(real, 0.7)]), cfg))
    snap = history[-1]
    assert snap.gpu_uuids[0] == real and snap.gpu_uuids[1:] == tuple(
        a.uuid for a in junk[1:]
    )  # the others keep theirs
    assert snap.agent is not None and {a.uuid: a.gpu for a in snap.agent.activity}[real] == 0
    assert snap.busy[0] == (0.7, "cupti")
    full = pipeline.advance(
        history, _agent_snap(2, [*junk[1:], _activity(real, 0.7), _activity("GPU-x", 0.1)]), cfg
    )
    assert "GPU-x" not in full.gpu_uuids  # every place named now: none taken from a GPU in use


def test_agents_place_their_engine_by_uuid_with_or_without_nvml():
    nvml = tuple(GpuReading(index=i, uuid=UUIDS[i], name="NVIDIA H200", driver="580") for i in range(8))
    engine = EngineReading(name="vllm:8000", kind="vllm", running=8.0, waiting=0.0, pids=(10, 11, 12))
    agents = (
        AgentState(pid=11, gpu=0, state="running", role="vllm_worker", uuid=UUIDS[2]),
        AgentState(pid=12, gpu=1, state="running", role="vllm_worker", uuid=UUIDS[3]),
        AgentState(pid=99, gpu=0, state="running", uuid=UUIDS[5]),  # another process's agent
    )
    raw = Snapshot(
        seq=0, at=0.0, mono=0.0, interval=0.5, dt=0.0, engines=(engine,), agent=AgentReading(agents=agents)
    )
    with_nvml = pipeline.advance([], dataclasses.replace(raw, gpus=nvml), Config())
    assert (with_nvml.engines[0].gpus, with_nvml.engines[0].gpus_from) == ((2, 3), "agent")
    without = pipeline.advance([], raw, Config())
    assert without.gpu_uuids == (UUIDS[2], UUIDS[3], UUIDS[5])
    assert (without.engines[0].gpus, without.engines[0].gpus_from) == ((0, 1), "agent")
    assert [v.gpu for v in without.verdicts] == [0, 1]  # the GPUs the engine's agents name, by UUID


def test_placements_and_uuid_indices_survive_a_recording():
    from exporter.snapshot import codec

    engine = EngineReading(
        name="vllm:8000", kind="vllm", gpus=(0, 1), gpus_from="placement",
        placements=(Placement(5, "worker", 4, "0,1", 1, 0),), core_gpus=((4, (0, 1)),),
    )  # fmt: skip
    snap = Snapshot(seq=1, at=0.0, mono=0.0, interval=0.5, dt=0.5, engines=(engine,), gpu_uuids=("MIG-1",))
    assert codec.from_json(json.loads(json.dumps(codec.to_json(snap)))) == snap
