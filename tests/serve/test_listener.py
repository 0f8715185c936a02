"""The listener's guard: the loop-error log is rate-limited, the unit leaves room for connections."""

import asyncio
import configparser
import socket

import structlog

from exporter.serve.listener import RateLimitedLoopErrors, connection_cap
from tests.fakes.clock import Clock
from tests.fakes.promserver import ROOT


def test_the_same_loop_error_is_logged_once_every_ten_seconds():
    clock = Clock(0.0)
    handler = RateLimitedLoopErrors(every=10.0, clock=clock)
    loop = asyncio.new_event_loop()
    try:
        with structlog.testing.capture_logs() as logs:
            for _ in range(1000):  # accept() failing with EMFILE in a tight loop
                handler(loop, {"message": "accept() failed", "exception": OSError(24, "Too many open files")})
                clock.t += 0.001
            clock.t += 10.0
            handler(loop, {"message": "accept() failed", "exception": OSError(24, "Too many open files")})
    finally:
        loop.close()
    assert [e["suppressed"] for e in logs] == [0, 999]


def test_the_connection_cap_leaves_descriptors_for_the_sources():
    assert connection_cap(4096, 65536) == 4096
    assert connection_cap(4096, 1024) == 1024 - 128


def test_the_unit_raises_the_descriptor_limit():
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(ROOT / "systemd" / "boundwatch.service")
    assert int(unit["Service"]["LimitNOFILE"]) >= 65536


async def _guarded_app(max_connections: int, header_timeout: float):
    """A real aiohttp app behind the ConnectionGuard on a loopback socket: /fast, /slow (1.5 s) and /big (16 MB)."""
    from aiohttp import web as aioweb

    from exporter.config import WebConfig
    from exporter.serve.listener import ConnectionGuard, ListenerStats
    from exporter.serve.web import handling_middleware, make_runner

    async def fast(_r: aioweb.Request) -> aioweb.Response:
        return aioweb.Response(text="fast")

    async def slow(_r: aioweb.Request) -> aioweb.Response:
        await asyncio.sleep(1.5)  # as a scrape waiting on its bcrypt check
        return aioweb.Response(text="slow")

    async def big(_r: aioweb.Request) -> aioweb.Response:
        return aioweb.Response(body=b"x" * (16 << 20))

    stats = ListenerStats()
    app = aioweb.Application(middlewares=[handling_middleware(stats)])
    app.router.add_get("/fast", fast)
    app.router.add_get("/slow", slow)
    app.router.add_get("/big", big)
    runner = make_runner(app, WebConfig())
    await runner.setup()
    guard = ConnectionGuard(runner.server, max_connections, header_timeout, stats=stats)  # type: ignore[arg-type]
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    listener.setblocking(False)
    task = asyncio.create_task(guard.serve(listener))
    return runner, task, listener, stats


async def _get(port: int, path: str, keep: bool = True) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    close = b"" if keep else b"Connection: close\r\n"
    writer.write(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n" + close + b"\r\n")
    await writer.drain()
    return reader, writer


async def _answer(reader: asyncio.StreamReader, timeout: float = 5.0) -> bytes:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    length = int(
        next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(b":")[1]
    )
    return head.split(b" ")[1] + b" " + await asyncio.wait_for(reader.readexactly(length), timeout)


async def test_at_the_cap_only_an_idle_connection_makes_room_never_one_being_answered_or_talking_blank_lines():
    runner, task, listener, stats = await _guarded_app(max_connections=2, header_timeout=5.0)
    port = listener.getsockname()[1]
    try:
        a_reader, a_writer = await _get(port, "/slow")  # its handler runs 1.5 s: silent, but being answered
        b_reader, b_writer = await _get(port, "/fast")
        assert await _answer(b_reader) == b"200 fast"
        for _ in range(6):  # blank lines are no request: B stays idle however often it sends them
            b_writer.write(b"\r\n\r\n")
            await asyncio.sleep(0.2)
        c_reader, c_writer = await _get(port, "/fast")  # at the cap: B, idle 1.2 s, makes room; A is kept
        assert await _answer(c_reader) == b"200 fast"
        assert await asyncio.wait_for(b_reader.read(), 2) == b""  # closed
        assert await _answer(a_reader) == b"200 slow"  # never cut mid-request
        assert stats.evicted_total == 1 and stats.refused_total == 0 and not stats.handling
        for w in (a_writer, c_writer):
            w.close()
    finally:
        task.cancel()
        listener.close()
        await runner.cleanup()


async def test_a_client_that_stops_reading_its_answer_is_cut_after_the_header_timeout():
    runner, task, listener, stats = await _guarded_app(max_connections=8, header_timeout=1.0)
    port = listener.getsockname()[1]
    try:
        _reader, writer = await _get(port, "/big")  # 16 MB asked for and never read
        for _ in range(50):
            await asyncio.sleep(0.1)
            if stats.write_timed_out_total:
                break
        assert stats.write_timed_out_total == 1 and stats.open == 0
        writer.close()
        fine, w2 = await _get(port, "/fast")
        assert await _answer(fine) == b"200 fast"
        w2.close()
    finally:
        task.cancel()
        listener.close()
        await runner.cleanup()
