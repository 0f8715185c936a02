"""The process table, read from /proc: find processes, their environment, and their CPU per tick.

Everything takes a `proc_root` so tests read real fixture trees. CPU comes from
`/proc/<pid>/stat` and `/proc/<pid>/task/<tid>/stat` (utime + stime, clock ticks): the delta
between two samples over the wall time between them, in cores (1.0 = one core busy all tick).
"""

from __future__ import annotations

import ipaddress
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from exporter.snapshot.engine import ThreadLoad
from exporter.snapshot.host import ProcessCpu
from exporter.sources.pseudofiles import KeptFiles, read_head, read_path

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class ProcInfo:
    """One process as the table shows it."""

    pid: int
    ppid: int
    comm: str
    cmdline: tuple[str, ...]
    start_ticks: int  # start time since boot, clock ticks: tells a reused pid apart
    cmdline_cut: bool = False  # the command line was longer than what was read (MAX_CMDLINE_*)

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


def _read_text(path: Path | str, files: KeptFiles | None = None) -> str | None:
    if files is not None:  # a pseudo-file kept open: one pread
        try:
            return files.read(str(path)).decode(errors="replace")
        except OSError:
            return None
    try:
        return read_path(str(path)).decode(errors="replace")
    except OSError:
        return None


def read_stat(
    proc_root: str, pid: int, tid: int | None = None, files: KeptFiles | None = None
) -> Stat | None:
    """Return the stat of a process, or of one of its threads; None when it is gone."""
    path = f"{proc_root}/{pid}/stat" if tid is None else f"{proc_root}/{pid}/task/{tid}/stat"
    text = _read_text(path, files)
    return parse_stat(text) if text else None


# Of a command line, read (the kernel allows 2 MiB; an engine's flags fit many times over) and kept
# in words (64 KiB of 1-character words would be 32,768 objects a process, for every process).
MAX_CMDLINE_BYTES = 64 * 1024
MAX_CMDLINE_WORDS = 1024
MAX_ENVIRON_BYTES = 256 * 1024  # of an environment read at exec (an engine's, to find its GPUs and files)


def read_cmdline(proc_root: str, pid: int) -> tuple[str, ...]:
    """Return the command line of a process as words ((): kernel thread, gone, or no permission)."""
    return cmdline_of(proc_root, pid)[0]


def cmdline_of(proc_root: str, pid: int) -> tuple[tuple[str, ...], bool]:
    """Return the command line of a process as words, and whether it was cut at its bounds.

    A process that set its title (setproctitle) has the title in the first word, padded with
    NULs or spaces; the padding is dropped. At most MAX_CMDLINE_BYTES and MAX_CMDLINE_WORDS are
    kept: the table keeps every process's words, and any user may start processes with the
    largest command lines. One byte more is read, to tell a line that fills the bound from one
    cut at it; a word the byte bound cuts short is not kept.
    """
    try:
        raw = read_head(f"{proc_root}/{pid}/cmdline", MAX_CMDLINE_BYTES + 1)
    except OSError:
        return (), False
    cut = len(raw) > MAX_CMDLINE_BYTES
    parts = raw[:MAX_CMDLINE_BYTES].split(b"\0", MAX_CMDLINE_WORDS)
    if len(parts) > MAX_CMDLINE_WORDS:  # the rest past the last word kept: padding, or words cut
        cut = bool(parts.pop().strip(b"\0 ")) or cut
    elif cut:  # the bytes ran out inside a word: a word cut short is not kept (`-n 25` of `-n 256`)
        parts.pop()
    words = [w.decode(errors="replace") for w in parts]
    while words and not words[-1].strip():
        words.pop()
    return tuple(w.rstrip() if i == 0 else w for i, w in enumerate(words)), cut


def read_environ(proc_root: str, pid: int) -> dict[str, str]:
    """Return the environment a process was started with ({} without permission)."""
    return environ_of(proc_root, pid)[0]


