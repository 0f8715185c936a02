"""The real daemon against hostile clients: SIGHUP, slow and idle connections, a connection cap, a flood, secrets.

Each test runs `python -m tests.fakes.standin_daemon N run ...` (the daemon with the NVML stand-in for N
GPUs) on a free loopback port and talks to it over real sockets.
"""

from __future__ import annotations

import contextlib
import json
import re
import resource
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.fakes.promserver import ENGINE_FIXTURE, Daemon, free_port, http_get
from tests.fakes.standin_daemon import standin_daemon
from tests.fakes.wait import wait_until

pytestmark = pytest.mark.timeout(90)


def _events(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def _ticks(daemon: Daemon) -> float:
    status, body = http_get(daemon.metrics_url, timeout=10)
    assert status == 200
    match = re.search(rb"^boundwatch_ticks_total (\S+)$", body, re.M)
    assert match is not None
    return float(match.group(1))


def _closed(sock: socket.socket, dribble: bytes = b"") -> bool:
    """Say whether the server closed the connection: send `dribble`, then wait up to 0.25 s for its end."""
    sock.settimeout(0.25)
    try:
        if dribble:
            sock.sendall(dribble)
        return sock.recv(4096) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def _wait_closed(sock: socket.socket, seconds: float, dribble: bytes = b"") -> None:
    """Fail unless the server closes the connection within `seconds` (sending `dribble` every 0.25 s)."""
    wait_until(lambda: _closed(sock, dribble), seconds, interval=0, what="the server to close the connection")


def test_sighup_is_logged_and_ignored_and_the_later_stop_cleans_up(tmp_path):
    with standin_daemon(tmp_path) as daemon:
        sock = tmp_path / "agent.sock"
        assert sock.exists()
        daemon.proc.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert daemon.proc.poll() is None, "SIGHUP killed the daemon"
        assert http_get(daemon.metrics_url)[0] == 200
        daemon.proc.send_signal(signal.SIGTERM)
        assert daemon.proc.wait(10) == 0
    events = [e["event"] for e in _events(daemon.log)]
    assert "sighup_ignored" in events and events[-1] == "stopping"
    assert not sock.exists(), "the agent socket was left behind"


def test_a_request_head_sent_a_byte_at_a_time_is_cut_off(tmp_path):
    with standin_daemon(tmp_path) as daemon:  # web.header_timeout_seconds = 10 by default
        slow = socket.create_connection(("127.0.0.1", daemon.port), timeout=5)
        idle = socket.create_connection(("127.0.0.1", daemon.port), timeout=5)
        slow.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        try:
            _wait_closed(slow, 14.0, dribble=b"X-A: b\r\n")
            _wait_closed(idle, 2.0)  # it had the same 10 s
        finally:
            slow.close()
            idle.close()
        assert http_get(daemon.metrics_url)[0] == 200  # whole requests still served, kept alive or not
        with socket.create_connection(("127.0.0.1", daemon.port), timeout=5) as piped:
            piped.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            got = b""
            while got.count(b"HTTP/1.1 200") < 2:
                chunk = piped.recv(65536)
                assert chunk, f"closed after {got!r}"
                got += chunk
        body = http_get(daemon.metrics_url)[1]
        assert b'boundwatch_http_refused_total{cause="header_timeout"} 2.0' in body


def test_connections_beyond_the_cap_get_503_at_once(tmp_path):
    with standin_daemon(tmp_path, env={"BOUNDWATCH_WEB__MAX_CONNECTIONS": "8"}) as daemon:
        held = [socket.create_connection(("127.0.0.1", daemon.port), timeout=5) for _ in range(8)]
        for sock in held:  # each mid-request (a head begun): in use, never closed to make room
            sock.sendall(b"GET /metrics HTTP/1.1\r\n")
        try:
            time.sleep(1.5)  # all eight accepted, and silent for longer than an idle one may be at the cap
            extra = socket.create_connection(("127.0.0.1", daemon.port), timeout=5)
            start = time.monotonic()
            answer = extra.recv(256)
            extra.close()
            assert answer.startswith(b"HTTP/1.1 503") and time.monotonic() - start < 2.0
        finally:
            for sock in held:
                sock.close()
        time.sleep(0.5)
        status, body = http_get(daemon.metrics_url)
        assert status == 200 and b'boundwatch_http_refused_total{cause="connection_limit"} 1.0' in body


def test_at_the_cap_an_idle_kept_alive_connection_makes_room_for_a_new_scraper(tmp_path):
    """A client that holds every slot with kept-alive connections it uses now and then cannot keep Prometheus out."""
    with standin_daemon(tmp_path, env={"BOUNDWATCH_WEB__MAX_CONNECTIONS": "8"}) as daemon:
        held = [socket.create_connection(("127.0.0.1", daemon.port), timeout=5) for _ in range(8)]
        try:
            for sock in held:  # one whole request each, then silence on a kept-alive connection
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                assert sock.recv(4096).startswith(b"HTTP/1.1 ")
            time.sleep(1.5)
            status, body = http_get(daemon.metrics_url)  # the cap is reached: the idlest makes room
            assert status == 200
            closed = 0
            for sock in held:
                sock.settimeout(0.05)
                try:
                    closed += sock.recv(1) == b""
                except TimeoutError:
                    pass
            assert closed == 1  # one, the longest silent; the others stay
        finally:
            for sock in held:
                sock.close()
        time.sleep(0.6)
        body = http_get(daemon.metrics_url)[1]
        assert b'boundwatch_http_refused_total{cause="idle_evicted"} 1.0' in body
        assert b'boundwatch_http_refused_total{cause="connection_limit"} 0.0' in body


def _nofile_1024() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 4096))  # systemd's default soft limit


