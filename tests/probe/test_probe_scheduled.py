"""The scheduled probe: when it may run, how its subprocess is built, run, timed out and cancelled."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import stat
import sys
import time
from pathlib import Path
from types import MappingProxyType

import pytest

from exporter.config import Config, ConfigError, ProbeConfig, WebConfig, load
from exporter.probe import logic, scheduled
from exporter.snapshot import Snapshot
from exporter.snapshot.engine import EngineReading
from exporter.snapshot.gpu import GpuReading
from exporter.snapshot.probe import ProbeSummary
from tests.fakes.wait import wait_until_async

ON = ProbeConfig(enabled=True, interval_seconds=600.0, idle_seconds=10.0, idle_busy_max=0.02)
HAS_TORCH = importlib.util.find_spec("torch") is not None


def _snap(
    t: float,
    busy: float | None = 0.0,
    running: float | None = 0.0,
    waiting: float | None = 0.0,
    probe: dict | None = None,
    engines: bool = True,
) -> Snapshot:
    gpus = (GpuReading(index=0, uuid="GPU-a", name="NVIDIA H200", driver="580"),)
    eng = (EngineReading(name="vllm", kind="vllm", running=running, waiting=waiting),) if engines else ()
    return Snapshot(
        seq=int(t * 2),
        at=1.8e9 + t,
        mono=t,
        interval=0.5,
        dt=0.5,
        gpus=gpus,
        engines=eng,
        busy=MappingProxyType({} if busy is None else {0: (busy, "cupti")}),
        probe=MappingProxyType(probe or {}),
    )


def _history(seconds: float = 12.0, **last: object) -> list[Snapshot]:
    snaps = [_snap(t * 0.5) for t in range(int(seconds * 2) + 1)]
    if last:
        snaps[-1] = _snap(snaps[-1].mono, **last)  # type: ignore[arg-type]
    return snaps


def test_runs_after_idle_seconds_of_idle() -> None:
    assert scheduled.should_run_probe(_history(), ON) is True
    assert scheduled.should_run_probe(_history(), Config(probe=ON)) is True


def test_disabled_by_default() -> None:
    assert Config().probe.enabled is False
    assert scheduled.should_run_probe(_history(), Config()) is False


def test_not_before_the_history_covers_idle_seconds() -> None:
    assert scheduled.should_run_probe(_history(seconds=8.0), ON) is False
    assert scheduled.should_run_probe([], ON) is False


@pytest.mark.parametrize(
    "last",
    [
        {"running": 1.0},
        {"waiting": 3.0},
        {"running": None, "waiting": None},  # an engine that cannot tell counts as busy
        {"busy": 0.05},
        {"busy": None},  # no busy figure: not known to be idle
    ],
)
def test_any_sign_of_work_in_the_window_blocks_it(last: dict) -> None:
    assert scheduled.should_run_probe(_history(**last), ON) is False


def test_work_before_the_window_does_not_block_it() -> None:
    snaps = _history(seconds=20.0)
    snaps[2] = _snap(snaps[2].mono, running=4.0, busy=0.9)
    assert scheduled.should_run_probe(snaps, ON) is True


def test_no_engine_at_all_is_idle_when_the_gpu_is() -> None:
    snaps = [_snap(t * 0.5, engines=False) for t in range(25)]
    assert scheduled.should_run_probe(snaps, ON) is True


def test_interval_since_the_last_run() -> None:
    now_at = _history()[-1].at
    recent = {"0": ProbeSummary("pass", True, timestamp=now_at - 100.0)}
    assert scheduled.should_run_probe(_history(probe=recent), ON) is False
    old = {"0": ProbeSummary("pass", True, timestamp=now_at - 700.0)}
    assert scheduled.should_run_probe(_history(probe=old), ON) is True
    assert scheduled.should_run_probe(_history(), ON, last_run=now_at - 5.0) is False


def test_must_stop_when_work_appears() -> None:
    assert scheduled.must_stop(_snap(0, running=1.0), ON) is True
    assert scheduled.must_stop(_snap(0, running=None, waiting=None), ON) is True
    assert scheduled.must_stop(_snap(0, busy=1.0), ON) is False  # the probe's own load is fine


def test_probe_config_from_environment_and_its_checks() -> None:
    cfg = load(environ={"BOUNDWATCH_PROBE__ENABLED": "1", "BOUNDWATCH_PROBE__DUTY": "0.25,0.9"})
    assert cfg.probe.enabled is True
    assert cfg.probe.duty == (0.25, 0.9)
    for bad in ("1.5", "x"):
        with pytest.raises(ConfigError):
            load(environ={"BOUNDWATCH_PROBE__DUTY": bad})
    with pytest.raises(ConfigError):
        ProbeConfig(interval_seconds=0)


def test_self_check_url() -> None:
    assert scheduled.self_check_url(Config()) == "http://127.0.0.1:9482/metrics"
    assert (
        scheduled.self_check_url(Config(web=WebConfig(address="::", port=9999)))
        == "http://[::1]:9999/metrics"
    )
    assert (
        scheduled.self_check_url(Config(web=WebConfig(address="10.0.0.5"))) == "http://10.0.0.5:9482/metrics"
    )
    assert scheduled.self_check_url(Config(web=WebConfig(basic_auth_file="/etc/x"))) is None
    assert scheduled.self_check_url(Config(probe=ProbeConfig(check_self=False))) is None


def test_probe_command_and_environment() -> None:
    cmd = scheduled.probe_command(
        ProbeConfig(duty=(0.25, 0.9), phase_seconds=2.0), "http://127.0.0.1:9482/metrics"
    )
    assert cmd[1:5] == ["-m", "exporter", "probe", "--json"]
    assert cmd[cmd.index("--duty") + 1] == "0.25,0.9"
    assert cmd[cmd.index("--seconds") + 1] == "2"
    assert cmd[cmd.index("--check-url") + 1] == "http://127.0.0.1:9482/metrics"
    assert "--duty" in scheduled.probe_command(ProbeConfig(duty=()))
    env = scheduled.probe_env("caae7614-31f3", base={"BOUNDWATCH_AGENT": "1", "PATH": "/bin"})
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-caae7614-31f3"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert "BOUNDWATCH_AGENT" not in env
    assert scheduled.probe_env("GPU-x", base={})["CUDA_VISIBLE_DEVICES"] == "GPU-x"


def test_parse_output_takes_the_json_line_or_reports_why_not() -> None:
    ok = scheduled.parse_output(0, 'warning: noise\n{"status": "pass", "exit_code": 0, "finished_at": 5}\n')
    assert ok == {"status": "pass", "exit_code": 0, "finished_at": 5}
    bad = scheduled.parse_output(-9, "", "Traceback...\nRuntimeError: CUDA error\n")
    assert bad["status"] == "error"
    assert "exited -9" in bad["message"] and "CUDA error" in bad["message"]


def test_record_replaces_one_gpu_entry() -> None:
    state = scheduled.record({}, "0", logic.unavailable("no GPU", finished_at=10.0))
    state = scheduled.record(state, "1", {"status": "pass", "finished_at": 20.0})
    assert state["0"].success is None and state["0"].status == "error"
    assert state["1"].success is True and state["1"].timestamp == 20.0
    assert scheduled.last_run_at(_snap(0, probe=dict(state))) == 20.0


@pytest.mark.skipif(HAS_TORCH, reason="this machine has torch: the real probe would run on its GPU")
def test_run_probe_subprocess_reports_it_cannot_run_without_torch() -> None:
    result = scheduled.run_probe(None, ProbeConfig(duty=(0.5,), phase_seconds=0.5, timeout_seconds=60))
    assert result["status"] == "error"
    assert result["exit_code"] == logic.EXIT_UNAVAILABLE
    assert "torch" in result["message"]
    assert logic.summarize(result).success is None


@pytest.fixture
def slow_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in interpreter that records its pid and sleeps, for timeout and cancel tests."""
    script = tmp_path / "python"
    pidfile = tmp_path / "pid"
    script.write_text(f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 30\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(sys, "executable", str(script))
    return pidfile


def _gone(pid: int) -> bool:
    """Say whether a process no longer exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _started(pidfile: Path) -> bool:
    """Say whether the stand-in probe wrote its pid."""
    return pidfile.exists() and bool(pidfile.read_text().strip())


async def test_async_probe_times_out_and_kills_the_subprocess(slow_python: Path) -> None:
    result = await scheduled.run_probe_async(None, ProbeConfig(timeout_seconds=0.5))
    assert result["status"] == "error"
    assert "timed out" in result["message"]
    pid = int(slow_python.read_text())
    await wait_until_async(lambda: _gone(pid), timeout=5, interval=0.05, what=f"pid {pid} gone")


async def test_cancelling_the_async_probe_kills_the_subprocess(slow_python: Path) -> None:
    task = asyncio.create_task(scheduled.run_probe_async(None, ProbeConfig(timeout_seconds=60)))
    await wait_until_async(lambda: _started(slow_python), timeout=5, interval=0.05, what="the probe started")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    pid = int(slow_python.read_text())
    await wait_until_async(lambda: _gone(pid), timeout=5, interval=0.05, what=f"pid {pid} gone")


class _Runner:
    """Stands in for the probe subprocess: records calls, finishes when released."""

    def __init__(self) -> None:
        self.calls: list[tuple[str | None, str | None]] = []
        self.release = asyncio.Event()
        self.cancelled = 0

    async def __call__(self, uuid: str | None, cfg: Config, url: str | None) -> dict:
        self.calls.append((uuid, url))
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return logic.finish({"schema": 1, "finished_at": time.time(), "duty": {"phases": [
            logic.evaluate_duty_phase(0.5, 0.5, {"cupti": 0.501})
        ]}})  # fmt: skip


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_scheduler_runs_once_when_idle_and_records_each_gpu() -> None:
    runner = _Runner()
    probes = scheduled.ProbeScheduler(Config(probe=ON), runner=runner)
    history = _history()
    assert probes.tick(history) == {}
    assert probes.running and probes.runs == 1
    await _settle()
    assert runner.calls == [("GPU-a", "http://127.0.0.1:9482/metrics")]
    runner.release.set()
    await _settle()
    assert not probes.running
    state = probes.tick(history)
    entry = state["0"]
    assert entry.status == "pass" and entry.success is True
    assert probes.runs == 1  # the interval holds it back now
    await probes.close()


async def test_scheduler_cancels_when_an_engine_gets_work() -> None:
    runner = _Runner()
    probes = scheduled.ProbeScheduler(Config(probe=ON), runner=runner)
    history = _history()
    probes.tick(history)
    await _settle()
    probes.tick([*history, _snap(history[-1].mono + 0.5, running=2.0)])
    await _settle()
    assert runner.cancelled == 1
    assert not probes.running
    entry = probes.state["0"]
    assert entry.success is None and "cancelled" in entry.message


async def test_scheduler_stays_off_unless_enabled() -> None:
    runner = _Runner()
    probes = scheduled.ProbeScheduler(Config(), runner=runner)
    probes.tick(_history())
    await _settle()
    assert runner.calls == [] and probes.runs == 0
    await probes.close()
