"""The host source on /proc-style fixture files and on this machine."""

import shutil
import time
from pathlib import Path

import pytest

from exporter.config import HostConfig
from exporter.sources.host import HostSource, parse_proc_stat

FIX = Path(__file__).parents[1] / "fixtures"


def test_proc_stat_counts_idle_and_iowait_as_not_busy():
    busy, total, cpus = parse_proc_stat((FIX / "host" / "proc" / "stat").read_text())
    assert (busy, total, cpus) == (1500, 10000, 2)


def test_cpu_busy_is_the_share_of_jiffies_between_two_ticks(tmp_path):
    proc = tmp_path / "proc"
    shutil.copytree(FIX / "host" / "proc", proc)
    src = HostSource(HostConfig(proc_root=str(proc), cgroup_root=str(FIX / "cgroup" / "v2")))
    first = src.read_blocking()
    assert first.cpus == 2 and first.cpu_busy is None  # no previous tick yet
    # one second later on 2 CPUs (200 jiffies): 150 busy, 50 idle
    (proc / "stat").write_text(
        "cpu  1100 0 550 8050 500 0 0 0 0 0\ncpu0 0 0 0 0 0 0 0 0\ncpu1 0 0 0 0 0 0 0 0\n"
    )
    second = src.read_blocking()
    assert second.cpu_busy == pytest.approx(0.75)
    assert second.own_cgroup is not None and second.own_cgroup.path == "/"


def test_reads_this_machine():
    src = HostSource(HostConfig())
    src.read_blocking()
    time.sleep(0.1)  # let a few jiffies pass
    reading = src.read_blocking()
    assert reading.cpus >= 1
    assert reading.cpu_busy is not None and 0.0 <= reading.cpu_busy <= 1.0
    src.close()


def test_own_cgroup_path_is_read_again_each_period_and_its_counters_every_tick(tmp_path):
    proc = tmp_path / "proc"
    shutil.copytree(FIX / "host" / "proc", proc)
    (proc / "self").mkdir()
    (proc / "self" / "cgroup").write_text("0::/kubepods.slice/pod1\n")
    now = [100.0]
    src = HostSource(
        HostConfig(proc_root=str(proc), cgroup_root=str(FIX / "cgroup" / "v2")), clock=lambda: now[0]
    )
    first = src.read_blocking().own_cgroup
    assert first is not None and first.path == "/kubepods.slice/pod1"
    (proc / "self" / "cgroup").write_text("0::/\n")  # the daemon moved to the root cgroup
    now[0] += 4.9
    assert src.read_blocking().own_cgroup.path == "/kubepods.slice/pod1"  # within the period
    now[0] += 0.1
    moved = src.read_blocking().own_cgroup
    assert moved is not None and moved.path == "/" and moved.usage_seconds != first.usage_seconds


def test_a_missing_proc_stat_fails_the_read(tmp_path):
    src = HostSource(HostConfig(proc_root=str(tmp_path), cgroup_root=str(FIX / "cgroup" / "v2")))
    with pytest.raises(OSError):
        src.read_blocking()


def test_the_tick_reads_the_host_on_its_own_thread_with_no_reader_thread_to_wake(tmp_path):
    """start_read reads at once on the caller's thread and hands back a done future; a failed read fails it."""
    import asyncio
    import threading

    proc = tmp_path / "proc"
    shutil.copytree(FIX / "host" / "proc", proc)
    src = HostSource(HostConfig(proc_root=str(proc), cgroup_root=str(FIX / "cgroup" / "v2")))
    threads = set(threading.enumerate())

    async def tick() -> None:
        first = src.start_read()
        assert first.done() and first.result().cpus == 2
        (proc / "stat").unlink()
        failed = src.start_read()  # a read that fails is the future's outcome, as a task's would be
        assert failed.done() and isinstance(failed.exception(), OSError)

    asyncio.run(tick())
    assert set(threading.enumerate()) == threads  # no thread started for the host
    src.close()
