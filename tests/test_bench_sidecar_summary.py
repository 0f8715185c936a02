"""bench/sidecar_cost.py's summary: each GPU count's figures read as medians over the pairs, both sides."""

from __future__ import annotations

from typing import Any

import pytest

from bench.sidecar_cost import summarise


def _row(gpus: int, mine: float, other: float | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {"gpus": gpus, "cpu_share_of_core": mine}
    if other is not None:
        row["ab"] = {"cpu_share_of_core_a": other, "ratio_b_over_a": round(mine / other, 3)}
    return row


def test_an_a_over_a_reads_every_figure_of_both_sides() -> None:
    rows = [
        _row(8, 0.0070, 0.0080),
        _row(8, 0.0075, 0.0069),
        _row(64, 0.0185, 0.0187),
        _row(8, 0.0072, 0.0074),
    ]
    got = summarise(rows)
    assert list(got) == ["8", "64"]
    eight = got["8"]
    assert eight["pairs"] == 3
    assert eight["this_pct"] == [0.7, 0.75, 0.72]
    assert eight["this_median_pct"] == pytest.approx(0.72)
    assert eight["ab_median_pct"] == pytest.approx(0.74)
    assert eight["both_median_pct"] == pytest.approx((0.72 + 0.74) / 2)  # six figures: the middle two
    assert eight["ratio_median"] == pytest.approx(0.973)


def test_without_ab_only_this_trees_figures() -> None:
    got = summarise([_row(1, 0.0135), _row(1, 0.0140)])["1"]
    assert got["this_median_pct"] == pytest.approx(1.375)
    assert "ab_pct" not in got and "both_median_pct" not in got