def environ_of(proc_root: str, pid: int) -> tuple[dict[str, str], bool]:
    """Return the environment a process was started with, and whether it was cut at its bound.

    /proc shows the environment at exec time: a variable the process set later is only seen in
    the children it spawned afterwards. At most MAX_ENVIRON_BYTES are read: a variable past them,
    or cut by them, is not seen, and the environment is reported cut; {} without permission.
    """
    try:
        raw = read_head(f"{proc_root}/{pid}/environ", MAX_ENVIRON_BYTES + 1)
    except OSError:
        return {}, False
    cut = len(raw) > MAX_ENVIRON_BYTES
    items = raw[:MAX_ENVIRON_BYTES].split(b"\0")
    if cut:  # the last variable read may be cut short: not kept (a value cut is a wrong value)
        items.pop()
    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env, cut


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
    words, cut = cmdline_of(proc_root, pid)
    return ProcInfo(pid, stat.ppid, stat.comm, words, stat.start_ticks, cut)


def processes(proc_root: str) -> Iterator[ProcInfo]:
    """Yield every process in the table."""
    for pid in pids(proc_root):
        info = proc_info(proc_root, pid)
        if info is not None:
            yield info


def uptime_seconds(proc_root: str) -> float | None:
    """Return the seconds since boot (/proc/uptime), None when it cannot be read."""
    text = _read_text(f"{proc_root}/uptime")
    try:
        return float(text.split()[0]) if text else None
    except (IndexError, ValueError):
        return None


class ProcessTable:
    """The process table, kept by change: a process is read when it appears, not at every look.

    `refresh()` lists the pids (one directory read) and reads only the processes that are new,
    whose parent is gone (re-parented), or that are young (started less than `young_seconds`
    ago: a process sets its title after start); the whole table is read again every
    `full_every` seconds. It says whether any row changed, so the work built on the table
    is redone only then.
    """

    def __init__(
        self,
        proc_root: str = "/proc",
        young_seconds: float = 60.0,
        full_every: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.proc_root = proc_root
        self.rows: dict[int, ProcInfo] = {}
        self._young = young_seconds
        self._full_every = full_every
        self._clock = clock
        self._full_at: float | None = None
        self.reads = 0  # processes read, for tests and the bench

    def _read(self, pid: int) -> ProcInfo | None:
        self.reads += 1
        return proc_info(self.proc_root, pid)

    def refresh(self) -> bool:
        """Bring the table up to date; return whether any process appeared, went or changed."""
        now = self._clock()
        listed = set(pids(self.proc_root))
        old = self.rows
        full = self._full_at is None or now - self._full_at >= self._full_every
        if full:
            self._full_at = now
        gone = old.keys() - listed
        up = uptime_seconds(self.proc_root)
        rows: dict[int, ProcInfo] = {}
        for pid in sorted(listed):
            info = old.get(pid)
            if (
                full
                or info is None
                or info.ppid in gone
                or up is None
                or up - info.start_ticks / CLK_TCK < self._young
            ):
                info = self._read(pid)
            if info is not None:
                rows[pid] = info
        self.rows = rows
        return rows != old


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
    times = _schedstat(f"{proc_root}/{pid}/task/{tid}/schedstat")
    return None if times is None else times[0] + times[1]


def _schedstat(path: str, files: KeptFiles | None = None) -> tuple[int, int] | None:
    """Return (ns on CPU, ns waiting on a run queue) from a schedstat file, None without one."""
    text = _read_text(path, files)
    if not text:
        return None
    fields = text.split()
    try:
        return int(fields[0]), int(fields[1])
    except (IndexError, ValueError):
        return None


def cgroup_of(proc_root: str, pid: int) -> str:
    """Return the CPU cgroup a process runs in ("/" when it cannot be told)."""
    from exporter.sources.cgroup import cgroup_path_of

    return cgroup_path_of(proc_root, pid)


def _address(hex_addr: str) -> str:
    """Return the address of a /proc/net/tcp{,6} `local_address` field's hex address part, as text.

    The kernel prints each 32-bit word of the address in host byte order (little-endian here).
    """
    raw = bytes.fromhex(hex_addr)
    if len(raw) not in (4, 16):
        raise ValueError(hex_addr)
    flipped = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(flipped))


def _listening(proc_root: str, pid: int) -> dict[int, tuple[str, int]]:
    """Return every listening TCP socket in the network namespace of a process, inode -> (address, port)."""
    by_inode: dict[int, tuple[str, int]] = {}
    for name in ("tcp", "tcp6"):
        text = _read_text(Path(proc_root, str(pid), "net", name))
        for line in (text or "").splitlines()[1:]:
            fields = line.split()
            if len(fields) < 10 or fields[3] != "0A":  # 0A: LISTEN
                continue
            try:
                addr, port = fields[1].rsplit(":", 1)
                by_inode[int(fields[9])] = (_address(addr), int(port, 16))
            except ValueError:
                continue
    return by_inode


