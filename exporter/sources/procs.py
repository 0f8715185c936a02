"""The process table, read from /proc: find processes, their environment, and their CPU per tick.

Everything takes a `proc_root` so tests read real fixture trees. CPU comes from
`/proc/<pid>/stat` and `/proc/<pid>/task/<tid>/stat` (utime + stime, clock ticks): the delta
between two samples over the wall time between them, in cores (1.0 = one core busy all tick).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from exporter.snapshot.engine import ThreadLoad
from exporter.snapshot.host import ProcessCpu

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class ProcInfo:
    """One process as the table shows it."""

    pid: int
    ppid: int
    comm: str
    cmdline: tuple[str, ...]
    start_ticks: int  # start time since boot, clock ticks: tells a reused pid apart

    @property
    def title(self) -> str:
        """Return the process title: the first cmdline word (setproctitle rewrites it), else comm."""
        return self.cmdline[0] if self.cmdline else self.comm


@dataclass(frozen=True)
class Stat:
    """The fields of a /proc stat line that boundwatch needs."""

    comm: str
    ppid: int
    cpu_ticks: int  # utime + stime
    start_ticks: int


def parse_stat(text: str) -> Stat | None:
    """Parse /proc/<pid>/stat (the comm field may hold spaces and parentheses)."""
    open_, close = text.find("("), text.rfind(")")
    if open_ < 0 or close < open_:
        return None
    fields = text[close + 2 :].split()
    try:
        # fields[0] is state (field 3); utime, stime are fields 14, 15; starttime is 22.
        return Stat(
            comm=text[open_ + 1 : close],
            ppid=int(fields[1]),
            cpu_ticks=int(fields[11]) + int(fields[12]),
            start_ticks=int(fields[19]),
        )
    except (IndexError, ValueError):
        return None


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def read_stat(proc_root: str, pid: int, tid: int | None = None) -> Stat | None:
    """Return the stat of a process, or of one of its threads; None when it is gone."""
    path = (
        Path(proc_root, str(pid), "stat")
        if tid is None
        else Path(proc_root, str(pid), "task", str(tid), "stat")
    )
    text = _read_text(path)
    return parse_stat(text) if text else None


def read_cmdline(proc_root: str, pid: int) -> tuple[str, ...]:
    """Return the command line of a process as words ((): kernel thread, gone, or no permission).

    A process that set its title (setproctitle) has the title in the first word, padded with
    NULs or spaces; the padding is dropped.
    """
    try:
        raw = Path(proc_root, str(pid), "cmdline").read_bytes()
    except OSError:
        return ()
    words = [w.decode(errors="replace") for w in raw.split(b"\0")]
    while words and not words[-1].strip():
        words.pop()
    return tuple(w.rstrip() if i == 0 else w for i, w in enumerate(words))


def read_environ(proc_root: str, pid: int) -> dict[str, str]:
    """Return the environment a process was started with ({} without permission).

    /proc shows the environment at exec time: a variable the process set later is only seen in
    the children it spawned afterwards.
    """
    try:
        raw = Path(proc_root, str(pid), "environ").read_bytes()
    except OSError:
        return {}
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def pids(proc_root: str) -> list[int]:
    """Return the pids in the table."""
    try:
        names = os.listdir(proc_root)
    except OSError:
        return []
    return sorted(int(n) for n in names if n.isdigit())


def proc_info(proc_root: str, pid: int) -> ProcInfo | None:
    """Return one process, or None when it is gone."""
    stat = read_stat(proc_root, pid)
    if stat is None:
        return None
    return ProcInfo(pid, stat.ppid, stat.comm, read_cmdline(proc_root, pid), stat.start_ticks)


def processes(proc_root: str) -> Iterator[ProcInfo]:
    """Yield every process in the table."""
    for pid in pids(proc_root):
        info = proc_info(proc_root, pid)
        if info is not None:
            yield info


def find(proc_root: str, match: Callable[[ProcInfo], bool]) -> list[ProcInfo]:
    """Return the processes a predicate accepts."""
    return [p for p in processes(proc_root) if match(p)]


def matches(
    info: ProcInfo, *, title_prefix: str = "", comm: str = "", cmdline_has: Iterable[str] = ()
) -> bool:
    """Say whether a process has a title prefix, a comm, or all the given command-line words."""
    if title_prefix and (info.title.startswith(title_prefix) or info.comm.startswith(title_prefix[:15])):
        return True
    if comm and info.comm == comm[:15]:
        return True
    want = tuple(cmdline_has)
    return bool(want) and all(any(w == a or a.endswith("/" + w) for a in info.cmdline) for w in want)


def children(table: Iterable[ProcInfo], pid: int) -> list[ProcInfo]:
    """Return the direct children of a process in a table snapshot."""
    return [p for p in table if p.ppid == pid]


def descendants(table: Iterable[ProcInfo], pid: int) -> list[ProcInfo]:
    """Return all descendants of a process in a table snapshot."""
    rows = list(table)
    by_parent: dict[int, list[ProcInfo]] = {}
    for p in rows:
        by_parent.setdefault(p.ppid, []).append(p)
    out: list[ProcInfo] = []
    todo = [pid]
    while todo:
        for child in by_parent.get(todo.pop(), []):
            out.append(child)
            todo.append(child.pid)
    return out


def read_schedstat(proc_root: str, pid: int, tid: int) -> int | None:
    """Return a thread's time on CPU plus time waiting on a run queue, ns (None without schedstat)."""
    text = _read_text(Path(proc_root, str(pid), "task", str(tid), "schedstat"))
    if not text:
        return None
    fields = text.split()
    try:
        return int(fields[0]) + int(fields[1])
    except (IndexError, ValueError):
        return None


