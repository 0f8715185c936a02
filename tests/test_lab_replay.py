"""The H200 scenario labs' recordings, replayed through today's classifier, still pass.

`bench/results/scenarios-recording.jsonl.gz` and `scenarios-run2-recording.jsonl.gz` hold every
Snapshot the real daemon took on the H200 while the first lab ran (real agent, real cgroup
quota); `scenarios-h200-*.jsonl.gz` and `scenarios-h100-*.jsonl.gz` those of the field-hard lab on
the lent GPUs (API servers that hold requests before the engine, quotas, eager decode; one per agent
mode and run), with the schedule in the recording's header. Replaying them re-runs the verdict on
real GPU data, so a change to the classifier that would fail a lab fails here first.
"""

import gzip
import json
from pathlib import Path

import pytest

from bench.scenarios.score import Segment, Tick, passed, score
from exporter.analysis.verdict import replay
from exporter.config import Config, VerdictConfig
from exporter.snapshot.codec import read_lines

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"


def _replayed(recording: Path) -> tuple[dict, list[Tick]]:
    with gzip.open(recording, "rt") as fh:
        head, snaps = read_lines(fh)
        replayed = replay(list(snaps), Config())
    ticks = [
        Tick(s.seq, s.at, v.verdict, tuple(v.reasons)) for s in replayed for v in s.verdicts if v.gpu == 0
    ]
    return head, ticks


@pytest.mark.parametrize(
    ("results", "recording"),
    [
        ("scenarios.json", "scenarios-recording.jsonl.gz"),
        ("scenarios-run2.json", "scenarios-run2-recording.jsonl.gz"),
    ],
)
def test_h200_lab_recording_replayed_still_passes(results, recording):
    lab = json.loads((RESULTS / results).read_text())
    segments = [Segment(**s) for s in lab["schedule"]]
    _, ticks = _replayed(RESULTS / recording)
    assert len(ticks) >= 150
    rows = score(ticks, segments)
    result = passed(rows)
    assert result["every_scenario_right"] and result["every_switch_in_time"], rows


H200 = sorted(RESULTS.glob("scenarios-h200-*.jsonl.gz"))
LENT = H200 + sorted(RESULTS.glob("scenarios-h100-*.jsonl.gz"))


def test_the_lent_gpu_recordings_are_there():
    """The replays below run over files: none found would pass them all by running none."""
    assert len(H200) >= 9 and len(LENT) >= len(H200) + 3


@pytest.mark.parametrize("recording", LENT, ids=[p.name for p in LENT])
def test_field_lab_recording_on_a_lent_gpu_replays_at_least_as_right_as_it_ran(recording):
    """Each scenario of the field-lab runs on the lent H200 and H100 (bench/README.md) replays no worse than it scored live."""
    live = json.loads(recording.with_name(recording.name.replace(".jsonl.gz", ".json")).read_text())
    head, ticks = _replayed(recording)
    segments = [Segment(**s) for s in head["schedule"]]
    assert len(segments) >= 7 and recording.stat().st_size < 2_000_000
    replayed = {r["scenario"]: r["right_share"] for r in score(ticks, segments)}
    for row in live["scores"]:
        floor = 0.95 if row["right_share"] >= 0.95 else row["right_share"] - 0.05
        assert replayed[row["scenario"]] >= floor, (row["scenario"], row["right_share"], replayed)


