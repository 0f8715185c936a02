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


def test_tick_truth_prorates_bins_and_averages_api_samples() -> None:
    from bench.scenarios.truth import describe, summarise, tick_truth

    # 0.25 s bins: busy 0.2 s of each, 2 requests running all the time, nothing waiting
    bins = [
        {"t": 100.0 + 0.25 * i, "busy": 0.2, "busy_span": 0.22, "running": 0.5, "waiting": 0.0}
        for i in range(8)
    ]
    api = [(100.1 + 0.25 * i, {7: (1.0, 1.0), 8: (0.2, 0.3)}) for i in range(8)]
    t = tick_truth(101.125, 0.5, bins, 0.25, api)  # [100.625, 101.125): halves of two bins, one whole
    assert abs(t["busy"] - 0.8) < 1e-9
    assert abs(t["running"] - 2.0) < 1e-9 and t["waiting"] == 0
    assert t["api_main"] == [1.0, 0.2] and t["api_main_demand"] == [1.0, 0.3]
    assert abs(t["covered"] - 1.0) < 1e-9
    s = summarise([t, tick_truth(101.625, 0.5, bins, 0.25, api)])
    assert s["busy"] == 0.8 and s["api_main_cores"] == [1.0, 0.2]
    assert describe(s) == "0.80, 2.0 / 0.0, 1.00 / 0.20"


def test_tick_truth_outside_the_bins_is_zero_and_uncovered() -> None:
    from bench.scenarios.truth import tick_truth

    bins = [{"t": 10.0, "busy": 0.25, "running": 0.25, "waiting": 0.0}]
    t = tick_truth(50.0, 0.5, bins, 0.25, [])
    assert t["busy"] == 0 and t["covered"] == 0 and t["api_main"] == []


def test_a_gpu_label_whose_truth_is_host_bound_says_its_premise_failed() -> None:
    from bench.scenarios.score import premise

    # the 2-core VM's fix_four_api_servers (session 32): the GPU 0.76 busy, the API servers starved
    starved = {"busy": 0.76, "api_main_demand": [0.98, 0.95, 0.93, 0.9]}
    why = premise("gpu", starved)
    assert why is not None and "GPU busy 0.76" in why and "0.98 cores" in why
    # the H100's (session 29): the label holds
    assert premise("gpu", {"busy": 0.98, "api_main_demand": [0.86, 0.65, 0.55, 0.39]}) is None
    # the GPU's truth decides; a demanding API server beside a busy GPU does not fail it (H100, session 33)
    assert premise("gpu", {"busy": 0.96, "api_main_demand": [0.91, 0.65, 0.52, 0.33]}) is None
    assert premise("gpu", {"busy": 0.5, "api_main_demand": []}) == "GPU busy 0.50 < 0.85"
    # host and idle labels are not checked; no truth, nothing said
    assert premise("host", starved) is None
    assert premise("gpu", {"busy": None}) is None
