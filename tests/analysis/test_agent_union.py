"""The agents' raw windows merged per GPU: one process as it measured, several unioned, state carried."""

import dataclasses

import pytest

from exporter import wire
from exporter.analysis import agent_union, pipeline
from exporter.config import Config
from exporter.snapshot import Snapshot
from exporter.snapshot.agent import AgentReading, AgentWindow, GpuActivity, GpuWindows, UnionState

MS = 1_000_000
T0 = 1_764_400_000_000_000_000
UUID = "GPU-6f5e2c1a-0b7d-4c39-9d0e-2f1a3b4c5d6e"


def win(pid: int, t0: int, busy: list[tuple[int, int]], **kw: object) -> AgentWindow:
    """Return one process's 500 ms window whose busy intervals are given in ms from t0."""
    ivs = [(t0 + s * MS, t0 + e * MS) for s, e in busy]
    packed, slack = wire.pack_intervals(ivs, t0)
    total = sum(e - s for s, e in ivs)
    return AgentWindow(pid=pid, t0=t0, t1=t0 + 500 * MS, busy_ns=total, iv=packed, slack_ns=slack, **kw)  # type: ignore[arg-type]


def gpu(*windows: AgentWindow, running: int = 1, uuid: str = UUID) -> GpuWindows:
    return GpuWindows(gpu=0, uuid=uuid, running=running, windows=windows)


def test_one_process_is_taken_as_it_measured_its_own_gaps() -> None:
    w = win(7, T0, [(10, 145)], kernels=410, graph_busy_ns=90 * MS, gap_counts=(0,) * 6 + (2,) + (0,) * 4)
    w = dataclasses.replace(w, gap_sum_ns=170 * MS)
    (a,) = agent_union.merge(AgentReading(windows=(gpu(w),)), None).activity
    assert (a.uuid, a.observed_ns, a.busy_ns, a.graph_busy_ns, a.kernels) == (
        UUID,
        500 * MS,
        135 * MS,
        90 * MS,
        410,
    )
    assert (a.idle_gap_counts[6], a.idle_gap_sum_ns, a.processes) == (2, 170 * MS, 1)
    assert a.last_window_busy_ns / a.last_window_ns == pytest.approx(0.27)


def test_two_processes_overlapping_on_one_gpu_count_their_overlap_once() -> None:
    reading = AgentReading(windows=(gpu(win(1, T0, [(0, 300)]), win(2, T0, [(200, 400)]), running=2),))
    (a,) = agent_union.merge(reading, None).activity
    assert (a.busy_ns, a.observed_ns, a.processes) == (400 * MS, 500 * MS, 2)


def test_an_idle_gap_across_windows_is_found_once_in_the_union() -> None:
    first = AgentReading(windows=(gpu(win(1, T0, [(0, 100)]), win(2, T0, [(50, 200)]), running=2),))
    merged = agent_union.merge(first, None)
    assert merged.activity[0].idle_gap_sum_ns == 0
    t1 = T0 + 500 * MS  # both idle from 200 ms of the first window to 40 ms of the second: 340 ms
    second = AgentReading(windows=(gpu(win(1, t1, [(40, 60)]), win(2, t1, [(45, 90)]), running=2),))
    (a,) = agent_union.merge(second, merged).activity
    assert (a.idle_gap_sum_ns, sum(a.idle_gap_counts)) == (340 * MS, 1)


def test_a_tick_without_windows_keeps_the_newest_ratio_while_its_agents_run() -> None:
    merged = agent_union.merge(AgentReading(windows=(gpu(win(1, T0, [(0, 450)])),)), None)
    (a,) = agent_union.merge(AgentReading(windows=(gpu(running=1),)), merged).activity
    assert (a.observed_ns, a.busy_ns, a.last_window_busy_ns, a.last_window_ns) == (0, 0, 450 * MS, 500 * MS)
    assert agent_union.merge(AgentReading(windows=(gpu(running=0),)), merged).activity == ()


def test_the_union_state_survives_a_tick_without_agents() -> None:
    merged = agent_union.merge(AgentReading(windows=(gpu(win(1, T0, [(0, 450)])),)), None)
    quiet = agent_union.merge(AgentReading(), merged)
    assert quiet.union == (UnionState(0, UUID, T0 + 450 * MS, 450 * MS, 500 * MS),)
    (a,) = agent_union.merge(AgentReading(windows=(gpu(running=1),)), quiet).activity
    assert a.last_window_busy_ns == 450 * MS


def test_a_recording_without_raw_windows_keeps_its_activity() -> None:
    old = AgentReading(activity=(GpuActivity(gpu=0, uuid=UUID, observed_ns=500 * MS, busy_ns=100 * MS),))
    assert agent_union.merge(old, None) is old


def test_a_mig_or_ordinal_key_carries_no_uuid_in_its_activity() -> None:
    mig = gpu(win(1, T0, [(0, 100)]), uuid="MIG-1c2d")
    (a,) = agent_union.merge(AgentReading(windows=(mig,)), None).activity
    assert a.uuid == ""


def _snap(seq: int, reading: AgentReading) -> Snapshot:
    return Snapshot(
        seq=seq, at=1.7e9 + seq / 2, mono=seq / 2, interval=0.5, dt=0.5 if seq > 1 else 0.0, agent=reading
    )


def test_replay_merges_a_recordings_raw_windows_again_as_the_daemon_did() -> None:
    ticks = [
        AgentReading(windows=(gpu(win(1, T0, [(0, 100)]), win(2, T0, [(50, 300)]), running=2),)),
        AgentReading(windows=(gpu(running=2),)),
        AgentReading(
            windows=(
                gpu(win(1, T0 + 500 * MS, [(100, 200)]), win(2, T0 + 500 * MS, [(150, 250)]), running=2),
            )
        ),
    ]
    live: list[Snapshot] = []
    for seq, reading in enumerate(ticks, start=1):
        live.append(pipeline.advance(live, _snap(seq, reading), Config()))
    recorded = [
        dataclasses.replace(s, agent=dataclasses.replace(s.agent, activity=(), union=()))
        for s in live
        if s.agent
    ]
    replayed = pipeline.replay(recorded, Config())
    assert [s.agent.activity for s in replayed if s.agent] == [s.agent.activity for s in live if s.agent]
    assert replayed[2].agent is not None and replayed[2].agent.activity[0].idle_gap_sum_ns == 300 * MS
