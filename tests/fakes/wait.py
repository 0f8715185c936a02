"""Wait for something a test is owed by polling it under a deadline, not by sleeping a guessed time.

`what` names what is awaited in the failure; a callable is asked only then, so it can say what
the last poll saw (the predicate keeps it, the message reads it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


Said = str | Callable[[], str]


def _once(predicate: Callable[[], T], deadline: float, timeout: float, what: Said) -> T | None:
    """Return the predicate's value if truthy, None to poll again; fail the test once the deadline passed."""
    got = predicate()
    if got:
        return got
    if time.monotonic() >= deadline:
        said = what() if callable(what) else what
        pytest.fail(f"timed out after {timeout} s waiting for {said or predicate}")
    return None


def wait_until(
    predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.01, what: Said = ""
) -> T:
    """Return the predicate's first truthy value as soon as it has one; fail the test after `timeout` s."""
    deadline = time.monotonic() + timeout
    while (got := _once(predicate, deadline, timeout, what)) is None:
        time.sleep(interval)
    return got


async def wait_until_async(
    predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.01, what: Said = ""
) -> T:
    """`wait_until` for a coroutine: sleep on the loop between polls, so what it runs (a socket read) goes on."""
    deadline = time.monotonic() + timeout
    while (got := _once(predicate, deadline, timeout, what)) is None:
        await asyncio.sleep(interval)
    return got
