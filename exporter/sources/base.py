"""The Source contract and the wrapper that keeps one failing source from failing the rest."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
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
    engine's page rarely while the Snapshot serves its counts from an agent). A source whose read
    is one blocking call in its thread, or no wait at all, may have `start_read()`: the read
    started at once and its future (done, or under way), which the Sampler awaits instead of a
    task around `read()` (no task, no timeout context, fewer turns of the event loop).
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
    with ReadTimeout, so a hung driver call costs one thread, never a growing pile. The
    hand-off is one queue put and one `call_soon_threadsafe` (no executor, no concurrent
    future and its condition, no chained future); the thread is a daemon, so a hung read
    never holds up the process's exit. `on_exit` runs in the thread once it stops after
    `close()` (or in `close()` when no thread ever started): what the reads kept open is
    closed where it was used, never under a read still running.
    """

    def __init__(self, name: str, timeout: float, on_exit: Callable[[], None] | None = None) -> None:
        self._thread_name = f"bw-{name}_0"  # the name ThreadPoolExecutor gave its one worker
        self._timeout = timeout
        self._on_exit = on_exit
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._busy = False  # a read is queued or running in the thread
        self._closed = False

    async def run(self, fn: Callable[[], T]) -> T:
        """Run fn in the reader's thread and return its result, or raise ReadTimeout (`submit`, awaited)."""
        return await self.submit(fn)

    def submit(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        """Start fn in the reader's thread and return its future: what `run()` awaits, without a task.

        The future fails as `run()` raises: ReadTimeout at once while the previous read still runs,
        or once the read outlasts the timeout (the read goes on and its result is dropped);
        RuntimeError after close. Cancelling it drops the result.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        if self._busy:
            future.set_exception(ReadTimeout("previous read still running"))
            return future
        if self._closed:
            future.set_exception(RuntimeError("cannot schedule new reads after close"))
            return future
        self._busy = True
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name=self._thread_name, daemon=True)
            self._thread.start()
        expiry = loop.call_later(self._timeout, _expire, future, self._timeout)
        self._jobs.put((fn, future, loop, expiry))
        return future

    def _work(self) -> None:
        """Run the queued reads one by one, handing each result back to its event loop."""
        try:
            while (job := self._jobs.get()) is not None:
                fn, future, loop, expiry = job
                if self._closed:  # queued but not started when the reader closed: dropped
                    return
                try:
                    result, error = fn(), None
                except BaseException as exc:  # as an executor does: the awaiting side re-raises it
                    result, error = None, exc
                self._busy = False
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(_deliver, future, result, error, expiry)
        finally:
            if self._on_exit is not None:
                self._on_exit()

    def close(self) -> None:
        """Stop the thread without waiting for a hung read."""
        self._closed = True
        self._jobs.put(None)
        if self._thread is None and self._on_exit is not None:
            self._on_exit()


_Job = tuple[Callable[[], Any], "asyncio.Future[Any]", asyncio.AbstractEventLoop, asyncio.TimerHandle]


def _expire(future: asyncio.Future[Any], timeout: float) -> None:
    """Fail a submitted read's future that outlasted its timeout (the read goes on in the thread)."""
    if not future.done():
        future.set_exception(ReadTimeout(f"read took longer than {timeout:.2f}s"))


def _deliver(
    future: asyncio.Future[Any],
    result: Any,
    error: BaseException | None,
    expiry: asyncio.TimerHandle,
) -> None:
    """Set a read's outcome on its future, unless the awaiting side gave up (timeout, cancel)."""
    expiry.cancel()
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def cpu_seconds() -> float:
    """Return this process's CPU time, s."""
    return time.process_time()
