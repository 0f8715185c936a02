"""The daemon process: clean shutdown on SIGTERM and SIGINT, systemd notifications, no GPU needed."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.live import free_port, wait_for

pytestmark = pytest.mark.timeout(60)


def _start(tmp_path, env=None):
    port = free_port()
    cmd = [
        sys.executable, "-m", "exporter", "--address", "127.0.0.1", "--port", str(port),
        "--agent-socket", str(tmp_path / "agent.sock"), "--log-format", "json",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env, text=True)
    wait_for(f"http://127.0.0.1:{port}/healthz")
    return proc, port


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_the_daemon_cleanly(tmp_path, sig):
    proc, port = _start(tmp_path)
    proc.send_signal(sig)
    assert proc.wait(10) == 0
    events = [json.loads(line)["event"] for line in proc.stderr.read().splitlines() if line.startswith("{")]
    assert "listening" in events and events[-1] == "stopping"
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1)


def test_without_gpu_the_daemon_says_so_once_and_keeps_serving(tmp_path):
    proc, port = _start(tmp_path)
    try:
        time.sleep(2)  # four ticks
        page = wait_for(f"http://127.0.0.1:{port}/metrics").decode()
        assert 'boundwatch_source_up{source="host"} 1.0' in page
    finally:
        proc.terminate()
        proc.wait(10)
    lines = [json.loads(line) for line in proc.stderr.read().splitlines() if line.startswith("{")]
    nvml_down = [e for e in lines if e["event"] == "source_down" and e.get("source") == "nvml"]
    if 'source_up{source="nvml"} 0.0' in page:
        assert len(nvml_down) == 1  # one clear line, not one per tick
        assert "NVML" in nvml_down[0]["error"]


def test_ready_and_watchdog_are_sent_to_systemd(tmp_path):
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(10)
    env = dict(os.environ, NOTIFY_SOCKET=path, WATCHDOG_USEC="30000000")
    proc, _ = _start(tmp_path, env=env)
    try:
        got = set()
        while not {"READY=1", "WATCHDOG=1"} <= got:
            got.add(sock.recv(256).decode())
    finally:
        proc.terminate()
        proc.wait(10)
        sock.close()
    assert {"READY=1", "WATCHDOG=1"} <= got
