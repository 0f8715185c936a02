"""From the agents' reading to counters, histograms, the CUPTI busy ratio and the agents gauge."""

from exporter.analysis import activity, pipeline
from exporter.config import Config
from exporter.export import activity as export_activity
from exporter.snapshot import Snapshot
from exporter.snapshot.agent import AgentReading, AgentState, EngineSteps, GpuActivity
from exporter.snapshot.gpu import GpuReading
from exporter.snapshot.totals import EngineMethod, GpuKind, GpuSource, Totals
from tests.fakes.snapshots import first_tick

MS = 1_000_000
UUID = "GPU-6f5e2c1a-0b7d-4c39-9d0e-2f1a3b4c5d6e"


def seed_snapshot() -> Snapshot:
    """The seed over 10 s: 27% busy, 3.4 s of >1 ms gaps, 139 steps of 72 ms with 19 ms on the GPU."""
    act = GpuActivity(
        gpu=3,
        uuid=UUID,
        observed_ns=10_000 * MS,
        busy_ns=2_700 * MS,
        graph_busy_ns=1_350 * MS,
        kernels=52_000,
        memcpys=139,
        graphs=70,
        dropped=0,
        idle_gap_counts=(0, 0, 0, 0, 0, 0, 138, 0, 0, 0, 0),
        idle_gap_sum_ns=3_400 * MS,
        last_window_busy_ns=135 * MS,
        last_window_ns=500 * MS,
    )
    hist = (0, 0, 0, 0, 0, 139, 0, 0, 0, 0, 0, 0)
    steps = EngineSteps("vllm", 139, 139 * 72 * MS, 139 * 19 * MS, step_hist=hist, tokens=22_240, seqs=22_240)
    reading = AgentReading(
        activity=(act,),
        agents=(
            AgentState(pid=10, gpu=0, state="running", uuid=UUID),
            AgentState(pid=11, gpu=0, state="stale", uuid=UUID),
        ),
        steps=(steps,),
        messages=20,
        bad_messages=1,
    )
    return Snapshot(seq=1, at=0.0, mono=0.0, interval=0.5, dt=0.5, agent=reading)


def test_accumulate_integrates_busy_observed_gaps_records_and_steps() -> None:
    inc = activity.accumulate(seed_snapshot(), Config())
    assert inc.busy.busy_seconds[GpuSource(3, "cupti")] == 2.7
    assert inc.busy.observed_seconds[GpuSource(3, "cupti")] == 10.0
    assert inc.busy.graph_busy_seconds[3] == 1.35
    assert inc.busy.activity_records[GpuKind(3, "kernel")] == 52_000
    assert inc.agent.messages == 20
    assert inc.agent.bad_messages == 1
    assert inc.engine.steps[EngineMethod("vllm", "agent")] == 139
    assert round(inc.engine.step_gpu_seconds["vllm"], 3) == 2.641
    gaps = inc.busy.idle_gaps[3]
    assert gaps.count == 138 and round(gaps.total, 3) == 3.4
    steps = inc.engine.step_seconds["vllm"]
    assert steps.counts[5] == 139 and round(steps.total, 3) == 10.008


def test_tick_without_new_windows_adds_nothing_but_keeps_the_ratio() -> None:
    snap = seed_snapshot()
    assert snap.agent is not None
    idle = GpuActivity(
        gpu=3, uuid=UUID, observed_ns=0, busy_ns=0, last_window_busy_ns=135 * MS, last_window_ns=500 * MS
    )
    snap = Snapshot(seq=2, at=0.5, mono=0.5, interval=0.5, dt=0.5, agent=AgentReading(activity=(idle,)))
    inc = activity.accumulate(snap, Config())
    assert GpuSource(3, "cupti") not in inc.busy.busy_seconds
    assert activity.cupti_busy_ratio(snap) == {3: 0.27}


def test_no_agent_reading_means_no_increments() -> None:
    snap = Snapshot(seq=1, at=0.0, mono=0.0, interval=0.5, dt=0.5)
    assert activity.accumulate(snap, Config()) == Totals()
    assert activity.cupti_busy_ratio(snap) == {}


def test_agents_gauge_counts_states_per_nvml_index() -> None:
    snap = seed_snapshot()
    gpus = (GpuReading(index=3, uuid=UUID, name="NVIDIA H200", driver="580.159.04"),)
    snap = pipeline.resolve_agent_gpus(
        first_tick(gpus=gpus, agent=snap.agent)
    )  # as the daemon's pipeline does
    fam = export_activity.agents(snap)
    values = {(s.labels["gpu"], s.labels["state"]): s.value for s in fam.samples}
    assert values[("3", "running")] == 1 and values[("3", "stale")] == 1
    assert values[("3", "preempted")] == 0 and values[("3", "unavailable")] == 0


