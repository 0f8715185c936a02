"""bench/pool_periods.py: runs of the light agent's cost pooled as runs, not as pairs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from bench import pool_periods


def _write(path: Path, runs: list[dict[str, Any]]) -> str:
    path.write_text(json.dumps({"argv": [], "runs": runs}))
    return str(path)


def _run(workload: str, mean: float, se: float, pairs: int) -> dict[str, Any]:
    return {"workload": workload, "pairs": [[0, 0]] * pairs, "cost": {"wall_pct": {"mean": mean, "se": se}}}


def test_runs_are_pooled_by_their_means_and_the_spread_between_them(tmp_path: Path) -> None:
    a = _write(tmp_path / "a.json", [_run("decode_b1", 0.20, 0.01, 60), _run("eager", 3.0, 1.0, 60)])
    b = _write(tmp_path / "b.json", [_run("decode_b1", 0.00, 0.01, 60)])
    rows = pool_periods.runs_of(a, "decode_b1") + pool_periods.runs_of(b, "decode_b1")
    assert [r["mean_pct"] for r in rows] == [0.20, 0.00]  # the other workload is not read
    got = pool_periods.pool(rows, goal=0.1)
    assert got["mean_pct"] == pytest.approx(0.10)
    assert got["se_pct"] == pytest.approx(math.sqrt(0.02) / math.sqrt(2))  # stdev 0.1414 over sqrt(2)
    # each run's own error (0.01) is far under the spread: the pairs' pooled figure would claim 0.007
    assert got["inverse_variance_se_pct"] == pytest.approx(0.01 / math.sqrt(2))
    assert got["runs_under_goal"] == 1
    assert got["mean_under_goal"] is True


def test_short_runs_are_left_out_and_the_command_fails_without_any(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    short = _write(tmp_path / "short.json", [_run("decode_b1", 0.5, 0.1, 3)])
    assert pool_periods.main([short]) == 1
    full = _write(tmp_path / "full.json", [_run("decode_b1", 0.05, 0.02, 40)])
    out = tmp_path / "pooled.json"
    assert pool_periods.main([short, full, "--out", str(out)]) == 0
    pooled = json.loads(out.read_text())
    assert [r["file"] for r in pooled["runs"]] == ["full.json"]
    assert [r["file"] for r in pooled["left_out"]] == ["short.json"]
    assert pooled["pooled"]["runs"] == 1 and pooled["pooled"]["se_pct"] is None
    assert "left out (under 30)" in capsys.readouterr().out