class TcpTables:
    """The listening TCP sockets of each network namespace, each read once while this is kept.

    Reading /proc/<pid>/net/tcp walks the kernel's whole socket hash, whatever the sockets in it:
    about 8 ms of CPU on the 2-core VM with 10 connections, 32 ms with 5,000. One discovery pass
    asks it for every API server of an engine started without `--port`, all in one namespace, so
    a pass keeps one of these and reads each namespace's table once. A process whose namespace
    cannot be told (no permission) has its own table read, as without one.
    """

    def __init__(self, proc_root: str) -> None:
        self.proc_root = proc_root
        self._by_ns: dict[str, dict[int, tuple[str, int]]] = {}
        self.reads = 0  # tables read (for tests and benches)

    def listening(self, pid: int) -> dict[int, tuple[str, int]]:
        """Return every listening TCP socket in the network namespace of a process, inode -> (address, port)."""
        ns = net_namespace(self.proc_root, pid)
        got = self._by_ns.get(ns) if ns is not None else None
        if got is None:
            self.reads += 1
            got = _listening(self.proc_root, pid)
            if ns is not None:
                self._by_ns[ns] = got
        return got


def _listening_of(proc_root: str, pid: int, tables: TcpTables | None) -> dict[int, tuple[str, int]]:
    return tables.listening(pid) if tables is not None else _listening(proc_root, pid)


def listening_inodes(proc_root: str, pid: int, port: int, tables: TcpTables | None = None) -> set[int]:
    """Return the socket inodes listening on a TCP port, in the network namespace of a process."""
    return {inode for inode, (_, p) in _listening_of(proc_root, pid, tables).items() if p == port}


def listening_sockets(
    proc_root: str, pid: int, tables: TcpTables | None = None
) -> dict[int, tuple[str, int]]:
    """Return the listening TCP sockets a process holds, inode -> (address, port), in its network namespace."""
    by_inode = _listening_of(proc_root, pid, tables)
    if not by_inode:
        return {}
    return {i: by_inode[i] for i in socket_inodes(proc_root, pid) if i in by_inode}


def listening_ports(proc_root: str, pid: int, tables: TcpTables | None = None) -> set[int]:
    """Return the TCP ports a process holds a listening socket on."""
    return {port for _, port in listening_sockets(proc_root, pid, tables).values()}


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
        return sorted(int(t) for t in os.listdir(f"{proc_root}/{pid}/task") if t.isdigit())
    except OSError:
        return []


FULL_READ_SECONDS = 30.0  # every thread's stat is read at least this often (names, a missed change)
HOT_LIST_SECONDS = 5.0  # the engine source's trackers read every thread this often, the hot ones each tick
HOT_THREADS = 2  # the busiest threads (by demand) read every tick between listings
HOT_FLOOR = 0.1  # and any other thread that wanted at least this many cores (at most MAX_HOT in all)
MAX_HOT = 4
# Clock ticks a process's utime + stime may differ from the sum of its threads' without any other
# thread running: the kernel scales and truncates each figure on its own.
RESIDUAL_SLACK_TICKS = 3


@dataclass
class _Thread:
    ticks: int  # utime + stime, clock ticks
    sched: int | None  # ns on CPU + ns waiting to run (schedstat), None without schedstat
    run: int | None  # ns on CPU (schedstat)
    name: str
    at: float = 0.0  # when these figures were read


@dataclass
class _Tracked:
    at: float
    start_ticks: int
    ticks: int
    threads: dict[int, _Thread]
    full_at: float
    hot: tuple[int, ...] | None = None  # the threads read each tick until the next listing (None: all)
    listed_at: float = 0.0


