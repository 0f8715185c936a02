"""The diagnose report, record and replay, and the live paths against a real daemon."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.analysis.diagnosis import format_text, report
from exporter.cli import main
from exporter.config import Config, RooflineConfig
from exporter.snapshot import codec
from tests.fakes.verdict_scenes import SEED, Recorder, Scene, series
from tests.fakes.wait import wait_until


def test_seed000_report_names_the_api_server_and_its_fix() -> None:
    rep = report(series(Scene(**SEED, api_cpu=0.99, step_ms=72, step_gpu_ms=19), 10.0), Config())
    g = rep["gpus"][0]
    assert g["verdict"] == "host"
    assert g["reasons"] == ["api_server_saturated", "admission_stalled", "step_overhead"]
    assert g["verdict_share"]["host"] == 1.0
    text = format_text(rep)
    assert (
        "GPU 0: host-bound (api_server_saturated, admission_stalled, step_overhead) in 100% of ticks" in text
    )
    assert (
        "GPU busy 27% of the time (source gpm; CUPTI union 27%), 160 requests running and 0.0 waiting" in text
    )
    assert "Steps: 72.0 ms each, 19.0 ms of it on the GPU (26%)" in text
    assert "--api-server-count" in text
    assert "99% of a core" in text


def test_seed000_quota_report_says_reserve_cpu() -> None:
    rep = report(series(Scene(**SEED, api_cpu=0.45, quota_cores=0.5, throttled_share=0.8), 10.0), Config())
    g = rep["gpus"][0]
    assert g["reasons"][0] == "cpu_quota_throttled"
    text = format_text(rep)
    assert "quota 0.50 cores; throttled in 80% of the quota periods" in text
    assert "CPU reservation" in text


def test_graph_fallback_report_counts_capture_size_in_tokens() -> None:
    rep = report(
        series(Scene(busy=0.5, running=64, max_num_seqs=64, api_cpu=0.3, graph_share=0.3), 5.0), Config()
    )
    assert rep["gpus"][0]["reasons"] == ["cuda_graph_fallback"]
    assert "2 x max_num_seqs" in format_text(rep)


def test_seed002_report_is_gpu_bound_and_points_at_kernels() -> None:
    rep = report(series(Scene(busy=0.99, running=32, power_w=340, power_limit_w=600), 5.0), Config())
    g = rep["gpus"][0]
    assert g["verdict"] == "gpu"
    text = format_text(rep)
    assert "Power 340 W of 600 W (57%)" in text
    assert "memory latency" in text


def test_report_shows_roofline_and_mixed_verdicts() -> None:
    rec = Recorder()
    rec.run(Scene(busy=0.97, running=64, step_ms=25, step_gpu_ms=24), 6.0)
    rec.run(Scene(**SEED, api_cpu=0.99), 4.0)
    cfg = Config(roofline=RooflineConfig(weight_bytes_per_step=84e9, hbm_bandwidth_bytes_per_second=4.2e12))
    rep = report(rec.snaps, cfg)
    g = rep["gpus"][0]
    assert g["verdict"] == "gpu"
    assert 0.3 < g["verdict_share"]["host"] < 0.45
    assert "weight-streaming floor 20.0 ms per step" in format_text(rep)


def write_recording(path: Path, snaps) -> None:
    with path.open("w") as fh:
        fh.write(codec.header(tick_seconds=0.5) + "\n")
        for s in snaps:
            fh.write(codec.dumps(s) + "\n")


def test_replay_prints_the_report_of_a_recording(tmp_path, capsys) -> None:
    path = tmp_path / "seed.jsonl"
    write_recording(path, series(Scene(**SEED, api_cpu=0.99), 6.0))
    assert main(["replay", str(path), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["ticks"] == 12
    assert rep["gpus"][0]["verdict"] == "host"
    assert rep["gpus"][0]["reasons"][0] == "api_server_saturated"


def test_replay_reads_a_gzipped_recording(tmp_path, capsys) -> None:
    import gzip

    path = tmp_path / "seed.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        fh.write(codec.header(tick_seconds=0.5) + "\n")
        for s in series(Scene(busy=0.97), 3.0):
            fh.write(codec.dumps(s) + "\n")
    assert main(["replay", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gpus"][0]["verdict"] == "gpu"


def test_replay_uses_this_hosts_thresholds(tmp_path, capsys) -> None:
    path = tmp_path / "seed.jsonl"
    write_recording(path, series(Scene(**SEED, api_cpu=0.99), 6.0))
    conf = tmp_path / "bw.toml"
    conf.write_text("[verdict]\nbusy_high = 0.25\nbusy_low = 0.2\n")
    assert main(["replay", str(path), "--json", "--config", str(conf)]) == 0
    assert json.loads(capsys.readouterr().out)["gpus"][0]["verdict"] == "gpu"


def test_replay_rejects_a_file_that_is_not_a_recording(tmp_path, capsys) -> None:
    path = tmp_path / "page.prom"
    path.write_text("vllm:num_requests_running 3\n")
    assert main(["replay", str(path)]) == 2
    assert "not a boundwatch recording" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def daemon(tmp_path):
    port = _free_port()
    env_sock = tmp_path / "agent.sock"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "exporter",
            "--address",
            "127.0.0.1",
            "--port",
            str(port),
            "--no-nvml",
            "--no-engine",
            "--agent-socket",
            str(env_sock),
            "--log-level",
            "warning",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    from exporter.commands._live import daemon_answers

    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        if proc.poll() is not None:
            pytest.fail(proc.stderr.read().decode() if proc.stderr else "daemon exited")
        return daemon_answers(url)

    wait_until(answers, 20, 0.1, f"the daemon to answer at {url}")
    yield url
    proc.terminate()
    proc.wait(10)


def test_record_from_a_running_daemon_then_replay(daemon, tmp_path, capsys) -> None:
    path = tmp_path / "live.jsonl"
    assert main(["record", str(path), "--seconds", "2", "--url", daemon]) == 0
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["format"] == "boundwatch-record"
    seqs = [json.loads(line)["seq"] for line in lines[1:]]
    assert len(seqs) >= 3 and seqs == sorted(set(seqs))
    capsys.readouterr()
    assert main(["replay", str(path), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["ticks"] == len(seqs)
    assert rep["sources"]["host"] == 1.0


def test_diagnose_samples_in_process_without_a_daemon(capsys) -> None:
    port = _free_port()
    code = main(
        [
            "diagnose",
            "--seconds",
            "1.2",
            "--local",
            "--port",
            str(port),
            "--no-nvml",
            "--no-engine",
            "--no-agent",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert out.startswith("boundwatch diagnose: ")
    assert "No GPU seen" in out
