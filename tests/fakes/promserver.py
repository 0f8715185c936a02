"""Start the real boundwatch daemon and a real Prometheus that scrapes it, on loopback, for tests.

`serving_full_page()` adds a second target that exposes every catalogue family with several series
each (two GPUs, every source, verdict and reason), so queries also meet realistic cardinality: a join
that matches many-to-many, or a matcher on a label value nobody exports, shows up there even on a
machine without a GPU or an engine.

Both run as child processes on free 127.0.0.1 ports in a temporary directory and are stopped (SIGTERM,
then SIGKILL) when the context exits; every wait is bounded. Use from a fixture:

    with running_daemon(tmp) as daemon, running_prometheus(tmp, {"boundwatch": [daemon.target]}) as prom:
        prom.wait_for('rate(boundwatch_ticks_total[1m]) > 0')
        prom.query('boundwatch_build_info')
"""

from __future__ import annotations

import base64
import contextlib
import http.server
import itertools
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from exporter.catalogue import METRICS, family
from exporter.snapshot.engine import PAGE_REFUSED_REASONS, STEP_METHODS
from exporter.snapshot.gpu import CLOCK_EVENT_REASONS
from exporter.snapshot.verdict import REASONS, VERDICTS
from exporter.sources.agent_feed import REFUSED_REASONS
from exporter.wire import IDLE_GAP_BUCKETS_SECONDS, STEP_BUCKETS_SECONDS

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = shutil.which("prometheus") or (
    "/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None
)
ENGINE_FIXTURE = ROOT / "tests" / "fixtures" / "engine" / "vllm-0.10.0-single-glm45-fragment.prom"


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_get(
    url: str,
    timeout: float = 5.0,
    context: ssl.SSLContext | None = None,
    auth: tuple[str, str] | None = None,
) -> tuple[int, bytes]:
    """GET a loopback URL and return (status, body); HTTP errors return their status too.

    `context` verifies an https URL (e.g. against a test CA); `auth` sends basic-auth credentials."""
    request = urllib.request.Request(url)
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _stop(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)


def listening_port(proc: subprocess.Popen[bytes], log: Path, timeout: float) -> int:
    """Return the port a daemon started with `--port 0 --log-format json` says it listens on.

    The kernel picks the port as the daemon binds, so no other process can hold it first, as one can
    between `free_port()` and a bind: a test that starts a server of its own on a free port before the
    daemon read that server's page as the daemon's."""

    def find(text: bytes) -> int | None:
        for line in text.splitlines():
            if b'"listening"' in line:
                with contextlib.suppress(ValueError):
                    event = json.loads(line)
                    if event.get("event") == "listening":
                        return int(event["port"])
        return None

    return _port_in_log(proc, log, timeout, find, "where it listens")


def _port_in_log(
    proc: subprocess.Popen[bytes], log: Path, timeout: float, find: Callable[[bytes], int | None], what: str
) -> int:
    """Return the port `find` reads in a process's log (a server started with `--port 0`), once it is there."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        port = find(log.read_bytes() if log.exists() else b"")
        if port:
            return port
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        time.sleep(0.05)
    raise TimeoutError(f"{proc.args!r} did not say {what} within {timeout:.0f}s:\n{log.read_text()[-4000:]}")


def _wait_http(
    proc: subprocess.Popen[bytes],
    url: str,
    log: Path,
    timeout: float,
    context: ssl.SSLContext | None = None,
    auth: tuple[str, str] | None = None,
    expect: bytes | None = None,
) -> None:
    """Wait until `url` answers 200; with `expect`, the body must hold it, so that another process
    that took the port first (a free port handed out twice) is named rather than taken for `proc`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        with contextlib.suppress(OSError):
            status, body = http_get(url, timeout=1.0, context=context, auth=auth)
            if status == 200 and expect is not None and expect not in body:
                raise RuntimeError(f"{url} is served by another process than {proc.args!r}: {body[:200]!r}")
            if status == 200:
                return
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f}s:\n{log.read_text()[-4000:]}")