class CpuTracker:
    """Measure CPU of chosen processes and their threads between calls of `sample()`.

    The first sample of a process only sets its baseline, so a process is reported from its
    second sample on; a reused pid (a new start time) starts a new baseline. Call `sample()` once
    per tick with every process to watch: processes not in a call are forgotten.

    Each tick reads every thread's schedstat (a few bytes, cheap for the kernel to write) and a
    thread's stat (costly) only when its time on CPU moved: a thread that did not run has the same
    utime + stime, since the kernel derives both from that time. So the figures are those of
    reading every stat each tick; each thread's stat is still read every FULL_READ_SECONDS (a
    thread renamed while idle) and every tick where schedstat is missing.

    With `hot_every` > 0 only the hot threads are read each tick (the HOT_THREADS that wanted the
    most, and any over HOT_FLOOR), every thread every `hot_every` seconds (a listing), and at once
    whenever the other threads together used as much CPU this tick as the busiest hot one (the
    process's own utime + stime, read every tick, less the hot threads'), so no other thread can
    have been the busiest unseen: the busiest thread's CPU is that of reading every thread. A
    thread outside the hot set that waits to run without running is seen at the next listing.
    A thread last read before the previous tick is reported at a listing by what it can have used
    this tick (its CPU since its last read, at most the other threads' CPU this tick), without
    run-queue wait; from the next tick on exactly.

    With `files` the stat and schedstat files are read through it (kept open, one pread each); its
    owner sweeps it once per tick, so the files of processes and threads no longer read are closed.
    A kernel that keeps no schedstat files (seen once through a kept stat) has them not looked for
    again: each thread's stat is read each tick there, as it was when its schedstat was missing.
    """

    def __init__(
        self,
        proc_root: str = "/proc",
        clock: Callable[[], float] = time.monotonic,
        full_every: float = FULL_READ_SECONDS,
        hot_every: float = 0.0,
        files: KeptFiles | None = None,
    ) -> None:
        self.proc_root = proc_root
        self._files = files  # the stat and schedstat files read each tick, kept open (pseudofiles.py)
        self._clock = clock
        self._full_every = full_every
        self._hot_every = hot_every
        self._last: dict[int, _Tracked] = {}
        self.stat_reads = 0  # thread stat files read, for tests and the bench
        self.schedstat_reads = 0  # thread schedstat files read, for tests and the bench
        self.listings = 0  # reads of every thread of a process, for tests and the bench
        self.no_schedstat = False  # this /proc has no schedstat files (the kernel keeps none): not looked for

    def _threads(
        self, pid: int, tids: Iterable[int], before: dict[int, _Thread], full: bool, now: float
    ) -> dict[int, _Thread]:
        """Return the given threads' times now, reading a stat only when schedstat says it ran."""
        root, files = self.proc_root, self._files
        out: dict[int, _Thread] = {}
        for tid in tids:
            times = None
            if not self.no_schedstat:
                self.schedstat_reads += 1
                times = _schedstat(f"{root}/{pid}/task/{tid}/schedstat", files)
            old = before.get(tid)
            if not full and times is not None and old is not None and old.run == times[0]:
                out[tid] = _Thread(old.ticks, times[0] + times[1], times[0], old.name, now)
                continue
            self.stat_reads += 1
            tstat = read_stat(root, pid, tid, files)
            if tstat is None:
                continue
            if times is None and not self.no_schedstat and files is not None:
                self.no_schedstat = _schedstat_absent(files, f"{root}/{pid}/task/{tid}")
            run, sched = (None, None) if times is None else (times[0], times[0] + times[1])
            out[tid] = _Thread(tstat.cpu_ticks, sched, run, tstat.comm, now)
        return out

    def _read(
        self, pid: int, prev: _Tracked | None, ticks: int, full: bool, now: float
    ) -> tuple[dict[int, _Thread], bool, int]:
        """Return this tick's thread figures, whether every thread was read, and the others' CPU, ticks.

        The others' CPU is the process's utime + stime this tick less that of the threads read
        whose last figures are a tick old (a bound on what any other thread used this tick).
        """
        before = prev.threads if prev is not None else {}
        listing = (
            self._hot_every <= 0
            or prev is None
            or prev.hot is None
            or now - prev.listed_at >= self._hot_every
        )
        if not listing and prev is not None and prev.hot is not None:
            got = self._threads(pid, prev.hot, before, full, now)
            moved = [got[t].ticks - before[t].ticks for t in got if t in before]
            others = ticks - prev.ticks - sum(moved)
            if len(got) == len(prev.hot) and others < max(max(moved, default=0), RESIDUAL_SLACK_TICKS):
                return {**before, **got}, False, others
        self.listings += 1
        got = self._threads(pid, thread_ids(self.proc_root, pid), before, full, now)
        fresh = prev.at if prev is not None else None
        moved = [
            t.ticks - before[tid].ticks for tid, t in got.items() if tid in before and before[tid].at == fresh
        ]
        return got, True, ticks - (prev.ticks if prev is not None else ticks) - sum(moved)

    def sample(self, procs: Iterable[ProcInfo]) -> dict[int, ProcessCpu]:
        """Return the CPU each process used since its previous sample (absent on its first)."""
        out: dict[int, ProcessCpu] = {}
        seen: set[int] = set()
        for info in procs:
            seen.add(info.pid)
            now = self._clock()
            stat = read_stat(self.proc_root, info.pid, files=self._files)
            if stat is None:
                continue
            if stat.start_ticks != info.start_ticks:  # the pid is another process's now
                info = proc_info(self.proc_root, info.pid) or info
            prev = self._last.get(info.pid)
            if prev is not None and prev.start_ticks != stat.start_ticks:
                prev = None  # a reused pid: a new baseline
            full = prev is None or now - prev.full_at >= self._full_every
            threads, listed, others = self._read(info.pid, prev, stat.cpu_ticks, full, now)
            full_at = now if full or prev is None else prev.full_at
            tracked = _Tracked(now, stat.start_ticks, stat.cpu_ticks, threads, full_at)
            if prev is not None and not listed:
                tracked.hot, tracked.listed_at = prev.hot, prev.listed_at
            elif prev is not None and self._hot_every > 0:
                tracked.hot, tracked.listed_at = _hottest(threads, prev.threads, now), now
            self._last[info.pid] = tracked
            if prev is None or now <= prev.at:
                continue
            wall = now - prev.at
            per_thread = tuple(
                _load(tid, t, prev.threads[tid], prev.at, wall, others)
                for tid, t in threads.items()
                if t.at == now and tid in prev.threads
            )
            busiest = max(per_thread, key=lambda t: t.cpu, default=None)
            out[info.pid] = ProcessCpu(
                pid=info.pid,
                name=info.title,
                cmdline=info.cmdline,
                cpu=max(0, stat.cpu_ticks - prev.ticks) / CLK_TCK / wall,
                busiest_thread=busiest,
                threads=per_thread,
            )
        for gone in set(self._last) - seen:
            del self._last[gone]
        return out


