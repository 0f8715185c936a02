"""The probe's end-to-end check against the real daemon, fed by an agent speaking the real wire format.

No GPU: a thread plays the in-process agent (0.5 s windows, closed 1 s late, sent every 0.25 s,
with a known busy fraction), the real `python -m exporter` integrates them, and the probe's
check reads the busy counters from the real /metrics page, as `boundwatch probe --check-url` does.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter import wire
from exporter.probe import check, logic
from tests.fakes.promserver import running_daemon

UUID = "GPU-5e6b0c1d-0000-4000-8000-000000000001"
MS = 1_000_000
WINDOW = 500 * MS
LAG = 1000 * MS


class FakeAgent(threading.Thread):
    """Send windows of bursts: `duty` x 10 ms of every 10 ms, like the probe's duty-cycle load."""

    def __init__(self, path: str) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.duty = 0.25
        self.stop = threading.Event()
        self.next_t0 = time.time_ns() // WINDOW * WINDOW

    def window(self, t0: int) -> wire.Window:
        period = 10 * MS
        ivs = [(t0 + k * period, t0 + k * period + int(self.duty * period)) for k in range(WINDOW // period)]
        packed, slack = wire.pack_intervals(ivs, t0)
        busy = sum(e - s for s, e in ivs)
        return wire.Window(dev=0, t0=t0, t1=t0 + WINDOW, busy=busy, kernels=len(ivs), iv=packed, slack=slack)

    def run(self) -> None:
        seq = 0
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            while not self.stop.is_set():
                windows = []
                while self.next_t0 + WINDOW + LAG <= time.time_ns():
                    windows.append(self.window(self.next_t0))
                    self.next_t0 += WINDOW
                msg = wire.Message(
                    pid=os.getpid(), state="running", seq=seq, devices=((0, UUID),), windows=tuple(windows)
                )
                try:
                    s.sendto(wire.encode(msg), self.path)
                except OSError:
                    pass  # the daemon is not listening yet
                seq += 1
                self.stop.wait(0.25)


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[tuple[str, FakeAgent]]:
    with running_daemon(tmp_path, engine_pages=()) as daemon:
        agent = FakeAgent(str(tmp_path / "agent.sock"))
        agent.start()
        try:
            yield daemon.metrics_url, agent
        finally:
            agent.stop.set()
            agent.join(5)


def _measure(url: str, settle: float, seconds: float) -> dict[str, dict[str, float]]:
    time.sleep(settle)
    before = check.busy_counters(check.fetch(url), "0")
    time.sleep(seconds)
    after = check.busy_counters(check.fetch(url), "0")
    return logic.busy_from_counters(before, after)


def test_probe_check_reads_the_known_busy_fraction_through_the_daemon(sidecar: tuple[str, FakeAgent]) -> None:
    url, agent = sidecar
    side = _measure(url, settle=3.0, seconds=2.0)
    assert side["cupti"]["busy_ratio"] == pytest.approx(0.25, abs=0.002)
    assert side["cupti"]["observed_seconds"] == pytest.approx(2.0, abs=0.6)
    phase = logic.evaluate_duty_phase(
        0.25, 0.25, {"cupti": side["cupti"]["busy_ratio"]}, require_source="cupti"
    )
    assert phase["pass"], phase["checks"]

    agent.duty = 0.75  # the sidecar now reports 0.75 while the "truth" below still says 0.5
    side = _measure(url, settle=2.5, seconds=2.0)
    assert side["cupti"]["busy_ratio"] == pytest.approx(0.75, abs=0.002)
    wrong = logic.evaluate_duty_phase(
        0.5, 0.5, {"cupti": side["cupti"]["busy_ratio"]}, require_source="cupti"
    )
    assert not wrong["pass"]
