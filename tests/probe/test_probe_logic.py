"""The probe's pure logic: nominal table, duty plans, in-kernel truth, verdicts, exit codes."""

from __future__ import annotations

import ast
import pathlib

import pytest

from exporter.probe import logic


@pytest.mark.parametrize(
    ("name", "label", "tbps"),
    [
        ("NVIDIA H200", "H200", 4.8),
        ("NVIDIA H200 NVL", "H200", 4.8),
        ("NVIDIA H20", "H20", 4.0),
        ("NVIDIA GH200 480GB", "GH200 (96 GB HBM3)", 4.0),
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 3.35),
        ("NVIDIA H100 PCIe", "H100 PCIe", 2.0),
        ("NVIDIA H100 NVL", "H100 NVL", 3.9),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM", 2.039),
        ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe", 1.935),
        ("NVIDIA A100-SXM4-40GB", "A100 40GB", 1.555),
        ("NVIDIA B200", "B200", 8.0),
        ("NVIDIA L40S", "L40S", 0.864),
        ("NVIDIA L4", "L4", 0.3),
        ("NVIDIA A10G", "A10G", 0.6),
    ],
)
def test_nominal_table_picks_the_most_specific_device(name: str, label: str, tbps: float) -> None:
    entry = logic.nominal_for(name)
    assert entry is not None
    assert entry.label == label
    assert entry.hbm_bytes_per_second == pytest.approx(tbps * 1e12)


def test_unknown_device_has_no_nominal() -> None:
    assert logic.nominal_for("Tesla T4") is None
    assert logic.nominal_for("") is None


def test_plan_duty_period_gives_the_target() -> None:
    plan = logic.plan_duty(0.25)
    assert plan.kernel_seconds == pytest.approx(0.002)
    assert plan.period_seconds == pytest.approx(0.008)
    assert plan.gap_seconds == pytest.approx(0.006)
    assert plan.bursts_within(1.0) == 126


def test_plan_duty_lengthens_the_kernel_for_high_targets() -> None:
    plan = logic.plan_duty(0.995)
    assert plan.gap_seconds >= logic.MIN_GAP_SECONDS - 1e-12
    assert plan.kernel_seconds / plan.period_seconds == pytest.approx(0.995)


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.1, 1.5])
def test_plan_duty_rejects_fractions_outside_0_1(bad: float) -> None:
    with pytest.raises(ValueError):
        logic.plan_duty(bad)


def test_parse_duty_list_accepts_fractions_and_percent() -> None:
    assert logic.parse_duty_list("0.25, 0.5,90%") == (0.25, 0.5, 0.9)
    assert logic.parse_duty_list("25,50,90") == (0.25, 0.5, 0.9)


@pytest.mark.parametrize("bad", ["", "0", "150%", "abc", "100"])
def test_parse_duty_list_rejects_nonsense(bad: str) -> None:
    with pytest.raises(ValueError):
        logic.parse_duty_list(bad)


def test_next_launch_re_anchors_after_a_stall() -> None:
    assert logic.next_launch(10.0, 0.008, now=10.003) == pytest.approx(10.008)
    # 50 ms late: launch now, not a burst of catch-up launches
    assert logic.next_launch(10.0, 0.008, now=10.05) == pytest.approx(10.05)


def test_burst_intervals_take_earliest_start_and_latest_end() -> None:
    stamps = [[100, 300, 105, 310, 102, 305], [1000, 1200, 990, 1190]]
    assert logic.burst_intervals(stamps) == [(100, 310), (990, 1200)]
    assert logic.burst_intervals([[]]) == []


def test_union_length_merges_overlaps_and_clips() -> None:
    iv = [(0, 10), (5, 15), (20, 30), (40, 50)]
    assert logic.union_length(iv, 0, 100) == 15 + 10 + 10
    assert logic.union_length(iv, 8, 25) == 7 + 5
    assert logic.union_length(iv, 31, 39) == 0
    assert logic.union_length([(5, 5)], 0, 10) == 0