def test_1100_idle_connections_under_a_1024_descriptor_limit_do_not_stop_sampling(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 4096), max(hard, 4096)))
    held: list[socket.socket] = []
    try:
        with standin_daemon(tmp_path, gpus=8, preexec=_nofile_1024) as daemon:
            before = _ticks(daemon)
            failures = 0
            while len(held) < 1100 and failures < 5:
                try:
                    held.append(socket.create_connection(("127.0.0.1", daemon.port), timeout=1.0))
                except OSError:
                    failures += 1
            time.sleep(2.0)
            status, body = http_get(daemon.metrics_url, timeout=5)
            assert len(held) == 1100 and status == 200
            assert b'boundwatch_source_up{source="host"} 1.0' in body
            assert _ticks(daemon) - before >= 4  # 2.x s at 0.5 s ticks
            assert daemon.log.stat().st_size < 20_000  # no line per connection or per accept()
    finally:
        for sock in held:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_scrape_flood_does_not_slow_the_ticks(tmp_path):
    stop = threading.Event()
    errors: list[str] = []

    def scrape(port: int) -> None:
        while not stop.is_set():
            try:
                status, _ = http_get(f"http://127.0.0.1:{port}/metrics", timeout=10)
                if status != 200:
                    errors.append(str(status))
            except OSError as exc:
                errors.append(repr(exc))

    with standin_daemon(tmp_path, gpus=8, args=("--engine-url", str(ENGINE_FIXTURE))) as daemon:
        threads = [threading.Thread(target=scrape, args=(daemon.port,), daemon=True) for _ in range(32)]
        before, start = _ticks(daemon), time.monotonic()
        for thread in threads:
            thread.start()
        time.sleep(6.0)
        ticks = _ticks(daemon) - before
        elapsed = time.monotonic() - start
        stop.set()
        for thread in threads:
            thread.join(15)
    assert not errors
    assert ticks / elapsed >= 1.6, f"{ticks / elapsed:.2f} ticks/s under 32 scrapers (2/s wanted)"


