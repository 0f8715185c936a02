"""The HTTP listener's guard: a bound on open connections and on the time a request's headers take.

aiohttp times out idle kept-alive connections but not a client that sends its request a byte at
a time (slowloris), and asyncio accepts connections until the process runs out of descriptors.
The guard accepts connections itself, one at a time: beyond `max_connections` a connection gets
a 503 and is closed at once (one descriptor for a moment, never sampling time); the others are
handed to aiohttp through a protocol that closes a connection whose request line and headers have
not arrived `header_timeout` seconds after the connection or after the request's first byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import resource
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

log = structlog.get_logger("boundwatch.web")

REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 21\r\n"
    b"Retry-After: 1\r\nConnection: close\r\n\r\ntoo many connections\n"
)
END_OF_HEADERS = b"\r\n\r\n"
BACKLOG = 256
# at the cap, a connection silent this long (no request since, nothing under way) makes room for a new one
IDLE_EVICT_SECONDS = 1.0
DESCRIPTORS_KEPT = 128  # descriptors left for the sources (/proc, NVML, engine pages, the agent socket)


def raise_descriptor_limit(want: int = 65536) -> int:
    """Raise the soft RLIMIT_NOFILE towards the hard limit (at most `want`); return the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return int(soft)


def connection_cap(configured: int, soft_limit: int) -> int:
    """Return the connections to allow: as configured, but leaving descriptors for the sources."""
    return max(8, min(configured, soft_limit - DESCRIPTORS_KEPT))


@dataclass
class ListenerStats:
    """What the guard saw: connections open now, refused and cut off since start."""

    open: int = 0
    refused_total: int = 0
    timed_out_total: int = 0
    tls_failed_total: int = 0  # TLS handshakes that failed or timed out
    evicted_total: int = 0  # idle connections closed at the cap to let a new one in
    write_timed_out_total: int = 0  # connections cut because their client stopped reading an answer
    # transports with a request being handled (the app's middleware marks them): never idle
    handling: dict[Any, int] = field(default_factory=dict)


class ConnectionGuard:
    """A protocol factory that bounds open connections and header time around aiohttp's handlers."""

    def __init__(
        self,
        factory: Callable[[], asyncio.Protocol],
        max_connections: int,
        header_timeout: float,
        clock: Callable[[], float] = time.monotonic,
        stats: ListenerStats | None = None,
    ) -> None:
        self.factory = factory
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self._clock = clock
        self.stats = stats if stats is not None else ListenerStats()
        self._logged_at = -1e9
        self._refused_logged = 0
        self._tls_logged_at = -1e9
        self._tls_failed_logged = 0
        self._live: dict[_Guarded, None] = {}  # open connections, the longest silent first

    def _evict_idlest(self) -> bool:
        """At the cap, close the connection silent longest if it has been for IDLE_EVICT_SECONDS; say whether one was.

        One that is mid-request (a head arriving, an answer still being written) is never taken: a
        client holding every slot with kept-alive connections it uses now and then (each under the
        idle timeout) cannot keep a new scraper out, while one that is being served is never cut.
        """
        now = self._clock()
        busy = []
        found = None
        for i, conn in enumerate(self._live):
            if i >= 64 or now - conn.last_data < IDLE_EVICT_SECONDS:
                break  # the rest have been silent for less time still
            if conn.idle():
                found = conn
                break
            busy.append(conn)
        for conn in busy:  # under way (a handler, an answer being written): behind the others next time
            self._active(conn)
        if found is None:
            return False
        del self._live[found]
        found.evict()
        self.stats.evicted_total += 1
        return True

    def _active(self, conn: _Guarded) -> None:
        self._live.pop(conn, None)
        self._live[conn] = None

    def _gone(self, conn: _Guarded) -> None:
        self._live.pop(conn, None)

    async def serve(self, listener: socket.socket, ssl_context: ssl.SSLContext | None = None) -> None:
        """Accept connections until cancelled: refuse those over the cap, hand the others to aiohttp."""
        loop = asyncio.get_running_loop()
        handshakes: set[asyncio.Task[None]] = set()
        try:
            while True:
                try:
                    conn, _ = await loop.sock_accept(listener)
                except OSError as exc:  # EMFILE and the like: wait a moment, log at most every 10 s
                    if exc.errno != errno.ECONNABORTED:
                        loop.call_exception_handler({"message": "accept() failed", "exception": exc})
                        await asyncio.sleep(0.1)
                    continue
                if self.stats.open >= self.max_connections and not self._evict_idlest():
                    self.refuse()
                    conn.setblocking(False)
                    with contextlib.suppress(OSError):
                        conn.send(REFUSED)
                    conn.close()
                    continue
                self.stats.open += 1
                if ssl_context is None:
                    await self._hand_over(conn, None)
                else:  # the TLS handshake must not hold the accept loop
                    task = asyncio.create_task(self._hand_over(conn, ssl_context))
                    handshakes.add(task)
                    task.add_done_callback(handshakes.discard)
        finally:
            for task in list(handshakes):
                task.cancel()

    async def _hand_over(self, conn: socket.socket, ssl_context: ssl.SSLContext | None) -> None:
        made: list[_Guarded] = []

        def factory() -> _Guarded:
            made.append(_Guarded(self))
            return made[-1]

        loop = asyncio.get_running_loop()
        try:
            await loop.connect_accepted_socket(
                factory,
                conn,
                ssl=ssl_context,
                ssl_handshake_timeout=self.header_timeout if ssl_context is not None else None,
            )
        except (Exception, asyncio.CancelledError) as exc:  # a failed TLS handshake, or shutdown
            if not (made and made[0].made):  # it never reached aiohttp
                conn.close()
                self.stats.open -= 1
            if isinstance(exc, asyncio.CancelledError):
                raise
            self._handshake_failed(exc)

    def _handshake_failed(self, exc: BaseException) -> None:
        """Count a failed TLS handshake, logging at most once every 10 s (the last one's reason)."""
        self.stats.tls_failed_total += 1
        now = self._clock()
        if now - self._tls_logged_at >= 10.0:
            log.warning(
                "tls_handshakes_failed",
                failed=self.stats.tls_failed_total - self._tls_failed_logged,
                last_error=(str(exc) or type(exc).__name__)[:200],
            )
            self._tls_logged_at, self._tls_failed_logged = now, self.stats.tls_failed_total

    def refuse(self) -> None:
        """Count a refused connection, logging at most once every 10 s."""
        self.stats.refused_total += 1
        now = self._clock()
        if now - self._logged_at >= 10.0:
            log.warning(
                "connections_refused",
                open=self.stats.open,
                limit=self.max_connections,
                refused=self.stats.refused_total - self._refused_logged,
            )
            self._logged_at, self._refused_logged = now, self.stats.refused_total


