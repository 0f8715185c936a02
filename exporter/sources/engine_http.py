"""Read an engine's metrics page over one kept-alive HTTP/1.1 connection, blocking, on the engine source's thread.

The engine source used aiohttp on the event loop: each read cost a task, a connector look-up,
a response object, a stream reader and the hand-offs between them, every tick (bench/README.md,
issue 14 session 7). `PageClient` holds one `http.client` connection per engine and reads the
page in the source's own worker thread, where the page is parsed next. The bounds are those of
the aiohttp read: a total time per read (every receive waits only for what is left of it, so a
page sent one byte at a time cannot stretch it), a byte and a line budget (past them the rest is
never read and the connection is dropped), no body kept from an answer other than 200. After
any error the connection is closed and the next read opens a new one; a kept-alive connection
the engine closed meanwhile is retried once on a fresh one.
"""

from __future__ import annotations

import http.client
import math
import socket
import time
from typing import Any
from urllib.parse import urljoin, urlsplit

MAX_REDIRECTS = 5  # aiohttp followed redirects (up to 10); an engine behind a proxy may redirect /metrics
# Only within the page's own origin (scheme, host, port): the engine at a discovered URL is any
# process that listens there, and a redirect elsewhere would send the daemon to read another service.
READ_CHUNK = 1 << 16
REDIRECTS = frozenset({301, 302, 303, 307, 308})


class PageReadError(Exception):
    """A page could not be read: the message says why in words (refused, no answer, an HTTP status)."""


class _DeadlineSocket(socket.socket):
    """A socket whose receives wait only for what is left of the current read's total time."""

    deadline = math.inf

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the read's time is up")
        self.settimeout(left)
        return super().recv_into(buffer, nbytes, flags)


class _Connection(http.client.HTTPConnection):
    """An HTTP connection over a `_DeadlineSocket`."""

    sock: _DeadlineSocket | None  # type: ignore[assignment]

    def connect(self) -> None:
        plain = socket.create_connection((self.host, self.port), self.timeout)
        try:
            plain.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sock = _DeadlineSocket(plain.family, plain.type, plain.proto, fileno=plain.detach())
        finally:
            plain.close()


def _origin(url: str) -> tuple[str, str, int, str]:
    """Return (scheme, host, port, path with query) of an http(s) URL; ValueError for anything else."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PageReadError(f"not an http(s) URL: {url[:200]}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return parts.scheme, parts.hostname, port, path


class PageClient:
    """One engine's page over a kept-alive connection, read with a total timeout and byte and line budgets."""

    def __init__(self, url: str, timeout: float, max_bytes: int, max_lines: int) -> None:
        self.url = url
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.max_lines = max_lines
        self._conn: http.client.HTTPConnection | None = None
        self._origin: tuple[str, str, int] | None = None
        self.connects = 0  # connections opened, for tests and the bench

    def get(self) -> bytes:
        """Return the page's body (at most the budgets plus one chunk), or raise PageReadError."""
        return self.get_url(self.url)

    def get_url(self, url: str) -> bytes:
        """Return the body at a URL of the same engine, over the same connection (as `get`)."""
        deadline = time.monotonic() + self.timeout
        origin = _origin(url)[:3]
        for _ in range(MAX_REDIRECTS + 1):
            status, location, body = self._get_once(url, deadline)
            if status == 200:
                return body
            if status in REDIRECTS and location:
                url = urljoin(url, location)
                if _origin(url)[:3] != origin:
                    raise PageReadError(f"HTTP {status}: a redirect to another origin, not followed")
                continue
            raise PageReadError(f"HTTP {status}")
        raise PageReadError(f"more than {MAX_REDIRECTS} redirects")

    def _get_once(self, url: str, deadline: float) -> tuple[int, str, bytes]:
        scheme, host, port, path = _origin(url)
        reused = self._conn is not None and self._origin == (scheme, host, port)
        try:
            return self._exchange(scheme, host, port, path, deadline)
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            self.close()
            if not reused:
                raise
        # the engine closed the kept-alive connection while it was idle: once more on a new one
        return self._exchange(scheme, host, port, path, deadline)

    def _exchange(
        self, scheme: str, host: str, port: int, path: str, deadline: float
    ) -> tuple[int, str, bytes]:
        """Send one GET and read its answer; any failure closes the connection."""
        try:
            conn = self._connection(scheme, host, port, deadline)
            sock = conn.sock
            if isinstance(sock, _DeadlineSocket):
                sock.deadline = deadline
            elif sock is not None:  # TLS: every receive waits at most the time left when the read began
                sock.settimeout(max(0.001, deadline - time.monotonic()))
            conn.request("GET", path, headers={"Accept": "text/plain", "Accept-Encoding": "identity"})
            resp = conn.getresponse()
            if resp.status != 200:
                location = resp.getheader("Location", "") or ""
                self.close()  # what an error page holds is never read
                return resp.status, location[:2048], b""
            body, complete = self._body(resp, deadline)
            if not complete or resp.will_close:
                self.close()
            return 200, "", body
        except BaseException:
            self.close()
            raise

    def _connection(self, scheme: str, host: str, port: int, deadline: float) -> http.client.HTTPConnection:
        if self._conn is not None and self._origin == (scheme, host, port):
            return self._conn
        self.close()
        left = max(0.001, deadline - time.monotonic())
        conn: http.client.HTTPConnection
        if scheme == "https":
            conn = http.client.HTTPSConnection(host, port, timeout=left)
        else:
            conn = _Connection(host, port, timeout=left)
        try:
            conn.connect()
        except ConnectionRefusedError as exc:
            raise PageReadError(
                f"connection refused by {host}:{port} (nothing listens on that port)"
            ) from exc
        except TimeoutError:
            raise
        except OSError as exc:
            reason = exc.strerror or str(exc) or type(exc).__name__
            raise PageReadError(f"cannot connect to {host}:{port}: {reason}"[:500]) from exc
        self.connects += 1
        self._conn, self._origin = conn, (scheme, host, port)
        return conn

    def _body(self, resp: http.client.HTTPResponse, deadline: float) -> tuple[bytes, bool]:
        """Return the body read within the budgets and whether it was read to its end."""
        buf = bytearray()
        lines = 0
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError("the read's time is up")
            chunk = resp.read1(READ_CHUNK)
            buf += chunk
            lines += chunk.count(b"\n")
            if len(buf) > self.max_bytes or lines > self.max_lines:
                return bytes(buf), False  # the rest is never read: the connection is dropped
            if not chunk or resp.length == 0:
                resp.close()  # read to its end: the connection is free for the next request
                return bytes(buf), True

    def close(self) -> None:
        """Close the connection (the next read opens a new one)."""
        conn, self._conn, self._origin = self._conn, None, None
        if conn is not None:
            conn.close()
