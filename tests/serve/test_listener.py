"""The listener's guard: the loop-error log is rate-limited, the unit leaves room for connections."""

import asyncio
import configparser

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