class _Guarded(asyncio.Protocol):
    """One connection: aiohttp's handler inside, a header deadline around it."""

    def __init__(self, guard: ConnectionGuard) -> None:
        self._guard = guard
        self._inner: asyncio.Protocol | None = None
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._partial = False  # part of a request's head has arrived, not yet its end
        self._tail = b""
        self.made = False
        self.last_data = guard._clock()  # when the last whole request head arrived (or the connection)
        self._stalled: asyncio.TimerHandle | None = None  # set while the client does not read our answer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.made = True
        self._transport = transport  # type: ignore[assignment]
        self._inner = self._guard.factory()
        self._inner.connection_made(transport)
        self._arm()  # the first request's head must arrive in time too
        self._guard._active(self)

    def idle(self) -> bool:
        """Say whether nothing is under way here: no head arriving, no request handled, no answer left to write."""
        t = self._transport
        return (
            t is not None
            and not self._partial
            and t not in self._guard.stats.handling
            and t.get_write_buffer_size() == 0
        )

    def evict(self) -> None:
        """Close this idle connection (its client reconnects when it next asks)."""
        if self._transport is not None:
            self._transport.close()

    def _arm(self) -> None:
        if self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self._guard.header_timeout, self._expire)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        self._guard.stats.timed_out_total += 1
        if self._transport is not None:
            self._transport.abort()

    def _scan(self, data: bytes) -> bool:
        """Track request heads: arm the deadline at a head's first byte, disarm it at its end; say whether one ended."""
        buf = self._tail + data
        at = 0
        ended = False
        while True:
            if not self._partial:
                # blank lines before a request: no head (RFC 9112 2.2)
                while at < len(buf) and buf[at] in b"\r\n":
                    at += 1
                if at >= len(buf):
                    break
                self._partial = True
                self._arm()
            end = buf.find(END_OF_HEADERS, at)
            if end < 0:
                break
            self._partial = False
            self._disarm()
            ended = True
            at = end + len(END_OF_HEADERS)
        self._tail = buf[-3:] if self._partial else b""
        return ended

    def data_received(self, data: bytes) -> None:
        if self._inner is None:
            return
        if self._scan(data):  # a whole request head is activity; bytes alone (blank lines) are not
            self.last_data = self._guard._clock()
            self._guard._active(self)
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return None if self._inner is None else self._inner.eof_received()

    def pause_writing(self) -> None:
        if self._stalled is None:  # the client stopped reading: it has a header timeout to start again
            self._stalled = asyncio.get_running_loop().call_later(
                self._guard.header_timeout, self._write_expired
            )
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None
        if self._inner is not None:
            self._inner.resume_writing()

    def _write_expired(self) -> None:
        self._stalled = None
        self._guard.stats.write_timed_out_total += 1
        if self._transport is not None:
            self._transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None
        self._guard._gone(self)
        inner, self._inner = self._inner, None
        self._transport = None
        if inner is not None:
            self._guard.stats.open -= 1
            inner.connection_lost(exc)


class RateLimitedLoopErrors:
    """An event-loop exception handler that logs each kind of error at most once every `every` s."""

    def __init__(self, every: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._every = every
        self._clock = clock
        self._last: dict[str, tuple[float, int]] = {}

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """Log one loop error (accept() out of descriptors, a callback's exception) unless just logged."""
        exc = context.get("exception")
        message = str(context.get("message", "event loop error"))
        kind = f"{message}:{type(exc).__name__}"
        now = self._clock()
        last, suppressed = self._last.get(kind, (-1e18, 0))
        if now - last < self._every:
            self._last[kind] = (last, suppressed + 1)
            return
        if len(self._last) > 256:
            self._last.clear()
        self._last[kind] = (now, 0)
        log.warning("loop_error", message=message, error=repr(exc) if exc else None, suppressed=suppressed)
