"""The daemon process: clean shutdown on SIGTERM and SIGINT, systemd notifications, no GPU needed."""

import json
import re
import signal
import socket

import pytest

from tests.fakes.promserver import http_get, running_daemon
from tests.fakes.wait import wait_until

pytestmark = pytest.mark.timeout(60)


def _events(log):
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def _after_ticks(url: str, ticks: int) -> str:
    """Return the /metrics page once the daemon has completed that many ticks, else ""."""
    _, body = http_get(url)
    page = body.decode()
    done = re.search(r"^boundwatch_ticks_total (\S+)$", page, flags=re.M)
    return page if done and float(done.group(1)) >= ticks else ""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_the_daemon_cleanly(tmp_path, sig):
    with running_daemon(tmp_path, engine_pages=()) as daemon:
        daemon.proc.send_signal(sig)
        assert daemon.proc.wait(10) == 0
    events = [e["event"] for e in _events(daemon.log)]
    assert "listening" in events and events[-1] == "stopping"
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", daemon.port), timeout=1)


def test_without_gpu_the_daemon_says_so_once_and_keeps_serving(tmp_path):
    with running_daemon(tmp_path, engine_pages=()) as daemon:
        page = wait_until(lambda: _after_ticks(daemon.metrics_url, 4), interval=0.1, what="four ticks")
    assert 'boundwatch_source_up{source="host"} 1.0' in page
    nvml_down = [e for e in _events(daemon.log) if e["event"] == "source_down" and e.get("source") == "nvml"]
    if 'source_up{source="nvml"} 0.0' in page:
        assert len(nvml_down) == 1  # one clear line, not one per tick
        assert "NVML" in nvml_down[0]["error"]
    else:  # a GPU host: NVML up, and no line saying otherwise
        assert 'boundwatch_source_up{source="nvml"} 1.0' in page and nvml_down == []


def test_ready_and_watchdog_are_sent_to_systemd(tmp_path):
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(10)
    got = set()
    try:
        with running_daemon(
            tmp_path, engine_pages=(), extra_env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "30000000"}
        ):
            while not {"READY=1", "WATCHDOG=1"} <= got:
                got.add(sock.recv(256).decode())
    finally:
        sock.close()
    assert {"READY=1", "WATCHDOG=1"} <= got
