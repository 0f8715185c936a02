"""Wait for something a test is owed by polling it under a deadline, not by sleeping a guessed time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def _once(predicate: Callable[[], T], deadline: float, timeout: float, what: str) -> T | None:
    """Return the predicate's value if truthy, None to poll again; fail the test once the deadline passed."""
    got = predicate()
    if got:
        return got
    if time.monotonic() >= deadline:
        pytest.fail(f"timed out after {timeout} s waiting for {what or predicate}")
    return None


def wait_until(
    predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.01, what: str = ""
) -> T:
    """Return the predicate's first truthy value as soon as it has one; fail the test after `timeout` s."""
    deadline = time.monotonic() + timeout
    while (got := _once(predicate, deadline, timeout, what)) is None:
        time.sleep(interval)
    return got


async def wait_until_async(
    predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.01, what: str = ""
) -> T:
    """`wait_until` for a coroutine: sleep on the loop between polls, so what it runs (a socket read) goes on."""
    deadline = time.monotonic() + timeout
    while (got := _once(predicate, deadline, timeout, what)) is None:
        await asyncio.sleep(interval)
    return got
