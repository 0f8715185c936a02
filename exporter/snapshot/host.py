"""What the host and its cgroups say at one tick."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class CgroupCpu:
    """CPU limits and use of one cgroup (v2 `cpu.max` / `cpu.stat`, or v1 cfs files)."""

    path: str
    quota_cores: float | None  # None = no quota
    usage_seconds: float | None = None
    throttled_seconds: float | None = None
    throttled_periods: int | None = None
    periods: int | None = None
    version: int = 2
    # where the throttling counters (periods, throttled periods and time) were read: '' this cgroup's
    # own cpu.stat, else the ancestor whose quota binds it (the kernel counts them there); readings
    # counted at different cgroups are not compared
    counted_at: str = ""


@dataclass(frozen=True)
class ThreadCpu:
    """CPU one thread used over the last tick, in cores (1.0 = one core busy all tick)."""

    tid: int
    name: str
    cpu: float


@dataclass(frozen=True)
class ProcessCpu:
    """CPU of one watched process over the last tick."""

    pid: int
    name: str
    cmdline: tuple[str, ...]
    cpu: float  # cores, all threads
    busiest_thread: ThreadCpu | None
    cgroup: str = ""
    threads: tuple[ThreadCpu, ...] = field(default=())


@dataclass(frozen=True)
class HostReading:
    """The host at one tick."""

    cpus: int
    cpu_busy: float | None  # 0-1 of all CPUs over the last tick; None on the first tick
    own_cgroup: CgroupCpu | None = None
