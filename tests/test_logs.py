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
    ],
)
def test_scrub_removes_a_urls_credentials_and_keeps_where_it_points(text: str, shown: str) -> None:
    assert scrub(text) == shown
    assert web.redact(text) == shown  # /api/snapshot and the status page scrub the same way


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
    finally:
        logging.getLogger().handlers.clear()
    lines = [json.loads(line) for line in err.getvalue().splitlines()]
    assert [e["event"] for e in lines] == ["engine_down", "GET http://h:1/m?token=redacted failed"]
    assert lines[0]["url"] == "http://127.0.0.1:8000/metrics?token=redacted"
    assert "hunter2" not in err.getvalue() and "SECRET" not in err.getvalue()
