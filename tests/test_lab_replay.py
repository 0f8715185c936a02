"""The H200 scenario lab's recording, replayed through today's classifier, still passes the lab.

`bench/results/scenarios-recording.jsonl.gz` holds every Snapshot the real daemon took on the H200
while the lab ran its scenarios (real agent, real cgroup quota). Replaying it re-runs the verdict on
real GPU data, so a change to the classifier that would fail the lab fails here first.
"""

import gzip
import json
from pathlib import Path

import pytest

from bench.scenarios.score import Segment, Tick, passed, score
from exporter.analysis.verdict import replay
from exporter.config import Config
from exporter.snapshot.codec import read_lines

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"


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
    with gzip.open(RESULTS / recording, "rt") as fh:
        _, snaps = read_lines(fh)
        replayed = replay(list(snaps), Config())
    ticks = [
        Tick(s.seq, s.at, v.verdict, tuple(v.reasons)) for s in replayed for v in s.verdicts if v.gpu == 0
    ]
    assert len(ticks) >= 150
    rows = score(ticks, segments)
    result = passed(rows)
    assert result["every_scenario_right"] and result["every_switch_in_time"], rows
