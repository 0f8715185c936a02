"""The probe's kernels on a real GPU (skipped without torch, Triton and a CUDA device)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest


def _gpu_ready() -> bool:
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("triton") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


needs_gpu = pytest.mark.skipif(not _gpu_ready(), reason="needs torch, triton and a CUDA GPU")


@pytest.mark.gpu
@needs_gpu
def test_bandwidth_within_ten_percent_of_torch_copy() -> None:
    from exporter.probe import gpu

    out = gpu.measure_bandwidth(0, buffer_bytes=1 << 30, pairs=2, reps=10)
    assert out["verified"] is True
    assert out["ratio_to_torch"] >= 0.9
    assert out["bytes_per_second"] > 1e11


@pytest.mark.gpu
@needs_gpu
def test_duty_phase_truth_matches_target_and_nvml() -> None:
    from exporter.probe import gpu

    result = gpu.run_probe(
        0, duty=(0.5,), seconds=1.5, settle=0.5, bandwidth=False, matmul=False, agent=False
    )
    phase = result["duty"]["phases"][0]
    assert phase["unwritten_stamps"] == 0
    assert phase["truth"] == pytest.approx(0.5, abs=0.05)
    assert phase["burst_seconds_median"] == pytest.approx(0.002, rel=0.05)
    assert phase["primary_source"] in ("gpm", "nvml"), phase["sources"]  # the probe's own NVML read
    assert phase["pass"], phase["checks"]


@pytest.mark.gpu
@needs_gpu
def test_probe_command_prints_json_and_sets_exit_code() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "exporter",
            "probe",
            "--json",
            "--duty",
            "0.5",
            "--seconds",
            "1",
            "--no-matmul",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == result["exit_code"]
    assert result["status"] in ("pass", "fail")
    assert result["bandwidth"]["ratio_to_torch"] > 0.9


def test_probe_command_without_a_gpu_stack_exits_2() -> None:
    if _gpu_ready():
        pytest.skip("this machine can run the probe")
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "probe", "--json"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["status"] == "error" and result["message"]
