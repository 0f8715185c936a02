"""The engine page client on loopback: one kept-alive connection, its bounds, and a new one after any error."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from exporter.analysis.engine_page import read_raw
from exporter.sources.engine_http import PageClient, PageReadError

PAGE = b'vllm:num_requests_running{engine="0"} 3\n' * 20


class Engine(http.server.ThreadingHTTPServer):
    """A page server that counts connections and serves what a test sets, as an engine's uvicorn."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.body = PAGE
        self.status = 200
        self.headers: dict[str, str] = {}
        self.chunked = False
        self.connections = 0
        self.requests = 0

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that drops a page past its budget breaks the pipe: expected here

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/metrics"


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Engine

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1

    def do_GET(self) -> None:
        srv = self.server
        srv.requests += 1
        if self.path in ("/moved", "/away"):
            self.send_response(307)
            port = self.server.server_address[1]
            self.send_header(
                "Location", "/metrics" if self.path == "/moved" else f"http://127.0.0.2:{port}/metrics"
            )
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(srv.status)
        for k, v in srv.headers.items():
            self.send_header(k, v)
        if srv.chunked:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(0, len(srv.body), 100):
                part = srv.body[i : i + 100]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
            return
        self.send_header("Content-Length", str(len(srv.body)))
        self.end_headers()
        self.wfile.write(srv.body)

    def log_message(self, *a: object) -> None:
        pass


@pytest.fixture
def engine() -> Iterator[Engine]:
    srv = Engine()
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def client(url: str, timeout: float = 2.0, max_bytes: int = 1 << 20, max_lines: int = 10_000) -> PageClient:
    return PageClient(url, timeout, max_bytes, max_lines)


def test_every_read_of_an_engine_goes_over_one_kept_alive_connection(engine):
    c = client(engine.url)
    try:
        assert [c.get() for _ in range(5)] == [PAGE] * 5
    finally:
        c.close()
    assert (c.connects, engine.connections, engine.requests) == (1, 1, 5)


def test_a_chunked_page_reads_whole_and_the_connection_stays(engine):
    engine.chunked = True
    c = client(engine.url)
    try:
        assert [c.get() for _ in range(3)] == [PAGE] * 3
    finally:
        c.close()
    assert c.connects == 1


def test_an_error_status_is_said_and_read_no_further_and_the_next_read_connects_again(engine):
    c = client(engine.url)
    try:
        engine.status = 500
        with pytest.raises(PageReadError, match=r"^HTTP 500$"):
            c.get()
        engine.status = 200
        assert c.get() == PAGE
    finally:
        c.close()
    assert c.connects == 2


def test_a_page_past_the_byte_budget_is_cut_and_its_connection_dropped(engine):
    engine.body = b"x" * 300_000 + b"\n"
    c = client(engine.url, max_bytes=1000)
    try:
        got = c.get()
        assert 1000 < len(got) <= 1000 + (1 << 16)  # the budget plus at most one chunk
        engine.body = PAGE
        assert c.get() == PAGE
    finally:
        c.close()
    assert c.connects == 2


def test_a_page_past_the_line_budget_is_cut(engine):
    engine.body = b"#\n" * 50_000
    c = client(engine.url, max_lines=100)
    try:
        got = c.get()
    finally:
        c.close()
    assert 100 < got.count(b"\n") < 50_000


def test_a_connection_the_engine_closed_while_idle_is_opened_again_once(engine):
    engine.headers = {"Connection": "close"}  # the server closes after each answer
    c = client(engine.url)
    try:
        assert [c.get() for _ in range(3)] == [PAGE] * 3
    finally:
        c.close()
    assert c.connects == 3


class QuickToClose(Handler):
    timeout = 0.1  # the server closes a kept-alive connection idle this long


def test_a_kept_alive_connection_the_engine_dropped_between_reads_is_retried_once_on_a_new_one():
    srv = Engine()
    srv.RequestHandlerClass = QuickToClose
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    c = client(srv.url)
    try:
        got = []
        for _ in range(3):
            got.append(c.get())
            time.sleep(0.3)  # past the server's idle timeout: it closed the connection
    finally:
        c.close()
        srv.shutdown()
        srv.server_close()
    assert got == [PAGE] * 3 and c.connects == srv.connections == 3


def test_a_redirect_is_followed(engine):
    c = client(engine.url.replace("/metrics", "/moved"))
    try:
        assert c.get() == PAGE
    finally:
        c.close()


def test_a_redirect_to_another_origin_is_not_followed(engine):
    c = client(engine.url.replace("/metrics", "/away"))  # the same port at another loopback address
    try:
        with pytest.raises(PageReadError, match="another origin"):
            c.get()
    finally:
        c.close()
    assert engine.requests == 1


def test_a_refused_connection_is_said_in_words():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = client(f"http://127.0.0.1:{port}/metrics")
    with pytest.raises(PageReadError, match=rf"^connection refused by 127.0.0.1:{port} "):
        c.get()


def test_a_page_sent_a_byte_at_a_time_cannot_stretch_the_read_past_its_timeout():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    stop = threading.Event()

    def trickle() -> None:
        conn, _ = listener.accept()
        conn.recv(4096)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
        while not stop.is_set():
            try:
                conn.sendall(b"x")
            except OSError:
                break
            time.sleep(0.05)  # every receive gets a byte well within any per-receive timeout
        conn.close()

    threading.Thread(target=trickle, daemon=True).start()
    c = client(f"http://127.0.0.1:{listener.getsockname()[1]}/metrics", timeout=0.5)
    start = time.monotonic()
    try:
        with pytest.raises(TimeoutError):
            c.get()
        assert time.monotonic() - start < 1.0
    finally:
        stop.set()
        c.close()
        listener.close()


def test_a_url_that_is_not_http_is_refused():
    with pytest.raises(PageReadError, match="not an http"):
        client("ftp://127.0.0.1/metrics").get()


async def test_the_engine_source_reads_its_engine_over_one_connection_tick_after_tick(engine):
    from exporter.config import Config, EngineConfig, HostConfig
    from exporter.sources.engine import EngineSource

    engine.body = (
        b"# TYPE vllm:num_requests_running gauge\n"
        b'vllm:num_requests_running{engine="0",model_name="m"} 3\n'
        b"# TYPE vllm:num_requests_waiting gauge\n"
        b'vllm:num_requests_waiting{engine="0",model_name="m"} 1\n'
    )
    cfg = Config(
        engine=EngineConfig(urls=(engine.url,), discover=False),
        host=HostConfig(proc_root="/proc", cgroup_root="/sys/fs/cgroup"),
    )
    source = EngineSource(cfg)
    try:
        readings = [await source.read() for _ in range(4)]
    finally:
        await source.aclose()
    readings = [(read_raw(r),) for (r,) in readings]
    assert [(r.error, r.running, r.waiting) for (r,) in readings] == [("", 3.0, 1.0)] * 4
    assert (source.page_reads, engine.connections, engine.requests) == (4, 1, 4)
