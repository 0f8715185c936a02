"""The Source contract and the wrapper that keeps one failing source from failing the rest."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import queue
import threading
import time
from collections.abc import Callable, Iterator
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
    task around `read()` (no task, no timeout context, fewer turns of the event loop). One whose
    `start_read` hands the read to a `BlockingReader` may say so with `reads_in_thread = True`: the
    Sampler's `run` then starts it a tick ahead, under a `Handoff` that says when it is due.
    A source that leaves part of what it found unread past a bound may say how much in an int
    `over_bound`; the Sampler copies it into the source's status (`boundwatch_source_over_bound`).
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
        RuntimeError after close. Cancelling it drops the result. Under a tick's `Handoff` that has a
        `not_before`, fn runs no earlier than that (its timeout counts from then); one the handoff
        expects with a `period` has the thread sleep, once it is done, until a period after it (the
        next tick's read, queued meanwhile, then wakes nobody: see `Handoff`).
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
        handoff = _HANDOFF.get()
        not_before = handoff.not_before if handoff is not None else None
        delay = max(0.0, not_before - time.monotonic()) if not_before is not None else 0.0
        expiry = loop.call_later(delay + self._timeout, _expire, future, self._timeout)
        if handoff is not None and not handoff.expect(loop):
            handoff = None  # a tick's handoff takes only the reads its sources start, before it is sealed
        period = handoff.period if handoff is not None else 0.0
        self._jobs.put((fn, future, loop, expiry, handoff, not_before, period))
        return future

    def _work(self) -> None:
        """Run the queued reads one by one, handing each result back to its event loop."""
        name_os_thread(self._thread_name)
        try:
            while (job := self._jobs.get()) is not None:
                fn, future, loop, expiry, handoff, not_before, period = job
                if not_before is not None:
                    _sleep_until(not_before)
                if self._closed:  # queued but not started when the reader closed: dropped
                    return
                try:
                    result, error = fn(), None
                except BaseException as exc:  # as an executor does: the awaiting side re-raises it
                    result, error = None, exc
                self._busy = False
                if handoff is None:
                    with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                        loop.call_soon_threadsafe(_deliver, future, result, error, expiry)
                    continue
                handoff.deliver(future, result, error, expiry)
                if period > 0 and not_before is not None and not self._closed:
                    # asleep, not waiting on the queue, when the next tick's read is queued: its put
                    # wakes nobody, and this thread wakes once a tick, when that read is due
                    _sleep_until(not_before + period)
        finally:
            if self._on_exit is not None:
                self._on_exit()

    def close(self) -> None:
        """Stop the thread without waiting for a hung read."""
        self._closed = True
        self._jobs.put(None)
        if self._thread is None and self._on_exit is not None:
            self._on_exit()


def name_os_thread(name: str) -> None:
    """Give the calling thread its name in the kernel too (Linux: 15 bytes), so `top -H` and /proc tell the readers apart.

    Python before 3.14 names its threads only for itself; a host without /proc is left as it is.
    """
    with contextlib.suppress(OSError):
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
            f.write(name.encode("ascii", "replace")[:15].decode("ascii"))


_Job = tuple[
    Callable[[], Any],
    "asyncio.Future[Any]",
    asyncio.AbstractEventLoop,
    asyncio.TimerHandle,
    "Handoff | None",
    float | None,
    float,
]


def _sleep_until(deadline: float) -> None:
    """Sleep in the calling thread until time.monotonic() reaches deadline (a plain sleep: the cheapest wake)."""
    left = deadline - time.monotonic()
    if left > 0:
        time.sleep(left)


class Handoff:
    """The reads one tick starts in reader threads, handed back to the event loop together.

    Each reader thread leaves its outcome here; the last of the tick's reads to finish wakes the
    loop once (one `call_soon_threadsafe`), which then sets every future: one wake-up of the loop a
    tick, not one per thread. The Sampler opens it around its sources' starts (`opened`): a read
    submitted meanwhile is expected here, one submitted once it is sealed goes back on its own.
    A read that hangs holds the others back only until the tick's budget, when the Sampler takes
    what is ready (`take`); the hung one is handed back alone when it ends. `ended` holds when each
    read finished in its thread (perf_counter), so its duration never counts the wait for the others.

    A tick's reads may be started ahead of it (`Sampler.run`): `not_before` (time.monotonic()) is
    when its reader threads run them, and `period` the ticks' spacing, after which each expected
    reader's thread sleeps until its next read is due. Each reader thread then wakes once a tick
    from a plain sleep, and the event loop once, when the last read is handed back, not also at
    the tick's start to hand the reads out (~0.3 ms of CPU a tick with two reader threads on the
    development VM: bench/README.md, session 25).
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, not_before: float | None = None, period: float = 0.0
    ) -> None:
        self._loop = loop
        self.not_before = not_before
        self.period = period
        self._lock = threading.Lock()
        self._open = 0  # reads expected and not yet finished
        self._ready: list[tuple[asyncio.Future[Any], Any, BaseException | None, asyncio.TimerHandle]] = []
        self._sealed = False
        self.ended: dict[asyncio.Future[Any], float] = {}

    @contextlib.contextmanager
    def opened(self) -> Iterator[Handoff]:
        """Take the reads submitted inside the block, then seal: those finished already are handed back at once."""
        token = _HANDOFF.set(self)
        try:
            yield self
        finally:
            _HANDOFF.reset(token)
            with self._lock:
                self._sealed = True
                done = not self._open
            if done:
                self.take()

    def expect(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Count one more read to wait for; False once sealed (or for another loop's read)."""
        if self._sealed or loop is not self._loop:
            return False
        with self._lock:
            self._open += 1
        return True

    def deliver(
        self,
        future: asyncio.Future[Any],
        result: Any,
        error: BaseException | None,
        expiry: asyncio.TimerHandle,
    ) -> None:
        """Leave a read's outcome (in its reader thread); the last one of a sealed handoff wakes the loop."""
        ended = time.perf_counter()
        with self._lock:
            self._ready.append((future, result, error, expiry))
            self.ended[future] = ended
            self._open -= 1
            wake = self._sealed and not self._open
        if wake:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(self.take)

    def take(self) -> bool:
        """Set the futures of the reads finished so far (on the loop); say whether there were any."""
        with self._lock:
            ready, self._ready = self._ready, []
        for future, result, error, expiry in ready:
            _deliver(future, result, error, expiry)
        return bool(ready)


_HANDOFF: contextvars.ContextVar[Handoff | None] = contextvars.ContextVar("bw_handoff", default=None)


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
