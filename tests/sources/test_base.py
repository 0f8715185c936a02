"""The blocking reader: one read at a time in a private daemon thread, its outcome handed back to the loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from exporter.sources.base import BlockingReader, Handoff, ReadTimeout


async def takes_reads_again(read) -> None:  # type: ignore[no-untyped-def]
    """Wait (up to ~5 s) until read(fn) runs a read again after a late one; fail if it never does."""
    for _ in range(500):
        try:
            assert await read(lambda: 2) == 2
            return
        except ReadTimeout:
            await asyncio.sleep(0.01)
    raise AssertionError("the reader never took a read again")


async def test_a_read_returns_its_result_from_the_reader_thread():
    reader = BlockingReader("demo", timeout=5.0)
    try:
        name = await reader.run(lambda: threading.current_thread().name)
        assert name == "bw-demo_0"
        tid = await reader.run(threading.get_native_id)  # the kernel knows it too: top -H, /proc
        with open(f"/proc/self/task/{tid}/comm") as f:
            assert f.read().strip() == "bw-demo_0"
        assert await reader.run(lambda: 42) == 42  # the same thread serves the next read
    finally:
        reader.close()


async def test_an_error_in_the_read_reaches_the_caller():
    reader = BlockingReader("demo", timeout=5.0)

    def fail() -> None:
        raise OSError("gone")

    try:
        with pytest.raises(OSError, match="gone"):
            await reader.run(fail)
        assert await reader.run(lambda: "after") == "after"
    finally:
        reader.close()


async def test_a_late_read_times_out_and_blocks_a_second_until_it_ends():
    reader = BlockingReader("demo", timeout=0.05)
    release = threading.Event()
    try:
        with pytest.raises(ReadTimeout, match=r"longer than 0\.05s"):
            await reader.run(lambda: release.wait(5))
        with pytest.raises(ReadTimeout, match="previous read still running"):
            await reader.run(lambda: 1)
        release.set()
        await takes_reads_again(reader.run)  # the late read ends; the reader then takes reads again
    finally:
        release.set()
        reader.close()


async def test_the_reader_thread_is_a_daemon_and_stops_on_close():
    reader = BlockingReader("demo", timeout=5.0)
    await reader.run(lambda: None)
    thread = reader._thread
    assert thread is not None and thread.daemon  # a hung driver call never holds up the exit
    reader.close()
    thread.join(5)
    assert not thread.is_alive()
    with pytest.raises(RuntimeError):
        await reader.run(lambda: None)


async def test_a_submitted_read_is_the_same_read_as_run_without_a_task():
    reader = BlockingReader("demo", timeout=5.0)

    def fail() -> None:
        raise OSError("gone")

    try:
        future = reader.submit(lambda: threading.current_thread().name)
        assert not isinstance(future, asyncio.Task)
        assert await future == "bw-demo_0"
        with pytest.raises(OSError, match="gone"):
            await reader.submit(fail)
        assert await reader.submit(lambda: 42) == 42
        loop = asyncio.get_running_loop()
        assert not [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
    finally:
        reader.close()


async def test_a_late_submitted_read_fails_as_run_fails_and_blocks_a_second_until_it_ends():
    reader = BlockingReader("demo", timeout=0.05)
    release = threading.Event()
    try:
        with pytest.raises(ReadTimeout, match=r"read took longer than 0\.05s"):
            await reader.submit(lambda: release.wait(5))
        second = reader.submit(lambda: 1)
        assert second.done()
        with pytest.raises(ReadTimeout, match="previous read still running"):
            second.result()
        release.set()
        await takes_reads_again(reader.submit)  # the late read ends (its result dropped)
    finally:
        release.set()
        reader.close()


async def test_a_cancelled_submitted_read_drops_its_result_and_a_closed_reader_refuses():
    reader = BlockingReader("demo", timeout=5.0)
    release = threading.Event()
    future = reader.submit(lambda: release.wait(5))
    future.cancel()
    release.set()
    for _ in range(500):  # the cancelled read ends; its result goes nowhere
        if not reader._busy:
            break
        await asyncio.sleep(0.01)
    assert await reader.submit(lambda: 3) == 3
    assert future.cancelled()
    reader.close()
    with pytest.raises(RuntimeError, match="after close"):
        await reader.submit(lambda: None)


async def wait_until(check, seconds: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    """Let the loop run until check() is true; fail after `seconds`."""
    for _ in range(int(seconds / 0.005)):
        if check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("never happened")


async def test_reads_started_in_a_handoff_come_back_together_once_the_last_is_done():
    fast, slow = BlockingReader("fast", timeout=5.0), BlockingReader("slow", timeout=5.0)
    release, done = threading.Event(), threading.Event()

    def quick() -> int:
        done.set()
        return 1

    handoff = Handoff(asyncio.get_running_loop())
    try:
        with handoff.opened():
            first, second = fast.submit(quick), slow.submit(lambda: release.wait(5) and 2)
        assert done.wait(5)
        await wait_until(lambda: not fast._busy)  # the fast read ended in its thread...
        await asyncio.sleep(0.05)
        assert not first.done() and not second.done()  # ...and waits for the slow one
        release.set()
        assert await second == 2 and first.done() and first.result() == 1
        assert handoff.ended[first] <= handoff.ended[second]  # each read's own end, in its thread
    finally:
        release.set()
        fast.close()
        slow.close()


async def test_a_handoff_whose_reads_ended_before_it_was_sealed_hands_them_back_at_once():
    reader = BlockingReader("demo", timeout=5.0)
    handoff = Handoff(asyncio.get_running_loop())
    try:
        with handoff.opened():
            future = reader.submit(lambda: 7)
            await wait_until(lambda: not reader._busy)  # ended in its thread, not yet handed back
            assert not future.done()
        assert future.done() and future.result() == 7  # sealed: taken on the spot, no wake-up needed
    finally:
        reader.close()


async def test_a_read_submitted_after_the_handoff_is_sealed_comes_back_on_its_own():
    reader, hung = BlockingReader("demo", timeout=5.0), BlockingReader("hung", timeout=5.0)
    release = threading.Event()
    handoff = Handoff(asyncio.get_running_loop())
    try:
        with handoff.opened():
            held = hung.submit(lambda: release.wait(5))
        assert await reader.submit(lambda: 5) == 5  # not held back by the handoff's hung read
        assert not held.done()
    finally:
        release.set()
        reader.close()
        hung.close()


async def test_take_hands_back_what_is_ready_and_a_hung_read_comes_back_alone_when_it_ends():
    fast, hung = BlockingReader("fast", timeout=5.0), BlockingReader("hung", timeout=5.0)
    release = threading.Event()

    def fail() -> None:
        raise OSError("gone")

    handoff = Handoff(asyncio.get_running_loop())
    try:
        with handoff.opened():
            failed, held = fast.submit(fail), hung.submit(lambda: release.wait(5) and 3)
        await wait_until(lambda: not fast._busy)
        assert not failed.done()
        assert handoff.take() is True  # the tick's budget is over: what is ready, now
        with pytest.raises(OSError, match="gone"):  # the same outcome as without a handoff
            failed.result()
        assert handoff.take() is False and not held.done()
        release.set()
        assert await held == 3  # the last read wakes the loop by itself
        loop = asyncio.get_running_loop()
        assert not [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
    finally:
        release.set()
        fast.close()
        hung.close()


async def test_a_read_that_outlasts_its_timeout_in_a_handoff_fails_as_without_one():
    reader = BlockingReader("demo", timeout=0.05)
    release = threading.Event()
    handoff = Handoff(asyncio.get_running_loop())
    try:
        with handoff.opened():
            future = reader.submit(lambda: release.wait(5))
        with pytest.raises(ReadTimeout, match=r"read took longer than 0\.05s"):
            await future
        release.set()
        await takes_reads_again(reader.submit)  # the late read ends (its result dropped)
    finally:
        release.set()
        reader.close()


async def test_a_read_due_later_runs_no_earlier_and_its_timeout_counts_from_then():
    import time

    reader = BlockingReader("due", timeout=0.15)
    ran: list[float] = []
    due = time.monotonic() + 0.2
    handoff = Handoff(asyncio.get_running_loop(), not_before=due)
    try:
        with handoff.opened():
            future = reader.submit(lambda: ran.append(time.monotonic()) or 4)
        assert await future == 4  # 0.2 s to its time is past the 0.15 s timeout: not counted
        assert ran[0] >= due
    finally:
        reader.close()


async def test_a_thread_with_a_period_sleeps_until_its_next_read_is_due_so_queuing_it_wakes_nobody():
    import time

    reader = BlockingReader("paced", timeout=1.0)
    loop = asyncio.get_running_loop()
    ran: list[float] = []
    due = time.monotonic() + 0.05
    try:
        handoff = Handoff(loop, not_before=due, period=0.3)
        with handoff.opened():
            first = reader.submit(lambda: ran.append(time.monotonic()))
        await first
        await wait_until(lambda: not reader._busy)
        # the next tick's read, queued long before it is due, with nothing to say when: the thread is
        # asleep until a period after its last read, not waiting on the queue
        plain = reader.submit(lambda: ran.append(time.monotonic()))
        await plain
        assert ran[1] >= due + 0.3 - 0.01
        # without a period (a tick's own handoff, or none) a read queued after another runs at once
        t0 = time.monotonic()
        await reader.submit(lambda: ran.append(time.monotonic()))
        assert ran[2] - t0 < 0.1
    finally:
        reader.close()
