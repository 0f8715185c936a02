"""The agent in a process where CUPTI cannot start: it says why, sends anyway, and never raises."""

import socket
import sys
import time
from pathlib import Path

import pytest

from exporter import wire

pytest.importorskip("numpy")
from exporter.agent.core import Agent, Settings


def cupti_can_run() -> bool:
    try:
        from cupti import cupti

        cupti.get_timestamp()
        return True
    except Exception:
        return False


@pytest.mark.skipif(cupti_can_run(), reason="CUPTI works here; this checks the unavailable path")
def test_agent_without_cupti_reports_unavailable_to_the_sidecar(tmp_path: Path) -> None:
    path = str(tmp_path / "agent.sock")
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(path)
    rx.settimeout(2.0)
    agent = Agent(Settings(socket=path, role="vllm_worker", flush_s=0.05))
    try:
        assert agent.start() == "unavailable"
        msg = wire.decode(rx.recv(wire.MAX_DATAGRAM_BYTES))
        assert msg.state == "unavailable" and msg.role == "vllm_worker"
        assert msg.detail  # the reason: cupti-python missing, no driver, another subscriber
    finally:
        agent.stop()
        rx.close()


def test_agent_with_no_sidecar_drops_and_counts_without_blocking(tmp_path: Path) -> None:
    agent = Agent(Settings(socket=str(tmp_path / "nobody-listens.sock"), flush_s=0.05, cupti=False))
    t = time.perf_counter()
    agent.start()
    agent.steps.record("vllm", time.time_ns() - 72_000_000, time.time_ns(), tokens=160, seqs=160)
    for _ in range(5):
        agent._send([], force=True)
    agent.stop()
    assert time.perf_counter() - t < 2.0
    assert agent.stats.messages_dropped >= 5 and agent.stats.messages_sent == 0


def test_steps_only_agent_sends_timed_steps(tmp_path: Path) -> None:
    path = str(tmp_path / "agent.sock")
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(path)
    rx.settimeout(2.0)
    agent = Agent(Settings(socket=path, role="vllm_engine", cupti=False, flush_s=0.05))
    agent.start()
    now = time.time_ns()
    for i in range(14):  # the seed: 72 ms steps
        agent.steps.record(
            "vllm", now - (15 - i) * 72_000_000, now - (14 - i) * 72_000_000, tokens=160, seqs=160
        )
    agent.stop()
    steps = []
    try:
        while True:
            steps += wire.decode(rx.recv(wire.MAX_DATAGRAM_BYTES)).steps
    except TimeoutError:
        pass
    finally:
        rx.close()
    assert sum(s.n for s in steps) == 14
    assert sum(s.wall for s in steps) == 14 * 72_000_000
    assert sum(s.hist[5] for s in steps) == 14  # le 0.075 s


def test_fork_child_does_not_inherit_a_running_agent() -> None:
    import os

    from exporter import agent

    if not hasattr(os, "fork") or sys.platform != "linux":
        pytest.skip("fork only")
    agent._agent = object()
    pid = os.fork()
    if pid == 0:
        os._exit(0 if agent.current() is None else 1)
    _, status = os.waitpid(pid, 0)
    agent._agent = None
    assert os.waitstatus_to_exitcode(status) == 0
