"""The scenario lab's scoring: right-share after the settle time, switch latency."""

from __future__ import annotations

from bench.scenarios.score import Segment, Tick, passed, score


def ticks(
    start: float, seconds: float, verdict: str, reasons: tuple[str, ...] = (), seq0: int = 0
) -> list[Tick]:
    return [Tick(seq0 + i, start + 0.25 + i * 0.5, verdict, reasons) for i in range(int(seconds / 0.5))]


def test_scores_share_after_settle_and_switch_latency() -> None:
    segs = [
        Segment("gpu", "gpu", None, 0.0, 10.0),
        Segment("api", "host", "api_server_saturated", 10.0, 20.0),
    ]
    ts = (
        ticks(0.0, 10.0, "gpu")
        + ticks(10.0, 1.0, "gpu")
        + ticks(11.0, 9.0, "host", ("api_server_saturated",))
    )
    rows = score(ts, segs)
    assert rows[0]["right_share"] == 1.0
    assert rows[1]["ticks_scored"] == 16
    assert rows[1]["right_share"] == 1.0
    assert rows[1]["verdict_changed"] is True
    assert rows[1]["switch_seconds"] == 1.25
    assert passed(rows)["every_switch_in_time"] is True


def test_wrong_reason_and_late_switch_fail() -> None:
    segs = [
        Segment("gpu", "gpu", None, 0.0, 10.0),
        Segment("quota", "host", "cpu_quota_throttled", 10.0, 20.0),
    ]
    ts = ticks(0.0, 12.0, "gpu") + ticks(12.0, 8.0, "host", ("api_server_saturated", "cpu_quota_throttled"))
    rows = score(ts, segs)
    assert rows[1]["switch_seconds"] == 2.25
    assert rows[1]["right_share"] == 1.0 and rows[1]["primary_reason_share"] == 0.0
    result = passed(rows)
    assert result["every_switch_in_time"] is False
    assert rows[1]["wrong"] == []
