"""The host: CPU count and busy share over each tick, and boundwatch's own cgroup.

Reads `/proc/stat` under an injectable `proc_root` and the cgroup tree under `cgroup_root`, so
tests feed it fixture files. The process table (API servers, their threads) is in procs.py.
Its own cgroup's counters are read every tick, the path to that cgroup (and whether the hierarchy
is v1 or v2) every `OWN_CGROUP_EVERY_SECONDS`: each file opened costs a cold tick tens of us.
/proc/stat and the counters' files are kept open and read with one pread each (pseudofiles.py).

It is read on the event loop, in the tick, not in a reader thread: its files are the kernel's
(procfs, cgroupfs), which answer from memory and never wait on a disk or a driver, in ~0.25 ms a
tick with every cache cold. A reader thread woken each tick cost the daemon more than the read:
at 8 GPUs the daemon used 0.92x the CPU without it (median of 12 pairs, 11 below 1; bench/README.md,
"Session 24"). NVML's calls and the engine's HTTP page, which can wait, keep threads of their own.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

from exporter.config import HostConfig
from exporter.snapshot.host import HostReading
from exporter.sources.cgroup import cgroup_path_of, cgroup_version, read_cgroup_cpu
from exporter.sources.pseudofiles import KeptFiles


def parse_proc_stat(text: str) -> tuple[int, int, int]:
    """Return (busy jiffies, total jiffies, CPUs) from /proc/stat."""
    busy = total = cpus = 0
    for line in text.splitlines():
        if line.startswith("cpu "):
            fields = [int(v) for v in line.split()[1:]]
            idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
            total = sum(fields[:8])  # guest time is already inside user/nice
            busy = total - idle
        elif line.startswith("cpu") and line[3:4].isdigit():
            cpus += 1
    return busy, total, cpus


# boundwatch's own cgroup path and the hierarchy's version are read again this often (a daemon
# moved to another cgroup is seen within this time); its cgroup's counters every tick.
OWN_CGROUP_EVERY_SECONDS = 5.0


class HostSource:
    """Read host CPU and boundwatch's own cgroup each tick."""

    name = "host"

    def __init__(self, cfg: HostConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self._cfg = cfg
        self._clock = clock
        self._files = KeptFiles()  # /proc/stat and the cgroup's counters, kept open (read on the loop)
        self._prev: tuple[int, int] | None = None
        self._own: tuple[float, str, int] | None = None  # (read at, own cgroup path, cgroup version)

    async def read(self) -> HostReading:
        """Return this tick's host reading."""
        return self.read_blocking()

    def start_read(self) -> asyncio.Future[HostReading]:
        """Read the host now and return the outcome as a future already done (the Sampler's way: no task)."""
        future: asyncio.Future[HostReading] = asyncio.get_running_loop().create_future()
        try:
            future.set_result(self.read_blocking())
        except Exception as exc:  # failed as a read's task would: the tick reports the source down
            future.set_exception(exc)
        return future

    def read_blocking(self) -> HostReading:
        """Read the host now, in the calling thread (procfs and cgroupfs: no read here waits)."""
        text = self._files.read(os.path.join(self._cfg.proc_root, "stat")).decode(errors="replace")
        busy, total, cpus = parse_proc_stat(text)
        ratio = None
        if self._prev is not None and total > self._prev[1]:
            ratio = (busy - self._prev[0]) / (total - self._prev[1])
            ratio = min(max(ratio, 0.0), 1.0)
        self._prev = (busy, total)
        now = self._clock()
        if self._own is None or now - self._own[0] >= OWN_CGROUP_EVERY_SECONDS:
            path = cgroup_path_of(self._cfg.proc_root, "self")
            self._own = (now, path, cgroup_version(self._cfg.cgroup_root))
        _, path, version = self._own
        own = read_cgroup_cpu(self._cfg.cgroup_root, path, version=version, now=now, files=self._files)
        self._files.sweep()
        return HostReading(cpus=cpus or (os.cpu_count() or 1), cpu_busy=ratio, own_cgroup=own)

    def close(self) -> None:
        """Close the files the reads keep open."""
        self._files.close()
