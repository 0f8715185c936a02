"""Snapshot <-> JSON: a recording reads back as the same Snapshots."""

from __future__ import annotations

import dataclasses
import io
import json
from types import MappingProxyType

import pytest

from exporter.analysis import verdict as v
from exporter.config import Config
from exporter.serve import web
from exporter.snapshot import HistogramValue, ProbeSummary, codec
from exporter.snapshot.agent import AgentReading, AgentWindow, GpuWindows, UnionState
from exporter.snapshot.totals import (
    AgentTotals,
    BusyTotals,
    EngineMethod,
    EngineTotals,
    GpuSource,
    GpuVerdict,
    Totals,
    VerdictTotals,
)
from tests.fakes.verdict_scenes import SEED, Recorder, Scene


def seed_snapshots() -> list:
    rec = Recorder()
    rec.run(
        Scene(**SEED, api_cpu=0.99, quota_cores=0.5, throttled_share=0.6, step_ms=72, step_gpu_ms=19), 2.0
    )
    out = v.replay(rec.snaps, Config())
    last = out[-1]
    totals = Totals(
        busy=BusyTotals(
            busy_seconds=MappingProxyType({GpuSource(0, "gpm"): 0.4}),
            idle_gaps=MappingProxyType({0: HistogramValue((0.001, 0.002), (1.0, 2.0, 0.0), 0.004)}),
        ),
        agent=AgentTotals(messages=3.0, refused=MappingProxyType({"overlap": 1.0})),
        engine=EngineTotals(steps=MappingProxyType({EngineMethod("vllm:8000", "agent"): 7.0})),
        verdict=VerdictTotals(bound_seconds=MappingProxyType({GpuVerdict(0, "host"): 1.5})),
    )
    out[-1] = dataclasses.replace(
        last,
        totals=totals,
        probe=MappingProxyType(
            {"0": ProbeSummary("pass", True, 1.8e9, 4.2e12, 0.875, MappingProxyType({"cupti": -0.0005}))}
        ),
    )
    return out


def test_round_trip_is_exact() -> None:
    for snap in seed_snapshots():
        data = json.loads(json.dumps(codec.to_json(snap)))
        assert codec.from_json(data) == snap


def test_round_trip_keeps_types() -> None:
    snap = seed_snapshots()[-1]
    back = codec.from_json(json.loads(json.dumps(codec.to_json(snap))))
    assert isinstance(back.engines[0].api_servers[0].cmdline, tuple)
    assert list(back.busy) == [0]
    assert back.verdicts[0].reasons == snap.verdicts[0].reasons
    assert back.totals.busy.idle_gaps[0].counts == (1.0, 2.0, 0.0)
    assert list(back.totals.verdict.bound_seconds) == [GpuVerdict(0, "host")]


def test_recording_lines_read_back_without_counters() -> None:
    snaps = seed_snapshots()
    buf = io.StringIO()
    buf.write(codec.header(tick_seconds=0.5) + "\n")
    for s in snaps:
        buf.write(codec.dumps(s) + "\n")
    head, back = codec.read_lines(io.StringIO(buf.getvalue()))
    got = list(back)
    assert head["tick_seconds"] == 0.5
    assert len(got) == len(snaps)
    assert got[-1].totals == Totals()
    assert '"totals"' not in codec.dumps(snaps[-1])
    assert got[-1].engines == snaps[-1].engines
    assert got[-1].agent == snaps[-1].agent


def test_reads_the_daemons_snapshot_page() -> None:
    snap = seed_snapshots()[-1]
    page = web.snapshot_page(snap)
    assert page["counters"]["boundwatch_bound_seconds_total{0,host}"] == 1.5
    back = codec.from_json(json.loads(json.dumps(page)))
    assert back.engines == snap.engines
    assert back.busy == snap.busy
    assert back.totals == snap.totals


def test_reads_pages_and_recordings_written_before_the_totals_were_typed() -> None:
    data = codec.to_json(seed_snapshots()[-1], totals=False)
    data["counters"] = {"boundwatch_bound_seconds_total{0,host}": 1.5}  # an older /api/snapshot
    data["histograms"] = []  # an older recording line
    back = codec.from_json(json.loads(json.dumps(data)))
    assert back.totals == Totals() and back.engines == seed_snapshots()[-1].engines


def test_reads_a_probe_written_as_the_untyped_summary_mapping() -> None:
    # What the daemon's record() kept and recordings carried before ProbeSummary: {"0": {...}}.
    data = codec.to_json(seed_snapshots()[0], totals=False)
    data["probe"] = {
        "0": {
            "status": "fail",
            "success": False,
            "timestamp": 1800000000,
            "hbm_bandwidth_bytes_per_second": None,
            "hbm_bandwidth_ratio": None,
            "duty_errors": {"gpm": 0.06},
            "message": "GPM reads 6 points high",
        }
    }
    back = codec.from_json(json.loads(json.dumps(data))).probe["0"]
    assert back == ProbeSummary("fail", False, 1.8e9, None, None, {"gpm": 0.06}, "GPM reads 6 points high")
    assert isinstance(back.timestamp, float)


def test_rejects_a_file_that_is_not_a_recording() -> None:
    with pytest.raises(ValueError, match="not a boundwatch recording"):
        codec.read_lines(io.StringIO('{"seq": 1}\n'))


def test_ignores_unknown_fields_from_a_newer_writer() -> None:
    data = codec.to_json(seed_snapshots()[0])
    data["added_later"] = 1
    data["engines"][0]["new_figure"] = 2
    assert codec.from_json(data).engines[0].running == 160


def test_raw_agent_windows_and_the_union_state_round_trip() -> None:
    w = AgentWindow(
        pid=7, t0=10**18, t1=10**18 + 5 * 10**8, busy_ns=10**8, iv=(0, 100_000), gap_counts=(0, 1)
    )
    reading = AgentReading(
        windows=(GpuWindows(gpu=0, uuid="GPU-1", running=2, windows=(w,)),),
        union=(UnionState(0, "GPU-1", None, 10**8, 5 * 10**8),),
    )
    snap = dataclasses.replace(seed_snapshots()[-1], agent=reading)
    back = codec.from_json(json.loads(json.dumps(codec.to_json(snap))))
    assert back.agent == reading and isinstance(back.agent.windows[0].windows[0].iv, tuple)


def test_a_recording_whose_agent_reading_has_only_merged_activity_still_decodes() -> None:
    data = codec.to_json(seed_snapshots()[-1], totals=False)
    data["agent"] = {
        "activity": [{"gpu": 0, "uuid": "GPU-1", "observed_ns": 500, "busy_ns": 100}],
        "messages": 2,
    }
    back = codec.from_json(json.loads(json.dumps(data)))
    assert back.agent is not None and back.agent.windows == () and back.agent.union == ()
    assert back.agent.activity[0].busy_ns == 100