@dataclass
class Daemon:
    """A running `python -m exporter run` on loopback."""

    port: int
    log: Path
    proc: subprocess.Popen[bytes]
    scheme: str = "http"

    @property
    def target(self) -> str:
        """Return the host:port Prometheus scrapes."""
        return f"127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        """Return the daemon's /metrics URL."""
        return f"{self.scheme}://{self.target}/metrics"


@contextlib.contextmanager
def running_daemon(
    workdir: Path,
    engine_pages: Sequence[Path] = (ENGINE_FIXTURE,),
    timeout: float = 60.0,
    extra_env: dict[str, str] | None = None,
    context: ssl.SSLContext | None = None,
    auth: tuple[str, str] | None = None,
) -> Iterator[Daemon]:
    """Run the real daemon on a free loopback port, reading engine pages from files, until the block exits.

    With `context` (the daemon configured for TLS through `extra_env`) it is reached over https,
    verified by that context; `auth` is what the readiness check sends when basic auth is on."""
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "boundwatch.log"
    args = [sys.executable, "-m", "exporter", "run", "--address", "127.0.0.1", "--port", "0"]
    args += ["--agent-socket", str(workdir / "agent.sock"), "--log-format", "json"]
    for page in engine_pages:
        args += ["--engine-url", str(page)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOUNDWATCH_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(extra_env or {})
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        daemon = Daemon(
            listening_port(proc, log, timeout), log, proc, "https" if context is not None else "http"
        )
        _wait_http(proc, daemon.metrics_url, log, timeout, context, auth, expect=b"boundwatch_")
        yield daemon
    finally:
        _stop(proc)


@contextlib.contextmanager
def running_demo(workdir: Path, *flags: str) -> Iterator[tuple[str, float]]:
    """Run `boundwatch demo` on a loopback port the kernel picks; yield (host:port, its start on time.monotonic())."""
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "demo.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOUNDWATCH_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"  # its "serving" line reaches the log as it is printed
    args = [sys.executable, "-m", "exporter", "demo", "--address", "127.0.0.1", "--port", "0", *flags]
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        port = _demo_port(proc, log, 30.0)
        _wait_http(proc, f"http://127.0.0.1:{port}/metrics", log, 30.0, expect=b"boundwatch_")
        yield f"127.0.0.1:{port}", started
    finally:
        _stop(proc)


def _demo_port(proc: subprocess.Popen[bytes], log: Path, timeout: float) -> int:
    """Return the port `boundwatch demo --port 0` says it serves on (its "serving http://...:PORT/" line)."""

    def find(text: bytes) -> int | None:
        found = re.search(rb"serving http://[^\s/]+:(\d+)/", text)
        return int(found.group(1)) if found else None

    return _port_in_log(proc, log, timeout, find, "where it serves")


# Label values for the full page: every bounded enum the exporter documents, two of everything else.
FULL_PAGE_VALUES: dict[str, tuple[str, ...]] = {
    "gpu": ("0", "1"),
    "source": ("cupti", "gpm", "nvml"),
    "verdict": VERDICTS,
    "state": ("running", "preempted", "unavailable", "stale"),
    "method": STEP_METHODS,
    "kind": ("kernel", "memcpy", "memset", "graph"),
    "engine": ("vllm-0", "sglang-0"),
    "server": ("0", "1"),
    "cgroup": ("/system.slice/vllm.service", "/system.slice/boundwatch.service"),
}
_REASONS_BY_FAMILY = {
    "boundwatch_gpu_clock_event_reason": tuple(name for _, name in CLOCK_EVENT_REASONS),
    "boundwatch_bound_reason": REASONS,
    "boundwatch_agent_refused_total": REFUSED_REASONS,
    "boundwatch_engine_page_refused_total": PAGE_REFUSED_REASONS,
}


class FullPage(Collector):
    """Every catalogue family, every label combination; gauges 1 (one-hot true), counters growing with time."""

    def __init__(self, started: float) -> None:
        self.started = started

    def _values(self, name: str, label: str) -> tuple[str, ...]:
        if label == "reason":
            return _REASONS_BY_FAMILY[name]
        return FULL_PAGE_VALUES.get(label, (f"{label}-a", f"{label}-b"))

    def collect(self) -> Iterator[Any]:
        """Yield each family with one series per combination of label values."""
        elapsed = time.time() - self.started + 1.0
        for spec in METRICS:
            fam = family(spec)
            combos = itertools.product(*(self._values(spec.name, label) for label in spec.labels))
            for values in combos:
                if isinstance(fam, HistogramMetricFamily):
                    bounds = IDLE_GAP_BUCKETS_SECONDS if "idle_gap" in spec.name else STEP_BUCKETS_SECONDS
                    buckets = [(str(b), elapsed * (i + 1)) for i, b in enumerate(bounds)]
                    buckets.append(("+Inf", elapsed * (len(bounds) + 1)))
                    fam.add_metric(list(values), buckets=buckets, sum_value=elapsed * 0.1)
                elif spec.kind == "counter":
                    fam.add_metric(list(values), elapsed * 0.5)
                else:
                    fam.add_metric(list(values), 1.0)
            yield fam


@contextlib.contextmanager
def serving_full_page() -> Iterator[str]:
    """Serve the full page at http://127.0.0.1:PORT/metrics in a thread; yield its host:port."""
    registry = CollectorRegistry()
    registry.register(FullPage(time.time()))

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="full-page", daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@dataclass
class Prometheus:
    """A running Prometheus on loopback, with a small client for its HTTP API."""

    port: int
    workdir: Path
    proc: subprocess.Popen[bytes]
    log: Path
    queries: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        """Return Prometheus' base URL."""
        return f"http://127.0.0.1:{self.port}"

    def api(self, path: str, **params: str) -> dict[str, Any]:
        """GET an /api/v1 endpoint and return its decoded JSON body, whatever the HTTP status."""
        query = urllib.parse.urlencode(params)
        _, body = http_get(f"{self.url}/api/v1/{path}" + (f"?{query}" if query else ""), timeout=10.0)
        return dict(json.loads(body))

    def query(self, expr: str) -> dict[str, Any]:
        """Run an instant query now and return the API's answer (`status`, `data` or `error`)."""
        self.queries.append(expr)
        return self.api("query", query=expr)

    def wait_for(self, expr: str, timeout: float = 60.0) -> list[dict[str, Any]]:
        """Poll a query until it returns at least one series, and return them."""
        deadline = time.monotonic() + timeout
        answer: dict[str, Any] = {}
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"prometheus exited with {self.proc.returncode}:\n{self.log.read_text()[-4000:]}"
                )
            answer = self.query(expr)
            if answer.get("status") == "success" and answer["data"]["result"]:
                return list(answer["data"]["result"])
            time.sleep(0.5)
        raise TimeoutError(f"{expr!r} returned nothing within {timeout:.0f}s: {answer}")


