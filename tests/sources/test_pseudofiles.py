"""Kept /proc and cgroup files: one pread each, the same text a fresh open reads, dropped when their process goes."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.sources import procs
from exporter.sources.base import BlockingReader
from exporter.sources.pseudofiles import KeptFiles

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs Linux /proc")


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def fresh(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_a_proc_file_is_kept_open_and_read_again_with_one_pread(child: subprocess.Popen[bytes]) -> None:
    files = KeptFiles()
    path = f"/proc/{child.pid}/cgroup"
    assert files.read(path) == fresh(path)
    assert len(files) == 1 and files.opens == 1
    assert files.read(path) == fresh(path)
    assert files.preads == 1 and files.opens == 1
    files.close()


def test_a_kept_file_reads_what_the_kernel_writes_now(child: subprocess.Popen[bytes]) -> None:
    files = KeptFiles()
    path = f"/proc/{os.getpid()}/stat"
    before = procs.parse_stat(files.read(path).decode())
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:  # some CPU for utime + stime to move
        pass
    after = procs.parse_stat(files.read(path).decode())
    assert files.preads == 1
    assert before is not None and after is not None and after.cpu_ticks > before.cpu_ticks
    files.close()


def test_the_file_of_a_process_gone_is_dropped_and_read_as_a_fresh_open_reads_it(
    child: subprocess.Popen[bytes],
) -> None:
    files = KeptFiles()
    path = f"/proc/{child.pid}/stat"
    files.read(path)
    child.kill()
    child.wait()
    with pytest.raises(FileNotFoundError):
        files.read(path)
    assert files.dropped == 1 and len(files) == 0


def test_the_file_of_a_thread_gone_is_dropped() -> None:
    files = KeptFiles()
    done = threading.Event()
    thread = threading.Thread(target=done.wait)
    thread.start()
    path = f"/proc/{os.getpid()}/task/{thread.native_id}/stat"
    assert procs.parse_stat(files.read(path).decode()) is not None
    done.set()
    thread.join()
    deadline = time.monotonic() + 5
    while os.path.exists(path) and time.monotonic() < deadline:  # the OS thread ends after join
        time.sleep(0.01)
    with pytest.raises(FileNotFoundError):
        files.read(path)
    assert files.dropped == 1 and len(files) == 0


def test_a_plain_file_is_never_kept_so_a_replaced_or_removed_fixture_reads_as_it_is_now(
    tmp_path: Path,
) -> None:
    files = KeptFiles()
    path = tmp_path / "stat"
    path.write_text("1 (a) S 0\n")
    assert files.read(str(path)) == b"1 (a) S 0\n"
    new = tmp_path / "stat.new"
    new.write_text("1 (b) R 0\n")
    os.replace(new, path)
    assert files.read(str(path)) == b"1 (b) R 0\n"
    path.write_text("")
    assert files.read(str(path)) == b""
    path.unlink()
    with pytest.raises(FileNotFoundError):
        files.read(str(path))
    assert len(files) == 0 and files.preads == 0


def test_a_sweep_closes_the_files_not_read_since_the_last(child: subprocess.Popen[bytes]) -> None:
    files = KeptFiles()
    mine, theirs = f"/proc/{os.getpid()}/stat", f"/proc/{child.pid}/stat"
    files.read(mine)
    files.read(theirs)
    fd = files._fds[theirs]
    files.sweep()
    assert len(files) == 2
    files.read(mine)
    files.sweep()
    assert list(files._fds) == [mine]
    with pytest.raises(OSError):
        os.fstat(fd)
    files.close()
    assert len(files) == 0


def test_past_the_limit_files_are_read_by_path_and_counted(child: subprocess.Popen[bytes]) -> None:
    files = KeptFiles(limit=1)
    mine, theirs = f"/proc/{os.getpid()}/cgroup", f"/proc/{child.pid}/cgroup"
    assert files.read(mine) == fresh(mine)
    assert files.read(theirs) == fresh(theirs)
    assert files.read(theirs) == fresh(theirs)
    assert len(files) == 1 and files.unkept == 2
    files.close()


def test_the_reader_closes_what_its_reads_kept_in_its_own_thread_at_close() -> None:
    ran: list[str] = []
    reader = BlockingReader("t", 1.0, on_exit=lambda: ran.append(threading.current_thread().name))
    reader.close()  # no thread ever started: closed at once, here
    assert ran == [threading.current_thread().name]

    import asyncio

    async def one_read() -> BlockingReader:
        r = BlockingReader("t2", 1.0, on_exit=lambda: ran.append(threading.current_thread().name))
        await r.run(lambda: 1)
        r.close()
        return r

    reader = asyncio.run(one_read())
    assert reader._thread is not None
    reader._thread.join(5)
    assert ran[-1] == "bw-t2_0"


def test_the_cpu_tracker_keeps_a_watched_process_files_until_it_goes(child: subprocess.Popen[bytes]) -> None:
    files = KeptFiles()
    tracker = procs.CpuTracker(files=files)
    info = procs.proc_info("/proc", child.pid)
    assert info is not None
    tracker.sample([info])
    files.sweep()
    time.sleep(0.05)
    assert child.pid in tracker.sample([info])
    files.sweep()
    assert f"/proc/{child.pid}/stat" in files._fds
    child.kill()
    child.wait()
    assert tracker.sample([info]) == {}
    files.sweep()
    assert not [p for p in files._fds if p.startswith(f"/proc/{child.pid}/")]
    files.close()


def test_schedstat_is_not_looked_for_again_only_where_the_kernel_keeps_none(
    child: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    files = KeptFiles()
    tracker = procs.CpuTracker(files=files)
    info = procs.proc_info("/proc", child.pid)
    assert info is not None
    tracker.sample([info])
    missing = not os.path.exists(f"/proc/{child.pid}/task/{child.pid}/schedstat")
    assert tracker.no_schedstat is missing
    reads = tracker.schedstat_reads
    time.sleep(0.02)
    tracker.sample([info])
    assert (tracker.schedstat_reads == reads) is missing
    files.close()
    # a fixture tree of plain files without schedstat: looked for at every read (one may appear)
    task = tmp_path / "77" / "task" / "77"
    task.mkdir(parents=True)
    line = "77 (t) S 1 1 1 0 -1 0 0 0 0 0 5 5 0 0 20 0 1 0 4000 0 0\n"
    (tmp_path / "77" / "stat").write_text(line)
    (task / "stat").write_text(line)
    fixture = procs.CpuTracker(str(tmp_path), files=KeptFiles())
    plain = procs.ProcInfo(77, 1, "t", (), 4000)
    fixture.sample([plain])
    fixture.sample([plain])
    assert not fixture.no_schedstat and fixture.schedstat_reads == 2
