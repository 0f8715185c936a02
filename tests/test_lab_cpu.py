"""The scenario lab's API server and engine core, on the CPU: modes drive vLLM-style /metrics."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _gauge(port: int, name: str) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return None


def _until(check, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.1)
    return False


def test_modes_drive_running_and_waiting_like_vllm() -> None:
    port = _port()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "bench/scenarios/vllm"), "serve", "--port", str(port), "--device", "cpu"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().startswith("READY ")
        assert _gauge(port, "vllm:num_requests_running") == 0
        proc.stdin.write("gpu\n")
        proc.stdin.flush()
        # 72 clients against a batch of 64: the batch fills and 8 wait
        assert _until(lambda: _gauge(port, "vllm:num_requests_running") == 64)
        assert _until(lambda: (_gauge(port, "vllm:num_requests_waiting") or 0) > 0)
        assert _until(lambda: (_gauge(port, "vllm:generation_tokens_total") or 0) > 1000)
        proc.stdin.write("idle\n")
        proc.stdin.flush()
        assert _until(lambda: _gauge(port, "vllm:num_requests_running") == 0)
        proc.stdin.write("stop\n")
        proc.stdin.flush()
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