def test_a_recording_replayed_without_gpm_graphics_falls_back_to_utilization():
    """bench.scenarios.busy_sources: the H200 run that read both figures, replayed as if GPM's graphics were off.

    Its `utilization` is the mean of NVML's samples over each tick (a session-15 experiment), as close
    to the truth as GPM; a single read per tick replays worse (bench/README.md, session 15).
    """
    from bench.scenarios import busy_sources

    recording = RESULTS / "scenarios-h200-none-session15-gpm.jsonl.gz"
    with gzip.open(recording, "rt") as fh:
        head, snaps = read_lines(fh)
        snaps = list(snaps)
    stripped = [busy_sources.without_graphics(s) for s in snaps]
    assert all(g.gpm is None or g.gpm.graphics is None for s in stripped for g in s.gpus)
    assert any(g.gpm is not None and g.gpm.graphics is not None for s in snaps for g in s.gpus)
    segments = [Segment(**s) for s in head["schedule"]]
    rows, summary = busy_sources.scored(stripped, segments)
    assert summary["every_scenario_right"], rows
    replayed = replay(stripped[:40], Config())
    assert {s.verdicts[0].busy_source for s in replayed[5:] if s.verdicts} == {"nvml"}
    live = json.loads(recording.with_name(recording.name.replace(".jsonl.gz", ".json")).read_text())
    truth = {int(t[0]): float(t[2]) for t in live["truth_ticks"]}
    steady = next(
        r for r in busy_sources.errors(snaps, truth, segments) if r["scenario"] == "gpu_bound_decode"
    )
    assert steady["gpm"]["abs_error_median"] < 0.02 and steady["nvml"]["abs_error_median"] < 0.02


def test_no_sm_active_means_no_graphics_in_every_h200_recording():
    """Why NvmlSource skips GRAPHICS_UTIL (2 ms of CPU) where SM_UTIL reads 0: on the H200 it then read ~0 too."""
    idle = total = 0
    worst = 0.0
    for recording in H200:
        with gzip.open(recording, "rt") as fh:
            _, snaps = read_lines(fh)
            for snap in snaps:
                g = snap.gpu(0)
                if g is None or g.gpm is None or g.gpm.graphics is None or g.gpm.sm is None:
                    continue
                total += 1
                if g.gpm.sm <= 0.0:
                    idle += 1
                    worst = max(worst, g.gpm.graphics)
    assert total >= 1000 and idle >= 100
    assert worst < 0.001  # under a tenth of a point


@pytest.mark.parametrize(
    "recording",
    [
        "scenarios-h200-none-session16.jsonl.gz",  # eager decode inside the band: where reading less failed
        "scenarios-h200-none-session21.jsonl.gz",
        "scenarios-h200-light-session21.jsonl.gz",
        "scenarios-h200-cupti-session21.jsonl.gz",
    ],
)
def test_graphics_read_only_where_the_verdict_could_turn_changes_no_score_or_switch(recording):
    """bench.scenarios.graphics_reads: the NVML source's own gate, replayed on H200 lab runs, reads under 60% and moves nothing."""
    from bench.scenarios import graphics_reads

    r = graphics_reads.study(RESULTS / recording, graphics_reads.Policy())
    assert r["policy"]["rows"] == r["as_recorded"]["rows"]
    assert r["policy"]["graphics_ticks"] > 250
    assert r["policy"]["graphics_reads"] < 0.6 * r["policy"]["graphics_ticks"]


def test_reading_graphics_every_other_tick_without_a_margin_fails_eager_decode_in_the_replay():
    """The replay above can fail: session 17's every-other-tick estimate kept eager decode wrong for seconds.

    With the band as wide while the engine holds work as without (`queued_busy_low` = `busy_low`,
    as before session 34); the default's narrower band under a queue leaves the estimate less to
    turn on.
    """
    from bench.scenarios import graphics_reads

    wide = Config(verdict=VerdictConfig(queued_busy_low=VerdictConfig().busy_low))
    r = graphics_reads.study(
        RESULTS / "scenarios-h200-none-session16.jsonl.gz",
        graphics_reads.Policy(every=2, margin=0.0, sm_moved=1.0),  # no margin, no bound on the moves
        wide,
    )
    eager = {x["scenario"]: x for x in r["policy"]["rows"]}["eager_decode"]
    assert eager["right_share"] < 0.9 and eager["switch_seconds"] > 5