def _schedstat_absent(files: KeptFiles, task: str) -> bool:
    """Say whether a kernel /proc has no schedstat: a thread's stat is a kept pseudo-file, its schedstat missing.

    Whether /proc has schedstat files is the kernel's build (CONFIG_SCHED_INFO), the same for every
    thread; a fixture tree of plain files is never kept, so it is looked for there every time.
    """
    return files.kept(f"{task}/stat") and not os.path.exists(f"{task}/schedstat")


def _load(tid: int, t: _Thread, old: _Thread, prev_at: float, wall: float, others: int) -> ThreadLoad:
    """Return a thread's load this tick; one last read before the previous tick by what it can have used."""
    ticks = max(0, t.ticks - old.ticks)
    if old.at == prev_at:
        return ThreadLoad(tid, t.name, min(1.0, ticks / CLK_TCK / wall), _share(t.sched, old.sched, wall))
    return ThreadLoad(tid, t.name, min(1.0, min(ticks, max(0, others)) / CLK_TCK / wall), None)


def _hottest(now: dict[int, _Thread], before: dict[int, _Thread], at: float) -> tuple[int, ...]:
    """Return the threads to read each tick: those that wanted the most since their last read."""
    wanted: list[tuple[float, int]] = []
    for tid, t in now.items():
        old = before.get(tid)
        if old is None or at <= old.at:
            wanted.append((0.0, tid))  # new since the last listing: outside the hot set, like an idle one
            continue
        span = at - old.at
        cpu = max(0, t.ticks - old.ticks) / CLK_TCK / span
        wait = _share(t.sched, old.sched, span)
        wanted.append((max(cpu, wait) if wait is not None else cpu, tid))
    wanted.sort(reverse=True)
    hot = [tid for k, (share, tid) in enumerate(wanted) if k < HOT_THREADS or share >= HOT_FLOOR]
    return tuple(sorted(hot[:MAX_HOT]))


def _share(now_ns: int | None, before_ns: int | None, wall: float) -> float | None:
    if now_ns is None or before_ns is None:
        return None
    return min(1.0, max(0, now_ns - before_ns) / 1e9 / wall)  # clock-tick jitter can read a hair over 1
