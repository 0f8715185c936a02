"""Start the real daemon and a real Prometheus server on loopback, for end-to-end tests."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")


def free_port() -> int:
    """Return a TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, timeout: float = 5.0) -> bytes:
    """GET a loopback URL."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return bytes(resp.read())


def wait_for(url: str, seconds: float = 20.0) -> bytes:
    """GET url until it answers 200, or raise after `seconds`."""
    deadline = time.monotonic() + seconds
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            return get(url, timeout=2)
        except OSError as exc:
            last = exc
            time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer in {seconds}s: {last}")


def stop(proc: subprocess.Popen[Any]) -> None:
    """Terminate a process, killing it if it has not exited within 10 s."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@contextmanager
def daemon(tmp: Path, extra: Sequence[str] = (), env: dict[str, str] | None = None) -> Iterator[str]:
    """Run `python -m exporter` on a free loopback port; yield its base URL."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "exporter",
        "--address",
        "127.0.0.1",
        "--port",
        str(port),
        "--agent-socket",
        str(tmp / "agent.sock"),
        "--log-format",
        "json",
        *extra,
    ]
    log = (tmp / "daemon.log").open("w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(base + "/healthz")
        yield base
    finally:
        stop(proc)
        log.close()


@contextmanager
def prometheus(tmp: Path, targets: Sequence[str], interval: str = "1s") -> Iterator[str]:
    """Run a real Prometheus scraping targets (host:port) every `interval`; yield its base URL."""
    assert PROMETHEUS is not None
    port = free_port()
    cfg = tmp / "prometheus.yml"
    cfg.write_text(
        "global:\n"
        f"  scrape_interval: {interval}\n"
        f"  evaluation_interval: {interval}\n"
        "scrape_configs:\n"
        "  - job_name: boundwatch\n"
        "    static_configs:\n"
        f"      - targets: {json.dumps(list(targets))}\n"
    )
    log = (tmp / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={cfg}",
            f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1h",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(base + "/-/ready", seconds=30)
        yield base
    finally:
        stop(proc)
        log.close()


def query(prom: str, expr: str) -> dict[str, Any]:
    """Run an instant PromQL query over Prometheus' HTTP API and return the decoded answer."""
    url = f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    return dict(json.loads(get(url)))


def query_until(prom: str, expr: str, seconds: float = 30.0) -> list[dict[str, Any]]:
    """Query until the result vector is non-empty; return it (raise on timeout)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        answer = query(prom, expr)
        if answer["status"] == "success" and answer["data"]["result"]:
            return list(answer["data"]["result"])
        time.sleep(0.5)
    raise TimeoutError(f"no result for {expr!r} in {seconds}s")