@contextlib.contextmanager
def running_prometheus(
    workdir: Path,
    jobs: dict[str, Sequence[str]],
    rule_files: Sequence[Path] = (),
    interval: str = "1s",
    timeout: float = 30.0,
    job_options: dict[str, dict[str, Any]] | None = None,
    alertmanagers: Sequence[str] = (),
) -> Iterator[Prometheus]:
    """Run a real Prometheus scraping each job's targets every `interval`, with rule files, until the block exits.

    `job_options` adds scrape settings per job (scheme, tls_config, basic_auth...); alerts go to
    `alertmanagers` (host:port each) when given."""
    if PROMETHEUS is None:
        raise FileNotFoundError("prometheus is not installed")
    workdir.mkdir(parents=True, exist_ok=True)
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
        "rule_files": [str(Path(f).resolve()) for f in rule_files],
        "scrape_configs": [
            {
                "job_name": job,
                "static_configs": [{"targets": list(targets)}],
                **(job_options or {}).get(job, {}),
            }
            for job, targets in jobs.items()
        ],
    }
    if alertmanagers:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": list(alertmanagers)}]}]}
    config_path = workdir / "prometheus.yml"
    config_path.write_text(json.dumps(config, indent=2))  # JSON is YAML
    port = free_port()
    log = workdir / "prometheus.log"
    args = [
        PROMETHEUS,
        f"--config.file={config_path}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, cwd=workdir, stdout=out, stderr=subprocess.STDOUT)
    prom = Prometheus(port, workdir, proc, log)
    try:
        _wait_http(proc, f"{prom.url}/-/ready", log, timeout)
        yield prom
    finally:
        _stop(proc)