def test_busy_fraction_of_a_simulated_schedule_matches_its_duty() -> None:
    # 2 ms bursts every 8 ms for 2 s, with 3 us of launch skew per burst
    bursts = [(k * 8_000_000 + 3_000, k * 8_000_000 + 2_003_000) for k in range(250)]
    assert logic.busy_fraction(bursts, 0, 2_000_000_000) == pytest.approx(0.25, abs=1e-9)
    assert logic.steady_fraction(bursts) == pytest.approx(0.25, abs=1e-9)
    # a window that cuts bursts in half still counts only what lies inside it
    assert logic.busy_fraction(bursts, 1_001_003_000, 1_003_003_000) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        logic.busy_fraction(bursts, 5, 5)


def test_steady_fraction_sees_a_host_stall() -> None:
    bursts = [(k * 4_000_000, k * 4_000_000 + 2_000_000) for k in range(100)]
    stalled = bursts[:50] + [(s + 100_000_000, e + 100_000_000) for s, e in bursts[50:]]
    assert logic.steady_fraction(bursts) == pytest.approx(0.5)
    assert logic.steady_fraction(stalled) == pytest.approx(99 * 2 / 496)


def test_clock_offset_takes_the_tightest_pair() -> None:
    dev_end = [1_000, 2_000, 3_000]
    host_after = [50_900 + 1_000, 50_500 + 2_000, 50_700 + 3_000]
    assert logic.clock_offset_ns(host_after, dev_end) == 50_500
    with pytest.raises(ValueError):
        logic.clock_offset_ns([], [])


def test_busy_from_counters_divides_deltas_and_skips_stalled_sources() -> None:
    before = {"cupti": (10.0, 40.0), "gpm": (11.0, 40.0), "nvml": (5.0, 20.0)}
    after = {"cupti": (11.25, 45.0), "gpm": (12.26, 45.0), "nvml": (5.0, 20.0), "new": (1.0, 1.0)}
    out = logic.busy_from_counters(before, after)
    assert set(out) == {"cupti", "gpm"}
    assert out["cupti"]["busy_ratio"] == pytest.approx(0.25)
    assert out["gpm"]["observed_seconds"] == pytest.approx(5.0)


def test_bandwidth_passes_near_torch_and_nominal() -> None:
    nominal = logic.nominal_for("NVIDIA H200")
    out = logic.evaluate_bandwidth(4.271e12, 4.273e12, nominal, verified=True)
    assert out["pass"] is True
    assert out["ratio_to_torch"] == pytest.approx(0.99953, abs=1e-4)
    assert out["ratio_to_nominal"] == pytest.approx(0.8898, abs=1e-4)


def test_bandwidth_fails_a_slow_kernel_a_slow_card_or_a_wrong_copy() -> None:
    nominal = logic.nominal_for("NVIDIA H200")
    slow_kernel = logic.evaluate_bandwidth(3.7e12, 4.27e12, nominal, verified=True)
    assert not slow_kernel["pass"]
    assert [c["name"] for c in slow_kernel["checks"] if not c["pass"]] == ["bandwidth_vs_torch_copy"]
    slow_card = logic.evaluate_bandwidth(3.0e12, 3.0e12, nominal, verified=True)
    assert [c["name"] for c in slow_card["checks"] if not c["pass"]] == ["bandwidth_vs_nominal"]
    wrong = logic.evaluate_bandwidth(4.27e12, 4.27e12, nominal, verified=False)
    assert not wrong["pass"]


def test_bandwidth_of_an_unknown_device_is_judged_against_torch_only() -> None:
    out = logic.evaluate_bandwidth(1e12, 1.02e12, None, verified=True)
    assert out["ratio_to_nominal"] is None
    assert out["pass"] is True
    assert {c["name"] for c in out["checks"]} == {"bandwidth_copy_correct", "bandwidth_vs_torch_copy"}


def test_duty_phase_prefers_cupti_and_holds_it_to_one_point() -> None:
    good = logic.evaluate_duty_phase(0.5, 0.4998, {"cupti": 0.5001, "gpm": 0.45, "nvml": 0.52})
    assert good["primary_source"] == "cupti"
    assert good["pass"] is True  # gpm is off by 5 points but only reported
    assert good["sources"]["gpm"]["pass"] is False
    bad = logic.evaluate_duty_phase(0.5, 0.4998, {"cupti": 0.5150})
    assert bad["pass"] is False
    assert bad["sources"]["cupti"]["error"] == pytest.approx(0.0152)