def test_steps_timed_where_cupti_saw_no_gpu_work_add_no_step_gpu_seconds() -> None:
    steps = EngineSteps(
        "vllm", 139, 139 * 72 * MS, 0, step_hist=(0,) * 5 + (139,) + (0,) * 6, gpu_measured=False
    )
    snap = Snapshot(seq=1, at=0.0, mono=0.0, interval=0.5, dt=0.5, agent=AgentReading(steps=(steps,)))
    inc = activity.accumulate(snap, Config()).engine
    assert inc.steps[EngineMethod("vllm", "agent")] == 139
    assert "vllm" not in inc.step_gpu_seconds


def test_what_the_agents_dropped_is_summed_per_gpu_vllm_engine_cores_under_no_gpu() -> None:
    """A light agent names no GPU; vLLM's EngineCore one (whose steps go stale) is left out of the states only."""
    gpus = (GpuReading(index=3, uuid=UUID, name="NVIDIA H200", driver="580.159.04"),)
    agents = (
        AgentState(pid=10, gpu=0, state="running", role="vllm_worker", uuid=UUID, dropped_messages=1),
        AgentState(
            pid=11,
            gpu=-1,
            state="running",
            role="vllm_engine",
            mode="light",
            dropped_messages=3,
            stale_steps=2,
        ),
        AgentState(pid=12, gpu=-1, state="running", role="sglang_scheduler", mode="light", stale_steps=1),
    )
    snap = pipeline.resolve_agent_gpus(first_tick(gpus=gpus, agent=AgentReading(agents=agents)))
    rendered = {
        f.spec.name: {s.labels["gpu"]: s.value for s in f.render(snap).samples}
        for f in export_activity.FAMILIES[1:]
    }
    assert rendered["boundwatch_agent_stale_steps"] == {"3": 0, "": 3}
    assert rendered["boundwatch_agent_unsent_messages"] == {"3": 1, "": 3}
    states = {(s.labels["gpu"], s.labels["state"]): s.value for s in export_activity.agents(snap).samples}
    # the EngineCore's agent is not among the states: the SGLang scheduler's alone is on no GPU
    assert states[("3", "running")] == 1 and states[("", "running")] == 1


def test_light_agents_count_for_the_gpu_their_graph_counts_name_so_one_gone_is_missed_there() -> None:
    """Eight GPU workers' light agents (no windows, so no `uuid`) each name their device in their graph counts.

    Each counts for its own GPU (resolved as the daemon's pipeline does), so BoundwatchAgentMissing (per
    gpu) sees one of them go; one whose device NVML does not know gets that device's index past NVML's,
    as a CUPTI agent's windows would, and one with no device yet stays under ''; vLLM's EngineCore agent
    (no CUDA device) stays out of the states, and one in an EngineCore that runs the model (its
    device named) counts for that GPU.
    """
    uuids = [f"GPU-{i:08x}-0000-4000-8000-000000000000" for i in range(8)]
    gpus = tuple(
        GpuReading(index=i, uuid=u, name="NVIDIA H100", driver="580.159.04") for i, u in enumerate(uuids)
    )

    def light(pid: int, role: str, graphs_uuid: str, state: str = "running", stale: int = 0) -> AgentState:
        return AgentState(
            pid=pid, gpu=-1, state=state, role=role, mode="light", graphs_uuid=graphs_uuid, stale_steps=stale
        )

    workers = [light(100 + i, "vllm_worker", u, stale=i) for i, u in enumerate(uuids) if i != 5]
    workers.append(light(105, "vllm_worker", uuids[5], state="stale"))
    others = (
        light(200, "generic", "GPU-not-on-this-host"),
        light(201, "generic", ""),
        light(300, "vllm_engine", "", stale=7),
        light(301, "vllm_engine", uuids[2]),
    )
    snap = pipeline.resolve_agent_gpus(first_tick(gpus=gpus, agent=AgentReading(agents=(*workers, *others))))
    states = {(s.labels["gpu"], s.labels["state"]): s.value for s in export_activity.agents(snap).samples}
    running = {gpu: n for (gpu, state), n in states.items() if state == "running"}
    assert running == {"0": 1, "1": 1, "2": 2, "3": 1, "4": 1, "5": 0, "6": 1, "7": 1, "8": 1, "": 1}
    assert states[("5", "stale")] == 1
    stale = {
        s.labels["gpu"]: s.value
        for s in export_activity.per_gpu_sum(export_activity.c.AGENT_STALE_STEPS, lambda a: a.stale_steps)(
            snap
        ).samples
    }
    assert stale == {"0": 0, "1": 1, "2": 2, "3": 3, "4": 4, "5": 0, "6": 6, "7": 7, "8": 0, "": 7}
