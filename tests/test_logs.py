"""The daemon's logs and pages show URLs without their credentials: user:password and query values."""

from __future__ import annotations

import io
import json
import logging
import sys

import pytest
import structlog

from exporter.logs import configure, scrub
from exporter.serve import web


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("http://admin:p@ss@127.0.0.1:8000/metrics", "http://127.0.0.1:8000/metrics"),  # '@' in a password
        (
            "http://127.0.0.1:8000/metrics?token=SECRET&a=1#top",
            "http://127.0.0.1:8000/metrics?token=redacted&a=redacted#top",
        ),
        ("engine at https://u:pw@[::1]:8000/m refused", "engine at https://[::1]:8000/m refused"),
        ("http://u:p?x@host/m", "http://host/m"),  # a '?' in the user part: still all of it
        ("http://host:8000/metrics", "http://host:8000/metrics"),
        ("no URL: a@b ? c=d", "no URL: a@b ? c=d"),
        ("(http://h/m?a=b) twice", "(http://h/m?a=redacted) twice"),  # the sentence's punctuation kept
        ("at http://u:p@h/m?x=1: refused", "at http://h/m?x=redacted: refused"),
        ("s3://bucket/llama?versionId=v7", "s3://bucket/llama?versionId=v7"),  # a model's name, no web query
        ("redis://u:pw@cache:6379/0", "redis://cache:6379/0"),  # a password in any scheme
        # a '/' left unencoded in a password: the authority is no host:port, so it ran on to the '@'
        ("bad URL http://admin:pa/ss@host:8000/metrics", "bad URL http://host:8000/metrics"),
        ("http://u:p/a/s@s@h/m?t=x@y", "http://h/m?t=redacted"),
        # a path holding '@' after a real host[:port] (an npm scope, say) is a path
        ("http://host:8000/@scope/pkg", "http://host:8000/@scope/pkg"),
        ("http://host/a@b", "http://host/a@b"),
        ("http://[::1]:80/a@b", "http://[::1]:80/a@b"),
        ("http://h:/a@b", "http://h:/a@b"),
    ],
)
def test_scrub_removes_a_urls_credentials_and_keeps_where_it_points(text: str, shown: str) -> None:
    assert scrub(text) == shown
    assert web.served(text) == shown  # /api/snapshot scrubs the same way (and the status page, given `scrub`)


def test_served_snapshot_data_holds_no_credentials() -> None:
    data = web.served({"url": "http://prom:p@ss@127.0.0.1:8000/metrics?token=SECRET", "n": 1})
    assert data == {"url": "http://127.0.0.1:8000/metrics?token=redacted", "n": 1}


def test_log_lines_from_structlog_and_stdlib_never_carry_a_urls_credentials(monkeypatch) -> None:
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    try:
        configure("info", "json")
        structlog.get_logger().warning(
            "engine_down", url="http://admin:hunter2@127.0.0.1:8000/metrics?token=SECRET",
            error="cannot read http://admin:hunter2@127.0.0.1:8000/metrics?token=SECRET: refused",
        )  # fmt: skip
        logging.getLogger("aiohttp.client").warning(
            "GET %s failed", "http://admin:hunter2@h:1/m?token=SECRET"
        )
        try:
            raise ConnectionError("cannot read http://admin:hunter2@h:1/m?token=SECRET")
        except ConnectionError as exc:
            structlog.get_logger().exception("read_failed", error=exc)  # a traceback and an object
    finally:
        logging.getLogger().handlers.clear()
    lines = [json.loads(line) for line in err.getvalue().splitlines()]
    assert [e["event"] for e in lines] == [
        "engine_down",
        "GET http://h:1/m?token=redacted failed",
        "read_failed",
    ]
    assert "cannot read http://h:1/m?token=redacted" in lines[2]["exception"]
    assert lines[2]["error"] == "cannot read http://h:1/m?token=redacted"
    assert lines[0]["url"] == "http://127.0.0.1:8000/metrics?token=redacted"
    assert "hunter2" not in err.getvalue() and "SECRET" not in err.getvalue()


async def test_malformed_requests_log_one_line_in_ten_seconds_without_a_traceback(monkeypatch) -> None:
    """Anyone who reaches the port can send them before any credentials: each was a traceback at error level."""
    import asyncio

    from aiohttp import web as aioweb
    from aiohttp.test_utils import TestServer

    from exporter.export.http import HttpCollector
    from exporter.logs import CLIENT_ERRORS
    from exporter.serve.listener import ListenerStats

    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    for name, fresh in (("_at", float("-inf")), ("left_out", 0), ("total", 0)):  # the process's one
        monkeypatch.setattr(CLIENT_ERRORS, name, fresh)  # filter, as at start (restored after)
    app = aioweb.Application()

    async def broken(_request: aioweb.Request) -> aioweb.Response:
        raise RuntimeError("a bug of ours")

    app.router.add_get("/broken", broken)
    try:
        configure("info", "json")
        async with TestServer(app, host="127.0.0.1") as server:
            for _ in range(30):
                reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
                writer.write(b"GET /\x01 HTTP/1.1\r\n\r\n")
                await writer.drain()
                assert (await reader.read(100)).split(b" ")[1] == b"400"
                writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"GET /broken HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await reader.read(100)).startswith(b"HTTP/1.1 500")
            writer.close()
            await asyncio.sleep(0.05)
    finally:
        logging.getLogger().handlers.clear()
    lines = [json.loads(line) for line in err.getvalue().splitlines()]
    bad = [e for e in lines if "BadHttpMessage" in e["event"] or "InvalidURLError" in e["event"]]
    assert len(bad) == 1 and "exception" not in bad[0] and bad[0]["level"] == "warning"
    assert "0 more left out" in bad[0]["event"]
    # each counted, as boundwatch_http_refused_total{cause="bad_request"}
    assert CLIENT_ERRORS.total == 30
    refused = next(
        m
        for m in HttpCollector(ListenerStats(), None, lambda: CLIENT_ERRORS.total).collect()
        if m.samples[0].labels
    )
    assert {s.labels["cause"]: s.value for s in refused.samples}["bad_request"] == CLIENT_ERRORS.total
    ours = [e for e in lines if "a bug of ours" in e.get("exception", "")]
    assert len(ours) == 1  # a handler's own exception keeps its traceback
    kept = [
        line for line in err.getvalue().splitlines() if '"aiohttp.access"' not in line
    ]  # the daemon has none
    assert sum(map(len, kept)) < 3000  # 31 requests: was ~20 KB of tracebacks
