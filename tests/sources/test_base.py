"""The blocking reader: one read at a time in a private daemon thread, its outcome handed back to the loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from exporter.sources.base import BlockingReader, ReadTimeout


async def test_a_read_returns_its_result_from_the_reader_thread():
    reader = BlockingReader("demo", timeout=5.0)
    try:
        name = await reader.run(lambda: threading.current_thread().name)
        assert name == "bw-demo_0"
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
        for _ in range(500):  # the late read ends; the reader then takes reads again
            try:
                assert await reader.run(lambda: 2) == 2
                break
            except ReadTimeout:
                await asyncio.sleep(0.01)
        else:
            raise AssertionError("the reader never took a read again")
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