def cgroup_of(proc_root: str, pid: int) -> str:
    """Return the CPU cgroup a process runs in ("/" when it cannot be told)."""
    from exporter.sources.cgroup import cgroup_path_of

    return cgroup_path_of(proc_root, pid)


def _listening(proc_root: str, pid: int) -> dict[int, int]:
    """Return every listening TCP socket in the network namespace of a process, inode -> port."""
    by_inode: dict[int, int] = {}
    for name in ("tcp", "tcp6"):
        text = _read_text(Path(proc_root, str(pid), "net", name))
        for line in (text or "").splitlines()[1:]:
            fields = line.split()
            if len(fields) < 10 or fields[3] != "0A":  # 0A: LISTEN
                continue
            try:
                by_inode[int(fields[9])] = int(fields[1].rsplit(":", 1)[1], 16)
            except (IndexError, ValueError):
                continue
    return by_inode


def listening_inodes(proc_root: str, pid: int, port: int) -> set[int]:
    """Return the socket inodes listening on a TCP port, in the network namespace of a process."""
    return {inode for inode, p in _listening(proc_root, pid).items() if p == port}


def listening_sockets(proc_root: str, pid: int) -> dict[int, int]:
    """Return the listening TCP sockets a process holds, inode -> port (in its own network namespace)."""
    by_inode = _listening(proc_root, pid)
    if not by_inode:
        return {}
    return {i: by_inode[i] for i in socket_inodes(proc_root, pid) if i in by_inode}


def listening_ports(proc_root: str, pid: int) -> set[int]:
    """Return the TCP ports a process holds a listening socket on."""
    return set(listening_sockets(proc_root, pid).values())


def net_namespace(proc_root: str, pid: int | str) -> str | None:
    """Return the network namespace a process is in ("net:[4026531840]"), None when it cannot be told."""
    try:
        return os.readlink(Path(proc_root, str(pid), "ns", "net"))
    except OSError:
        return None


def socket_inodes(proc_root: str, pid: int) -> set[int]:
    """Return the inodes of the sockets a process holds open (empty without permission)."""
    fd_dir = Path(proc_root, str(pid), "fd")
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return set()
    out: set[int] = set()
    for fd in fds:
        try:
            target = os.readlink(fd_dir / fd)
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1].isdigit():
            out.add(int(target[8:-1]))
    return out


def thread_ids(proc_root: str, pid: int) -> list[int]:
    """Return the thread ids of a process."""
    try:
        return sorted(int(t) for t in os.listdir(Path(proc_root, str(pid), "task")) if t.isdigit())
    except OSError:
        return []


class CpuTracker:
    """Measure CPU of chosen processes and their threads between calls of `sample()`.

    The first sample of a process only sets its baseline, so a process is reported from its
    second sample on; a reused pid (a new start time) starts a new baseline. Call `sample()` once
    per tick with every process to watch: processes not in a call are forgotten.
    """

    def __init__(self, proc_root: str = "/proc", clock: Callable[[], float] = time.monotonic) -> None:
        self.proc_root = proc_root
        self._clock = clock
        # pid -> (time, start ticks, cpu ticks, tid -> (cpu ticks, run+wait ns))
        self._last: dict[int, tuple[float, int, int, dict[int, tuple[int, int | None]]]] = {}

    def sample(self, procs: Iterable[ProcInfo]) -> dict[int, ProcessCpu]:
        """Return the CPU each process used since its previous sample (absent on its first)."""
        out: dict[int, ProcessCpu] = {}
        seen: set[int] = set()
        for info in procs:
            seen.add(info.pid)
            now = self._clock()
            stat = read_stat(self.proc_root, info.pid)
            if stat is None:
                continue
            threads: dict[int, tuple[int, int | None]] = {}
            names: dict[int, str] = {}
            for tid in thread_ids(self.proc_root, info.pid):
                tstat = read_stat(self.proc_root, info.pid, tid)
                if tstat is not None:
                    threads[tid] = (tstat.cpu_ticks, read_schedstat(self.proc_root, info.pid, tid))
                    names[tid] = tstat.comm
            prev = self._last.get(info.pid)
            self._last[info.pid] = (now, stat.start_ticks, stat.cpu_ticks, threads)
            if prev is None or prev[1] != stat.start_ticks or now <= prev[0]:
                continue
            wall = now - prev[0]
            per_thread = tuple(
                ThreadLoad(
                    tid,
                    names[tid],
                    min(1.0, max(0, ticks - prev[3][tid][0]) / CLK_TCK / wall),  # a thread: one core at most
                    _share(sched, prev[3][tid][1], wall),
                )
                for tid, (ticks, sched) in threads.items()
                if tid in prev[3]
            )
            busiest = max(per_thread, key=lambda t: t.cpu, default=None)
            out[info.pid] = ProcessCpu(
                pid=info.pid,
                name=info.title,
                cmdline=info.cmdline,
                cpu=max(0, stat.cpu_ticks - prev[2]) / CLK_TCK / wall,
                busiest_thread=busiest,
                threads=per_thread,
            )
        for gone in set(self._last) - seen:
            del self._last[gone]
        return out


def _share(now_ns: int | None, before_ns: int | None, wall: float) -> float | None:
    if now_ns is None or before_ns is None:
        return None
    return min(1.0, max(0, now_ns - before_ns) / 1e9 / wall)  # clock-tick jitter can read a hair over 1