def test_duty_phase_falls_back_to_gpm_with_its_own_tolerance() -> None:
    out = logic.evaluate_duty_phase(0.9, 0.9, {"gpm": 0.885, "nvml": 0.95})
    assert out["primary_source"] == "gpm"
    assert out["pass"] is True
    assert logic.evaluate_duty_phase(0.9, 0.9, {"gpm": 0.875})["pass"] is False


def test_duty_phase_fails_when_the_required_source_is_missing_or_the_schedule_slipped() -> None:
    missing = logic.evaluate_duty_phase(0.25, 0.25, {"gpm": 0.25}, require_source="cupti")
    assert missing["pass"] is False
    slipped = logic.evaluate_duty_phase(0.9, 0.7, {"cupti": 0.7})
    assert slipped["pass"] is False
    assert [c["name"] for c in slipped["checks"] if not c["pass"]] == ["duty_0.9_schedule"]


def test_tolerance_override() -> None:
    th = logic.Thresholds(duty_tolerance={"cupti": 0.002})
    assert th.tolerance("cupti") == 0.002
    assert th.tolerance("gpm") == 0.02
    assert th.tolerance("weird") == 0.03
    assert logic.evaluate_duty_phase(0.5, 0.5, {"cupti": 0.504}, th)["pass"] is False


def _result(bw_pass: bool = True, duty_pass: bool = True) -> dict:
    bw = logic.evaluate_bandwidth(4.27e12 if bw_pass else 2e12, 4.27e12, logic.nominal_for("H200"), True)
    phase = logic.evaluate_duty_phase(0.5, 0.5, {"cupti": 0.5 if duty_pass else 0.6})
    return {"schema": 1, "bandwidth": bw, "duty": {"phases": [phase]}, "finished_at": 1.0e9}


def test_finish_sets_status_and_exit_code() -> None:
    ok = logic.finish(_result())
    assert (ok["status"], ok["exit_code"]) == ("pass", logic.EXIT_PASS)
    assert len(ok["checks"]) == 5
    failed = logic.finish(_result(duty_pass=False))
    assert (failed["status"], failed["exit_code"]) == ("fail", logic.EXIT_FAIL)
    assert "duty_0.5_cupti" in failed["message"]
    empty = logic.finish({"schema": 1})
    assert empty["exit_code"] == logic.EXIT_UNAVAILABLE
    err = logic.finish(logic.unavailable("no GPU"))
    assert (err["status"], err["exit_code"], err["message"]) == ("error", 2, "no GPU")


def test_summarize_keeps_the_worst_error_per_source() -> None:
    result = _result()
    result["duty"]["phases"].append(logic.evaluate_duty_phase(0.9, 0.9, {"cupti": 0.893, "gpm": 0.9}))
    summary = logic.summarize(logic.finish(result))
    assert summary.status == "pass" and summary.success is True
    assert summary.timestamp == 1.0e9
    assert summary.duty_errors["cupti"] == pytest.approx(-0.007)
    assert summary.duty_errors["gpm"] == pytest.approx(0.0)
    assert summary.hbm_bandwidth_ratio == pytest.approx(4.27 / 4.8)
    assert logic.summarize(logic.unavailable("no GPU")).success is None


def test_pure_modules_import_no_gpu_library() -> None:
    root = pathlib.Path(logic.__file__).parent
    for name in ("logic.py", "check.py", "scheduled.py", "__init__.py", "gpu.py"):
        tree = ast.parse((root / name).read_text())
        top = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
        mods = {a.name.split(".")[0] for n in top if isinstance(n, ast.Import) for a in n.names}
        mods |= {(n.module or "").split(".")[0] for n in top if isinstance(n, ast.ImportFrom)}
        assert not mods & {"torch", "triton", "pynvml", "cupti"}, (name, mods)
