"""The Source contract and the wrapper that keeps one failing source from failing the rest."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, runtime_checkable

T = TypeVar("T")


class SourceUnavailable(Exception):
    """The outside party is not there (no engine, a source switched off): a state, not a counted error."""

    counted = False


class SourceDown(SourceUnavailable):
    """The outside party should answer and does not (NVML fails to start): a state, counted as an error."""

    counted = True


@runtime_checkable
class Source(Protocol):
    """One outside party. `read()` returns this tick's reading or raises.

    Sources whose reads block (NVML, /proc) do their work through `BlockingReader`, so the
    event loop never waits on them; `close()` releases what the source holds. A source may also
    have `async start()` (see Startable) and `async aclose()` (see AsyncClosable). The Sampler is
    the one owner of that lifecycle: it starts each source once before the first tick and closes
    each once at the end, with `aclose()` where there is one, else `close()`. A source may also
    have `follow(snap)`: the sampler hands it each new Snapshot (the engine source reads an
    engine's page rarely while the Snapshot serves its counts from an agent).
    """

    name: str

    async def read(self) -> Any:
        """Return this tick's reading."""
        ...

    def close(self) -> None:
        """Release handles, threads and sockets."""
        ...


@runtime_checkable
class Startable(Protocol):
    """A source with something to set up before its first read (a socket to bind)."""

    async def start(self) -> None:
        """Set up; raise when impossible (the source then reports itself down each tick)."""
        ...


@runtime_checkable
class AsyncClosable(Protocol):
    """A source whose release must be awaited (an HTTP session)."""

    async def aclose(self) -> None:
        """Release everything, awaiting what must be awaited."""
        ...


class ReadTimeout(Exception):
    """A blocking read did not finish in time."""


class BlockingReader:
    """Run one blocking read at a time in a private thread, with a timeout.

    A read still running when the next tick comes is not started again: the tick fails
    with ReadTimeout, so a hung driver call costs one thread, never a growing pile.
    """

    def __init__(self, name: str, timeout: float) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"bw-{name}")
        self._timeout = timeout
        self._inflight: concurrent.futures.Future[Any] | None = None

    async def run(self, fn: Callable[[], T]) -> T:
        """Run fn in the reader's thread and return its result, or raise ReadTimeout."""
        if self._inflight is not None and not self._inflight.done():
            raise ReadTimeout("previous read still running")
        future = self._pool.submit(fn)
        self._inflight = future
        try:  # asyncio.timeout: no waiter future of its own, as wait_for has, so one loop turn less
            async with asyncio.timeout(self._timeout):
                return await asyncio.wrap_future(future)
        except TimeoutError as exc:
            raise ReadTimeout(f"read took longer than {self._timeout:.2f}s") from exc

    def close(self) -> None:
        """Stop the thread without waiting for a hung read."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def cpu_seconds() -> float:
    """Return this process's CPU time, s."""
    return time.process_time()