def _fake_vllm(path: Path, port: int) -> Path:
    """Write an executable named `vllm` that serves the engine fixture page on its --port."""
    script = path / "vllm"
    script.write_text(
        f"#!{sys.executable}\n"
        "import http.server, sys\n"
        f"page = open({str(ENGINE_FIXTURE)!r}, 'rb').read()\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200); self.send_header('Content-Length', str(len(page)))\n"
        "        self.end_headers(); self.wfile.write(page)\n"
        "    def log_message(self, *a): pass\n"
        f"http.server.HTTPServer(('127.0.0.1', {port}), H).serve_forever()\n"
    )
    script.chmod(0o755)
    return script


def test_no_endpoint_serves_a_discovered_engines_command_line(tmp_path):
    secret = "sk-test-9f8e7d6c5b4a"
    port = free_port()
    script = _fake_vllm(tmp_path, port)
    engine = subprocess.Popen([str(script), "serve", "my-model", "--port", str(port), "--api-key", secret])
    try:
        with standin_daemon(tmp_path / "d", args=()) as daemon:
            last: dict = {}

            def discovered() -> bool:
                last.update(json.loads(http_get(f"http://127.0.0.1:{daemon.port}/api/snapshot")[1]))
                return any(
                    s.get("pid") == engine.pid for e in last.get("engines", ()) for s in e["api_servers"]
                )

            wait_until(
                discovered, 30, 0.5, lambda: f"the fake engine discovered (engines: {last.get('engines')})"
            )
            for path in ("/api/snapshot", "/", "/metrics"):
                status, body = http_get(f"http://127.0.0.1:{daemon.port}{path}")
                assert status == 200 and secret.encode() not in body, path
    finally:
        engine.terminate()
        engine.wait(10)


def _nofile_1024_hard() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))  # no room to raise


def test_at_a_hard_1024_descriptor_limit_excess_connections_get_503_not_emfile(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 4096), max(hard, 4096)))
    held: list[socket.socket] = []
    try:
        with standin_daemon(tmp_path, gpus=8, preexec=_nofile_1024_hard) as daemon:
            before = _ticks(daemon)
            failures = 0
            while len(held) < 1100 and failures < 5:
                try:
                    held.append(socket.create_connection(("127.0.0.1", daemon.port), timeout=1.0))
                except OSError:
                    failures += 1
            time.sleep(2.0)
            refused = 0
            for sock in held:
                sock.settimeout(0)
                with contextlib.suppress(OSError):
                    # 503 at once, or (at the cap, an older one silent for a second) closed to make room
                    answer = sock.recv(64)
                    refused += answer.startswith(b"HTTP/1.1 503") or answer == b""
            for sock in held[:200]:
                sock.close()
            time.sleep(0.5)
            status, body = http_get(daemon.metrics_url, timeout=5)
            assert status == 200 and b'boundwatch_source_up{source="host"} 1.0' in body
            assert refused >= 100  # the cap leaves descriptors for the sources
            assert _ticks(daemon) - before >= 4
            log = daemon.log.read_text()
            assert "out of system resource" not in log and len(log) < 20_000
    finally:
        for sock in held:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_tls_client_that_never_finishes_its_handshake_or_head_is_cut_off(tmp_path):
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    env = {
        "BOUNDWATCH_WEB__TLS_CERT_FILE": str(tmp_path / "cert.pem"),
        "BOUNDWATCH_WEB__TLS_KEY_FILE": str(tmp_path / "key.pem"),
    }
    trust = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    with standin_daemon(tmp_path / "d", env=env, context=trust) as daemon:  # 10 s header timeout
        silent = socket.create_connection(("127.0.0.1", daemon.port), timeout=5)  # no handshake
        raw = socket.create_connection(("127.0.0.1", daemon.port), timeout=5)
        slow = trust.wrap_socket(raw, server_hostname="127.0.0.1")
        slow.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        try:
            _wait_closed(slow, 14.0, dribble=b"X-A: b\r\n")
            _wait_closed(silent, 2.0)
        finally:
            slow.close()
            silent.close()
        assert http_get(daemon.metrics_url, context=trust)[0] == 200
