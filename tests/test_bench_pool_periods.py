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


def _period(wall: float, idle: float) -> dict[str, float]:
    return {"wall_us": wall, "idle_us": idle}


def test_pairs_are_split_by_how_slow_the_host_was_the_mean_of_their_two_periods(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pairs = (
        [{"on": _period(1001.0, 21.0), "off": _period(1000.0, 20.0)}] * 3  # a quick host: +0.1%
        + [{"on": _period(1006.0, 33.0), "off": _period(1000.0, 27.0)}]
        * 2  # on over 30, off under: the pair's mean, 30
        + [{"on": _period(1050.0, 61.0), "off": _period(1040.0, 51.0)}] * 2  # a slow host
    )
    run = {**_run("decode_b1", 0.5, 0.1, 0), "pairs": pairs}
    path = _write(tmp_path / "r.json", [run])
    short = _write(tmp_path / "s.json", [{**_run("decode_b1", 0.5, 0.1, 0), "pairs": pairs[:1]}])
    got = pool_periods.strata([path, short], "decode_b1", [40.0, 26.0], min_pairs=2)
    assert [s["pairs"] for s in got] == [3, 2, 2]  # edges sorted; the one-pair run left out
    assert (got[0]["idle_us_from"], got[0]["idle_us_to"], got[2]["idle_us_to"]) == (None, 26.0, None)
    assert got[0]["mean_pct"] == pytest.approx(0.1) and got[0]["idle_added_us_median"] == pytest.approx(1.0)
    assert got[1]["mean_pct"] == pytest.approx(0.6) and got[1]["idle_added_us_mean"] == pytest.approx(6.0)
    assert got[2]["mean_pct"] == pytest.approx(100 * 10 / 1040)
    out = tmp_path / "pooled.json"
    assert pool_periods.main([path, "--min-pairs", "1", "--strata", "26,40", "--out", str(out)]) == 0
    assert [s["pairs"] for s in json.loads(out.read_text())["strata"]] == [3, 2, 2]
    assert "26-40 us: 2 pairs, +0.600" in capsys.readouterr().out


def test_strata_that_are_not_numbers_are_refused_before_any_file_is_read(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        pool_periods.main(["/nonexistent.json", "--strata", "26,forty"])
    assert exc.value.code == 2 and "--strata takes numbers" in capsys.readouterr().err
