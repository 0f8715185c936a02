"""Receive the in-process agents' windows on a unix datagram socket and hand them out per GPU, raw.

Any number of agents send to one socket (`cfg.agent.socket`, 0660 in a directory only the daemon
writes: see exporter.sources.unixsock). Each datagram's sender is checked against an allow-list
(root, the daemon's user, `agent.allowed_uids`, members of `agent.allowed_groups` or of the
socket's group), then validated (exporter.wire) and bounded here: agents in number, devices and
engines per agent, GPUs and engine names (each one a set of series kept for good), and physical
limits (a window far longer than an agent's tick, an end far from the receive time, a window that
overlaps the agent's previous one, idle gaps or steps at an impossible rate). What is refused is
counted by reason (`boundwatch_agent_refused_total`); nothing an agent sends can poison a counter.

Windows are aligned to absolute time in every agent, so the windows of several processes sharing
one GPU line up: a window is handed out once every running agent on that GPU has sent it, or
`merge_wait_s` after the first copy arrived, raw, one copy per process (`AgentReading.windows`);
exporter.analysis.agent_union merges them (two processes' kernels that overlap count once).
GPUs are keyed by the UUID the agent reports (the CUDA ordinal only when it reports none) and get
a stable index, so two processes that each call their GPU ordinal 0 stay two GPUs without NVML.

A thread of its own (`bw-agent_0`, I/O only) puts each datagram in an inbox, with its arrival time
and sender; the event loop decodes and takes them together at the next `collect()`. One agent per
GPU process sends each tick, on its own clock: read on the event loop, each datagram woke the loop
and ran its Python cold (bench/sidecar_cost.py, sessions 19 and 20). How the thread waits depends
on how much the kernel queues for the socket (`net.unix.max_dgram_qlen` + 1 datagrams, read at
bind; Linux's default is 10, systemd sets 512 on most hosts), past which agents drop:
- blocking (at start, and while a second's arrivals exceed half the queue): the thread waits in
  `recvmsg` and wakes for each datagram, so a shallow queue never fills;
- paced (once PACED_AFTER seconds' arrivals each fit in half the queue): the kernel holds them and
  the tick's read drains the socket on the event loop just before `collect()`, so no thread wakes
  per datagram (at 64 GPUs, 65 wake-ups a tick, ~50-77 us each: session 20); the thread wakes only
  to drain when no read came for PACE_BACKSTOP_S (the loop held up). A second whose arrivals pass
  half the queue puts the thread back to blocking at once.
The inbox is bounded (INBOX_MAX datagrams, INBOX_MAX_BYTES): past it the reader asks the loop to
open it at once, and while the loop does not come (INBOX_HOLD times the bounds) it drops what comes
and counts it (refused, "inbox"). The reader's counts are written under `_drain_lock` (by the thread,
or by the loop's drain while paced) and the loop's own only by the loop; the inbox is a deque (both
ends atomic).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import structlog

from exporter import wire
from exporter.config import AgentFeedConfig
from exporter.snapshot.agent import AgentReading, AgentState, AgentWindow, EngineSteps, GpuWindows, GraphUse
from exporter.sources import procs, unixsock
from exporter.sources.base import SourceUnavailable, name_os_thread

log = structlog.get_logger("boundwatch.agent")

MAX_PENDING_WINDOWS = 1024  # windows waiting for the other processes on their GPU
MAX_PENDING_PER_AGENT = 64
FORGET_AFTER_STALE = 12  # forget an agent after this many stale periods
MAX_AGENTS = 128  # agent processes remembered at once
MAX_DEVICES_PER_AGENT = 16
MAX_GPUS = 64  # GPU keys (UUIDs) with a stable index; label values stay in [0, MAX_GPUS)
MAX_ENGINES = 32  # engine names over the daemon's life: each is a set of series kept for good
MAX_ENGINES_PER_AGENT = 4
MAX_WINDOW_NS = 30_000_000_000  # agents close windows every 0.5 s (BOUNDWATCH_AGENT_WINDOW_S)
MAX_FUTURE_NS = 5_000_000_000  # a window or step may end at most this far after its receive time
MAX_PAST_NS = 600_000_000_000  # ... and at most this long before it
MIN_STEP_NS = 10_000  # 100,000 steps per second per engine at most
STEP_BURST_NS = 5_000_000_000  # step time (per thread) an engine may report ahead of its clock
MAX_STEP_THREADS = 8  # step wall time may exceed their span this many times (overlapping engine threads)
LOG_EVERY_S = 60.0  # bad and refused datagrams: one log line per minute at most
# light-agent figures, bounded at the edge
MAX_STEPS_PER_MESSAGE = 16  # steps entries read from one datagram (an agent sends at most 8)
# steps records kept from one agent between two reads (an agent sends a few datagrams a tick): with
# MAX_AGENTS, 8,192 records at most, none ever dropped for another agent's
MAX_STEPS_PER_AGENT_READ = 64
# kept from all agents between two reads (agents forgotten and new ones in one tick)
MAX_STEP_RECORDS = 10_000
MAX_ENGINE_CORES = 64  # (engine-core pid, engine, DP rank) entries per tick in all
MAX_GRAPH_PROCESSES = 256  # processes with graph counts per tick
MAX_REQUESTS = 1_000_000  # running / waiting / batch limit above this are not plausible
MAX_COUNT = 10_000_000  # steps, replays or captures per message above this are not plausible
INBOX_MAX = 512  # datagrams received but not yet decoded (see the module's doc)
INBOX_MAX_BYTES = 1 << 20
INBOX_HOLD = 4  # the reader holds up to this many times the bounds while the event loop is late, then drops
RECEIVE_RETRY_S = 0.1  # the reader's pause after a failed receive (a broken socket must not spin)
PACE_BIN_S = 1.0  # arrivals are counted per second to choose how the reader waits (see the module's doc)
PACE_FIT = 2  # paced while a second's arrivals fit this many times in the kernel's queue
PACED_AFTER = 3  # ... for this many seconds in a row
PACE_BACKSTOP_S = 1.0  # while paced, the thread drains the socket when no read did for this long
REFUSED_REASONS = (
    "peer",
    "agents",
    "devices",
    "gpus",
    "engines",
    "clock",
    "overlap",
    "limits",
    "backlog",
    "inbox",
)
# what the socket's reader thread puts in the inbox
_DATAGRAM, _TRUNCATED, _REFUSED, _FAILED = range(4)


def _off_clock(t1: int, wall: int) -> bool:
    """Say whether an agent's record ending at t1 (unix ns) lies outside what this daemon, at `wall`, takes."""
    return not wall - MAX_PAST_NS <= t1 <= wall + MAX_FUTURE_NS


@dataclass
class _Agent:
    pid: int
    last_seen: float
    msg: wire.Message
    uuids: dict[int, str] = field(default_factory=dict)
    ends: dict[int, int] = field(default_factory=dict)  # dev -> newest window end, ns
    busy_t0: dict[int, int] = field(default_factory=dict)  # dev -> start of the newest busy window
    step_ends: dict[tuple[str, int], int] = field(
        default_factory=dict
    )  # (engine, DP rank) -> newest steps end, ns
    step_budget: dict[tuple[str, int], tuple[int, int]] = field(
        default_factory=dict
    )  # (engine, DP rank) -> (at, ns left)
    pending: int = 0
    peer: int = 0  # the sender's pid as this daemon sees it (SO_PEERCRED), 0 when unknown
    alive_at: float = float("-inf")  # when a quiet agent's process was last seen alive
    graphs: tuple[int, int, str] | None = None  # its newest graph counts' (captures, dev, uuid)
    quiet_ns: int = 0  # time counted for it as quiet since its last graph counts (zero replays)
    parent: int = -1  # from another PID namespace: its parent's pid as this daemon sees it (-1: not read)
    graphs_end: int = 0  # ns: the newest graph counts' end (counts ending no later are refused)
    steps_read: int = -1  # the feed's read its steps_taken counts for
    steps_taken: int = 0  # steps records kept from it since that read


@dataclass
class _Gpu:
    index: int = 0  # stable label value while the key is remembered
    last_seen: float = 0.0


class _Throttle:
    """One log line per `every` seconds for a recurring event, saying how many were not logged."""

    def __init__(self, event: str, clock: Callable[[], float], every: float = LOG_EVERY_S) -> None:
        self.event, self.clock, self.every = event, clock, every
        self.next_at: float | None = None
        self.unlogged = 0

    def __call__(self, **fields: object) -> None:
        now = self.clock()
        if self.next_at is not None and now < self.next_at:
            self.unlogged += 1
            return
        log.warning(self.event, not_logged_since_last=self.unlogged, **fields)
        self.unlogged, self.next_at = 0, now + self.every


def _pid_alive(pid: int) -> bool:
    """Return whether a process runs with this pid (as this daemon's /proc sees it)."""
    return pid > 0 and os.path.exists(f"/proc/{pid}")


def _parent_pid(pid: int) -> int:
    """Return a process's parent pid as this daemon's /proc sees it (0: unknown)."""
    stat = procs.read_stat("/proc", pid)
    return stat.ppid if stat is not None else 0


class AgentFeed:
    """The agent feed source: `await start()`, then `await read()` every tick."""

    name = "agent"

    def __init__(
        self,
        cfg: AgentFeedConfig,
        clock: Callable[[], float] = time.monotonic,
        merge_wait_s: float = 1.0,
        wall_ns: Callable[[], int] = time.time_ns,
        alive: Callable[[int], bool] | None = None,
        parent: Callable[[int], int] | None = None,
        inner: Callable[[int], int] | None = None,
    ) -> None:
        self.cfg = cfg
        self.clock = clock
        self.wall_ns = wall_ns
        self.alive = alive or _pid_alive  # whether a quiet agent's process still runs
        self.parent = parent or _parent_pid  # a process's parent pid, for agents in other PID namespaces
        # a process's pid in its own PID namespace (0: this daemon's)
        self.inner = inner or unixsock.inner_pid
        self._inner: dict[tuple[int, int], bool] = {}  # (peer pid, its message's pid) -> foreign (bounded)
        self.merge_wait_s = merge_wait_s
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sock_stat: os.stat_result | None = None
        self._lock_fd: int | None = None
        self._allow: unixsock.AllowList | None = None
        self._agents: dict[int, _Agent] = {}
        # (gpu key, t0) -> (first arrival, {pid: (window, uuid)})
        self._pending: dict[tuple[str, int], tuple[float, dict[int, tuple[wire.Window, str]]]] = {}
        self._gpus: dict[str, _Gpu] = {}
        self._engines: set[str] = set()
        self._steps: list[tuple[int, wire.Steps]] = []  # (message pid, steps)
        self._reads = 0  # reads that took the steps (each agent's steps_taken counts within one)
        # pid -> [observed ns, replays, captures, dev, uuid, since ns, until ns] (GraphUse)
        self._graphs: dict[int, list[int | str]] = {}
        self._collected_at = clock()  # the last collect(): a quiet agent's zero replays cover the time since
        # pid -> (its AgentState's fields, the AgentState): handed out again while they stay the same
        self._kept_states: dict[int, tuple[tuple[object, ...], AgentState]] = {}
        # received, not yet decoded: (what, datagram, sender, arrival clock(), arrival wall_ns()); the
        # reader thread appends, the event loop pops (a deque: both atomic)
        self._inbox: deque[tuple[int, bytes, unixsock.Peer | None, float, int]] = deque()
        self._reader: threading.Thread | None = None
        self._closing = False
        # how the reader waits (the module's doc): a second's arrivals at most `_pace_limit` for
        # PACED_AFTER seconds make it paced; `_drain_lock` serialises the receives and the counts below
        self._drain_lock = threading.Lock()
        self._wake = threading.Event()  # wakes a paced reader (closing, or back to blocking)
        self._paced = False
        self._queue = 0  # datagrams the kernel queues for the socket (net.unix.max_dgram_qlen + 1), at bind
        self._pace_limit = 0  # a second's arrivals that fit PACE_FIT times in it
        self._bin_at, self._bin_n, self._fitting = time.monotonic(), 0, 0
        self._drained_at = time.monotonic()
        self.paced_switches = 0  # times the reader changed how it waits
        # counts the reader writes under `_drain_lock` (arrived, their bytes, dropped while the inbox was
        # full: the thread, or the loop's drain while paced) and those only the event loop writes (opened,
        # their bytes, drops counted): no count has two writers at once
        self._arrived = self._arrived_bytes = self._dropped = 0
        self._opened = self._opened_bytes = self._dropped_seen = 0
        self._asked = -1  # `_opened` when the reader last asked the loop to open a full inbox
        self._messages = 0
        self._bad = 0
        self._refused = dict.fromkeys(REFUSED_REASONS, 0)
        self._log_bad = _Throttle("agent_bad_message", clock)
        self._log_refused = _Throttle("agent_refused", clock)
        self.last_error = ""
        self.start_error = ""

    async def start(self) -> None:
        """Bind the socket in a safe directory, never over a live one; raise SourceUnavailable when impossible."""
        path = self.cfg.socket
        try:
            self._bind(path)
        except (OSError, KeyError) as exc:
            self.start_error = f"cannot bind agent socket {path}: {exc}"
            raise SourceUnavailable(self.start_error) from exc
        assert self._sock is not None
        self._loop = asyncio.get_running_loop()
        self._sock.setblocking(True)
        self._reader = threading.Thread(
            target=self._receive_forever, args=(self._sock, self._loop), name="bw-agent_0", daemon=True
        )
        self._reader.start()

    def _bind(self, path: str) -> None:
        cfg = self.cfg
        group = unixsock.resolve_group(cfg.socket_group) if cfg.socket_group else unixsock.default_group()
        dir_st = unixsock.secure_dir(os.path.dirname(os.path.abspath(path)), group)
        lock = unixsock.claim(path)
        try:
            gid = group if cfg.socket_group else dir_st.st_gid
            try:
                sock, st = unixsock.bind(path, gid)
            except PermissionError:
                if cfg.socket_group:
                    raise
                sock, st = unixsock.bind(path, None)  # not a member of the directory's group
            self._allow = unixsock.AllowList.build(cfg.allowed_uids, cfg.allowed_groups, st.st_gid)
        except BaseException:
            os.close(lock)
            raise
        self._sock, self._sock_stat, self._lock_fd = sock, st, lock
        self._queue = unixsock.dgram_queue_limit() + 1
        self._pace_limit = self._queue // PACE_FIT

    def _receive_forever(self, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        """The reader thread: put each datagram in the inbox with its arrival, as it comes or paced (I/O only)."""
        name_os_thread(threading.current_thread().name)
        while not self._closing:
            if self._paced:
                self._wake.wait(max(0.0, self._drained_at + PACE_BACKSTOP_S - time.monotonic()))
                self._wake.clear()
                if self._paced and time.monotonic() - self._drained_at >= PACE_BACKSTOP_S:
                    self._drain(sock, loop)  # no read came for a while: the event loop is held up
                continue
            try:
                data, peer, truncated = unixsock.receive_one(sock, wire.MAX_DATAGRAM_BYTES)
            except OSError as exc:
                if self._closing:
                    return
                with self._drain_lock:
                    self._arrive(loop, _FAILED, f"receive failed: {exc}".encode(), None)
                time.sleep(RECEIVE_RETRY_S)
                continue
            if self._closing:
                return
            with self._drain_lock:
                self._sort(loop, data, peer, truncated)
                self._count(1)

    def _drain(self, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        """Take every datagram the kernel holds, without waiting (a paced reader: the loop's read, or the thread's)."""
        with self._drain_lock:
            if not self._paced:
                return
            n = 0
            at = (self.clock(), self.wall_ns())  # one receive time for what the kernel held together
            while not self._closing and n <= INBOX_HOLD * INBOX_MAX:
                try:
                    data, peer, truncated = unixsock.receive_one(
                        sock, wire.MAX_DATAGRAM_BYTES, unixsock.MSG_DONTWAIT
                    )
                except BlockingIOError:
                    break
                except OSError as exc:
                    self._arrive(loop, _FAILED, f"receive failed: {exc}".encode(), None)
                    break
                self._sort(loop, data, peer, truncated, at)
                n += 1
            self._drained_at = time.monotonic()
            self._count(n)

    def _sort(
        self,
        loop: asyncio.AbstractEventLoop,
        data: bytes,
        peer: unixsock.Peer | None,
        truncated: bool,
        at: tuple[float, int] | None = None,
    ) -> None:
        """Put one received datagram in the inbox as what it is (under the drain lock); at: its (clock, wall)."""
        if truncated:
            self._arrive(loop, _TRUNCATED, b"", peer, at)
        elif peer is not None and self._allow is not None and not self._allow.allows(peer):
            self._arrive(loop, _REFUSED, b"", peer, at)  # refused on arrival: its data is never held
        else:
            self._arrive(loop, _DATAGRAM, data, peer, at)

    def _count(self, n: int) -> None:
        """Count n arrivals in this second's bin and choose how the reader waits (under the drain lock)."""
        now = time.monotonic()
        if now - self._bin_at >= PACE_BIN_S:
            last = self._bin_n
            self._fitting = self._fitting + 1 if last <= self._pace_limit else 0
            self._bin_at, self._bin_n = now, 0
            if not self._paced and self._fitting >= PACED_AFTER:
                self._paced, self._drained_at = True, now
                self._switched("paced", last)
        self._bin_n += n
        if self._paced and self._bin_n > self._pace_limit:  # the queue could fill before the next read
            self._paced, self._fitting = False, 0
            self._switched("blocking", self._bin_n)
            self._wake.set()

    def _switched(self, how: str, arrivals: int) -> None:
        """Count and log a change of how the reader waits (rare: at most once a second); arrivals: its second's."""
        self.paced_switches += 1
        log.info("agent_reader", waits=how, arrivals_in_a_second=arrivals, queue=self._queue)

    def _arrive(
        self,
        loop: asyncio.AbstractEventLoop,
        what: int,
        data: bytes,
        peer: unixsock.Peer | None,
        at: tuple[float, int] | None = None,
    ) -> None:
        """Put one arrival in the inbox (under the drain lock); past the bounds ask the loop to open it, far past drop."""
        held, held_bytes = self._arrived - self._opened, self._arrived_bytes - self._opened_bytes
        if held >= INBOX_HOLD * INBOX_MAX or held_bytes >= INBOX_HOLD * INBOX_MAX_BYTES:
            self._dropped += 1  # the event loop has not come for a long while: counted at its next read
            return
        now, wall = at if at is not None else (self.clock(), self.wall_ns())
        self._inbox.append((what, data, peer, now, wall))
        self._arrived += 1
        self._arrived_bytes += len(data)
        if (
            held + 1 >= INBOX_MAX or held_bytes + len(data) >= INBOX_MAX_BYTES
        ) and self._asked != self._opened:
            self._asked = self._opened
            with contextlib.suppress(RuntimeError):  # the loop closed: nothing will read it
                loop.call_soon_threadsafe(self._open_inbox)

    def _open_inbox(self) -> None:
        """Decode and take every datagram received since the last time, as of its arrival (the event loop)."""
        inbox = self._inbox
        for _ in range(len(inbox)):
            what, data, peer, now, wall = inbox.popleft()
            self._opened += 1
            self._opened_bytes += len(data)
            if what == _DATAGRAM:
                self._messages += 1
                self._decode_and_take(data, peer.pid if peer is not None else 0, now, wall)
            elif what == _TRUNCATED:
                self._messages += 1
                self._bad_message("datagram too large")
            elif what == _REFUSED and peer is not None:
                self._messages += 1
                self._refuse_peer(peer)
            else:
                self._bad_message(data.decode(errors="replace"))
        dropped = self._dropped
        if dropped != self._dropped_seen:
            n, self._dropped_seen = dropped - self._dropped_seen, dropped
            self._refuse("inbox", f"{n} datagrams dropped: the event loop did not read them in time", n)

    def receive(self, data: bytes, peer: unixsock.Peer | None = None) -> None:
        """Take one datagram from a sender now (what the socket's inbox does at collect; public for tests and replay)."""
        self._open_inbox()  # in arrival order
        self._messages += 1
        if peer is not None and self._allow is not None and not self._allow.allows(peer):
            self._refuse_peer(peer)
            return
        self._decode_and_take(data, peer.pid if peer is not None else 0, self.clock(), self.wall_ns())

    def _refuse_peer(self, peer: unixsock.Peer) -> None:
        self._refuse("peer", f"uid {peer.uid} gid {peer.gid} (pid {peer.pid}) is not allowed to send")

    def _decode_and_take(self, data: bytes, peer: int, now: float, wall: int) -> None:
        try:
            msg = wire.decode(data)
        except wire.WireError as exc:
            self._bad_message(str(exc))
            return
        try:
            self._take(msg, peer, now, wall)
        except Exception as exc:  # a bug here must cost one datagram, not the feed or the log
            self._bad_message(f"{type(exc).__name__}: {exc}")

    def _bad_message(self, error: str) -> None:
        self._bad += 1
        self.last_error = error
        self._log_bad(error=error)

    def _refuse(self, reason: str, why: str, n: int = 1) -> None:
        self._refused[reason] += n
        self.last_error = why
        self._log_refused(reason=reason, error=why)

    def _take(self, msg: wire.Message, peer: int, now: float, wall: int) -> None:
        """Take one decoded message from sender pid `peer` (0: unknown), received at `now` (clock()) and `wall` (wall_ns()).

        A sender whose message's pid is its pid in another PID namespace (an engine's container beside a
        sidecar with the host's: `_foreign`) is taken under its peer pid, its workers' steps under the
        pids this daemon sees (`_seen_here`); else two containers' agents with the same pid would be one
        agent, and none would join its engine's processes.
        """
        foreign = 0 < peer != msg.pid and self._foreign(peer, msg.pid)
        if foreign:
            msg = replace(msg, pid=peer)
        agent = self._agents.get(msg.pid)
        if agent is None:
            if len(self._agents) >= MAX_AGENTS:
                self._forget(now, silent_for=self.cfg.stale_seconds)  # live agents first
            if len(self._agents) >= MAX_AGENTS:
                self._refuse("agents", f"{MAX_AGENTS} agents already report; pid {msg.pid} refused")
                return
            agent = _Agent(msg.pid, now, msg)
        devs = set(agent.uuids) | {d for d, _ in msg.devices} | {w.dev for w in msg.windows}
        if len(devs) > MAX_DEVICES_PER_AGENT:
            self._refuse(
                "devices", f"pid {msg.pid} reports {len(devs)} devices, over {MAX_DEVICES_PER_AGENT}"
            )
            return
        self._agents[msg.pid] = agent
        if foreign and any(s.owner for s in msg.steps):
            msg = self._seen_here(agent, msg)
        agent.last_seen, agent.msg, agent.alive_at = now, msg, now
        agent.peer = peer or agent.peer
        agent.uuids.update(dict(msg.devices))
        for dev, uuid in msg.devices:  # each GPU gets its stable index when an agent first names it
            if self._gpu(uuid or f"cuda{dev}", dev, now) is None:
                self._refuse("gpus", f"{MAX_GPUS} GPUs already known; {uuid[:96] or dev} refused")
        for w in msg.windows:
            self._take_window(agent, w, now, wall)
        if len(msg.steps) > MAX_STEPS_PER_MESSAGE:
            self._refuse("limits", f"pid {msg.pid}: {len(msg.steps)} steps entries in one datagram")
        if agent.steps_read != self._reads:  # its count of steps records restarts each read
            agent.steps_read, agent.steps_taken = self._reads, 0
        # A flood of records (those of zero steps cost no step budget) stays its sender's: refused past
        # its own bound, and past all agents' together, never pushing out records already kept.
        for s in msg.steps[:MAX_STEPS_PER_MESSAGE]:
            if agent.steps_taken >= MAX_STEPS_PER_AGENT_READ or len(self._steps) >= MAX_STEP_RECORDS:
                self._refuse("limits", f"pid {msg.pid}: over {MAX_STEPS_PER_AGENT_READ} steps records a tick")
                continue
            if self._steps_allowed(agent, s, wall):
                agent.steps_taken += 1
                self._steps.append((msg.pid, s))
        if msg.graphs is not None:
            self._take_graphs(agent, msg.graphs, now, wall)

    def _foreign(self, peer: int, pid: int) -> bool:
        """Say whether a sender whose pid says `pid` and whose peer pid is `peer` runs in another PID
        namespace, where `pid` is its own (read once per peer and pid). In this daemon's namespace the
        message's pid stands as it did (the same process, say, or a test's)."""
        known = self._inner.get((peer, pid))
        if known is None:
            if len(self._inner) >= 4 * MAX_AGENTS:
                self._inner.clear()
            known = self._inner[(peer, pid)] = self.inner(peer) == pid
        return known

    def _seen_here(self, agent: _Agent, msg: wire.Message) -> wire.Message:
        """Return a foreign agent's steps with their engine core named by this daemon's pid for it.

        A GPU worker names its engine core by its own parent's pid (`owner`, getppid() in its namespace);
        here that is the parent of the peer process, read once per agent. Unknown (the process gone,
        no /proc), the steps stay the worker's own (owner 0) rather than name an unrelated pid here.
        """
        if agent.parent < 0:
            agent.parent = self.parent(agent.pid)
        owner = agent.parent
        return replace(msg, steps=tuple(replace(s, owner=owner) if s.owner else s for s in msg.steps))

    def _gpu(self, key: str, dev: int, now: float) -> _Gpu | None:
        """Return the GPU entry of a key, giving a new key a stable free index (None: no room)."""
        gpu = self._gpus.get(key)
        if gpu is None:
            if len(self._gpus) >= MAX_GPUS and not self._evict_gpu():
                return None
            used = {g.index for g in self._gpus.values()}
            free = [i for i in range(MAX_GPUS) if i not in used]
            gpu = self._gpus[key] = _Gpu(index=dev if 0 <= dev < MAX_GPUS and dev not in used else free[0])
        gpu.last_seen = now
        return gpu

    def _evict_gpu(self) -> bool:
        """Forget the least recently seen GPU key no live agent or pending window uses; say whether one went."""
        used = {uuid or f"cuda{dev}" for a in self._agents.values() for dev, uuid in a.uuids.items()}
        used |= {a.graphs[2] for a in self._agents.values() if a.graphs is not None and a.graphs[2]}
        used |= {key for key, _ in self._pending}
        idle = [(g.last_seen, key) for key, g in self._gpus.items() if key not in used]
        if not idle:
            return False
        del self._gpus[min(idle)[1]]
        return True

    def _take_window(self, agent: _Agent, w: wire.Window, now: float, wall: int) -> None:
        uuid = agent.uuids.get(w.dev, "")
        key = uuid or f"cuda{w.dev}"
        if w.t1 - w.t0 > MAX_WINDOW_NS:
            self._refuse("limits", f"pid {agent.pid}: a {(w.t1 - w.t0) / 1e9:.1f} s window")
            return
        if _off_clock(w.t1, wall):
            self._refuse("clock", f"pid {agent.pid}: a window ends {(w.t1 - wall) / 1e9:+.1f} s from now")
            return
        if w.t0 < agent.ends.get(w.dev, 0):
            self._refuse("overlap", f"pid {agent.pid}: a window overlaps the previous one on device {w.dev}")
            return
        if w.gap_sum > w.t1 - agent.busy_t0.get(w.dev, w.t0 - MAX_PAST_NS):
            self._refuse(
                "limits", f"pid {agent.pid}: idle gaps longer than the time since the last busy window"
            )
            return
        if len(self._pending) >= MAX_PENDING_WINDOWS or agent.pending >= MAX_PENDING_PER_AGENT:
            self._refuse("backlog", f"pid {agent.pid}: too many windows waiting to be merged")
            return
        gpu = self._gpu(key, w.dev, now)
        if gpu is None:
            self._refuse("gpus", f"{MAX_GPUS} GPUs already known; {key[:96]} refused")
            return
        agent.ends[w.dev] = w.t1
        if w.busy:
            agent.busy_t0[w.dev] = w.t0
        _, by_pid = self._pending.setdefault((key, w.t0), (now, {}))
        agent.pending += agent.pid not in by_pid
        by_pid[agent.pid] = (w, uuid)

    def _steps_allowed(self, agent: _Agent, s: wire.Steps, wall: int) -> bool:
        """Say whether one steps record is within the limits (engine names, clock, rate); count it if not."""
        if s.engine not in self._engines and len(self._engines) >= MAX_ENGINES:
            self._refuse("engines", f"{MAX_ENGINES} engine names already seen; {s.engine!r} refused")
            return False
        if (s.engine, s.dp) not in agent.step_budget and len(agent.step_budget) >= MAX_ENGINES_PER_AGENT:
            self._refuse("engines", f"pid {agent.pid} reports over {MAX_ENGINES_PER_AGENT} engines")
            return False
        if s.t1:  # timed steps run on the agent's clock, which must stay near ours and move forward
            if _off_clock(s.t1, wall):
                self._refuse("clock", f"pid {agent.pid}: steps end {(s.t1 - wall) / 1e9:+.1f} s from now")
                return False
            if s.t1 <= agent.step_ends.get((s.engine, s.dp), 0):
                self._refuse(
                    "overlap", f"pid {agent.pid}: steps of {s.engine!r} end before the previous ones"
                )
                return False
        at = s.t1 or wall
        # A budget of step time refilled by elapsed time (MAX_STEP_THREADS engine threads at most),
        # holding STEP_BURST_NS at most: no engine steps faster than its clock runs.
        last, credit = agent.step_budget.get((s.engine, s.dp), (at, STEP_BURST_NS))
        credit = min(STEP_BURST_NS, credit + max(0, at - last))
        cost = max(-(-s.wall // MAX_STEP_THREADS), s.n * MIN_STEP_NS)
        if cost > credit:
            self._refuse("limits", f"pid {agent.pid}: {s.n} steps of {s.engine!r} over a plausible rate")
            return False
        agent.step_budget[(s.engine, s.dp)] = (
            max(at, last),
            credit - cost,
        )  # the budget's clock never runs back
        if s.t1:
            agent.step_ends[(s.engine, s.dp)] = s.t1
        self._engines.add(s.engine)
        return True

    async def read(self) -> AgentReading:
        """Return what the agents reported since the last read (windows raw, per GPU)."""
        return self._read_now()

    def start_read(self) -> asyncio.Future[AgentReading]:
        """Return `read()`'s outcome as a future already done (the Sampler's way: no task)."""
        future: asyncio.Future[AgentReading] = asyncio.get_running_loop().create_future()
        try:
            future.set_result(self._read_now())
        except Exception as exc:
            future.set_exception(exc)
        return future

    def _read_now(self) -> AgentReading:
        """Return what the agents reported since the last read, or raise SourceUnavailable."""
        if self._sock is None:
            raise SourceUnavailable(self.start_error or "agent feed not started")
        if self._sock_stat is not None and not self._still_bound():
            raise SourceUnavailable(
                f"agent socket {self.cfg.socket} was removed or replaced: agents cannot reach us"
            )
        if self._paced and self._loop is not None:  # what the kernel holds, read here: no thread wakes
            self._drain(self._sock, self._loop)
        return self.collect()

    def _still_bound(self) -> bool:
        assert self._sock_stat is not None
        try:
            st = os.lstat(self.cfg.socket)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == (self._sock_stat.st_dev, self._sock_stat.st_ino)

    def collect(self) -> AgentReading:
        """Hand out everything ready now, raw (the synchronous body of read()).

        A window is ready once every agent running on its GPU has sent it, or `merge_wait_s` after
        its first copy arrived; each GPU's ready windows go out as received, with the number of
        agents running on it (exporter.analysis.agent_union merges them).
        """
        self._open_inbox()
        now = self.clock()
        agents = self._agent_states(now)
        self._quiet_graphs(now)
        running_on: dict[str, set[int]] = {}
        for a in self._agents.values():
            if now - a.last_seen <= self.cfg.stale_seconds and a.msg.state == "running":
                for dev, uuid in a.uuids.items():
                    running_on.setdefault(uuid or f"cuda{dev}", set()).add(a.pid)
        ready: dict[str, list[AgentWindow]] = {}
        for (key, t0), (first, by_pid) in list(self._pending.items()):
            expected = running_on.get(key, set())
            if expected.issubset(by_pid) or now - first >= self.merge_wait_s:
                ready.setdefault(key, []).extend(_raw(pid, w) for pid, (w, _) in by_pid.items())
                del self._pending[(key, t0)]
                for pid in by_pid:
                    if pid in self._agents:
                        self._agents[pid].pending = max(0, self._agents[pid].pending - 1)
        windows = [
            GpuWindows(
                gpu=gpu.index,
                uuid="" if key.startswith("cuda") else key,
                running=len(running_on.get(key, ())),
                windows=tuple(ready.get(key, ())),
            )
            for key, gpu in self._gpus.items()
            if key in ready or key in running_on
        ]
        steps = self._merge_steps()
        reading = AgentReading(
            agents=agents,
            steps=steps,
            graphs=self._graph_uses(),
            messages=self._messages,
            bad_messages=self._bad,
            refused=tuple(self._refused.items()),
            windows=tuple(windows),
        )
        self._messages = self._bad = 0
        self._refused = dict.fromkeys(REFUSED_REASONS, 0)
        return reading

    def _take_graphs(self, agent: _Agent, g: wire.GraphCounts, now: float, wall: int) -> None:
        """Add one message's light-hook graph counts to its process's totals for this tick (bounded; `wall`: its arrival)."""
        # on a clock far from ours what the counts cover is unknown (the verdict weighs replays by it)
        if _off_clock(g.t1, wall):
            self._refuse("clock", f"pid {agent.pid}: graph counts end {(g.t1 - wall) / 1e9:+.1f} s from now")
            return
        if g.t1 <= agent.graphs_end:  # the same counts again (or older ones): counted once
            self._refuse("overlap", f"pid {agent.pid}: graph counts end before the previous ones")
            return
        tot = self._graph_totals(agent.pid)
        if tot is None:
            return
        agent.graphs_end = g.t1
        whole = max(0, min(g.t1 - g.t0, 60 * 1_000_000_000))  # one message covers seconds, not minutes
        span, agent.quiet_ns = max(0, whole - agent.quiet_ns), 0  # its quiet time was counted already
        _, dev, uuid = agent.graphs or (
            0,
            -1,
            "",
        )  # a message that does not name its GPU keeps the last named
        if g.uuid and g.uuid != uuid and self._gpu(g.uuid, g.dev, now) is None:  # a GPU named here first
            self._refuse("gpus", f"{MAX_GPUS} GPUs already known; {g.uuid[:96]} refused")
            g = replace(g, uuid="")
        agent.graphs = (min(g.captures, MAX_COUNT), min(g.dev, 1023) if g.dev >= 0 else dev, g.uuid or uuid)
        tot[0] = int(tot[0]) + span
        tot[1] = int(tot[1]) + min(g.replays, MAX_COUNT)
        tot[2], tot[3], tot[4] = agent.graphs  # captures are cumulative: the newest
        # what the counts cover, bounded: never past their arrival, never more than the span back
        until = min(g.t1, wall)
        since = max(g.t0, until - whole)
        tot[5] = since if not tot[5] else min(int(tot[5]), since)
        tot[6] = max(int(tot[6]), until)

    def _graph_totals(self, pid: int) -> list[int | str] | None:
        tot = self._graphs.get(pid)
        if tot is None:
            if len(self._graphs) >= MAX_GRAPH_PROCESSES:
                self._refused["agents"] += 1
                return None
            tot = self._graphs[pid] = [0, 0, 0, -1, "", 0, 0]
        return tot

    def _quiet_graphs(self, now: float) -> None:
        """Count zero replays for each live quiet agent that has captured graphs, over the time since the last tick.

        A quiet agent holds its hooks in and resumes at the first replay or step its hooks see, so
        while it stays quiet it has seen, in full, that nothing replayed: where its process steps
        all the same (a torch engine decoding eager, with no step hook), that is the fact that says
        decode runs outside its graphs.
        """
        span = int(min(max(0.0, now - self._collected_at), 60.0) * 1e9)
        self._collected_at = now
        if span <= 0:
            return
        for a in self._agents.values():
            if a.graphs is None or a.graphs[0] <= 0 or a.pid in self._graphs or not self._quiet(a, now):
                continue
            tot = self._graph_totals(a.pid)
            if tot is None:
                return
            captures, dev, uuid = a.graphs
            wall = self.wall_ns()
            tot[0], tot[2], tot[3], tot[4], tot[5], tot[6] = span, captures, dev, uuid, wall - span, wall
            a.quiet_ns = min(a.quiet_ns + span, 3600 * 1_000_000_000)

    def _graph_uses(self) -> tuple[GraphUse, ...]:
        out = tuple(
            GraphUse(
                pid=pid,
                gpu=int(t[3]),
                uuid=str(t[4]),
                observed_ns=int(t[0]),
                replays=int(t[1]),
                captures=int(t[2]),
                since_ns=int(t[5]),
                until_ns=int(t[6]),
            )
            for pid, t in sorted(self._graphs.items())
        )
        self._graphs.clear()
        return out

    def _merge_steps(self) -> tuple[EngineSteps, ...]:
        """Sum the steps per engine core: (engine-core pid, engine, DP rank); workers' mode counts join their owner."""
        groups: dict[tuple[int, str, int], _EngineTotals] = {}
        per_pid: dict[int, int] = {}
        per_sender: dict[int, set[tuple[int, str, int]]] = {}  # the groups each sender's records went to
        for pid, s in self._steps:
            key = (s.owner or pid, s.engine, s.dp)
            mine = per_sender.setdefault(pid, set())
            if key not in mine and len(mine) >= MAX_ENGINES_PER_AGENT:  # owners made up by one sender
                self._refused["engines"] += 1  # cannot take the tick's groups from the others
                continue
            tot = groups.get(key)
            if tot is None:
                if len(groups) >= MAX_ENGINE_CORES or per_pid.get(key[0], 0) >= MAX_ENGINES_PER_AGENT:
                    self._refused["engines"] += 1
                    continue
                per_pid[key[0]] = per_pid.get(key[0], 0) + 1
                tot = groups[key] = _EngineTotals()
            mine.add(key)
            tot.add(s)
        self._steps.clear()
        self._reads += 1
        return tuple(groups[k].steps(*k) for k in sorted(groups))

    def _forget(self, now: float, silent_for: float | None = None) -> None:
        """Forget stopped agents and those silent for `silent_for` s (default: the forget time); free their memory."""
        limit = self.cfg.stale_seconds * FORGET_AFTER_STALE if silent_for is None else silent_for
        gone = [
            pid
            for pid, a in self._agents.items()
            if a.msg.state == "stopped" or (now - a.last_seen > limit and not self._quiet(a, now))
        ]
        for pid in gone:
            del self._agents[pid]
        if gone:
            self._agents = dict(self._agents)  # a dict never shrinks its table in place

    def _quiet(self, a: _Agent, now: float) -> bool:
        """Say whether an agent with nothing to report is still alive (its process runs).

        A quiet agent sends nothing until its process does something its hooks see, so its silence is
        no sign of trouble while the process lives: looked up at most once per stale_seconds. A light
        agent says nothing either once its engine stops stepping (its thread does not wake: by default
        never, else for its idle_wake_s, exporter.agent.light): silent for longer than it said it would be while its engine
        steps (its messages' silent_ms), it is quiet while its process runs.
        """
        msg = a.msg
        if msg.state != "quiet" and not (
            msg.state == "running" and msg.silent_ms and now - a.last_seen > msg.silent_ms / 1000
        ):
            return False
        if now - a.alive_at > self.cfg.stale_seconds:
            if not self.alive(a.peer or a.pid):
                return False
            a.alive_at = now
        return True

    def _agent_states(self, now: float) -> tuple[AgentState, ...]:
        self._forget(now)
        out: list[AgentState] = []
        kept = self._kept_states
        for pid, a in self._agents.items():
            msg = a.msg
            state = msg.state
            if self._quiet(a, now):  # said so, or silent past what it said it would be while its engine steps
                state = "quiet"
            elif now - a.last_seen > self.cfg.stale_seconds:
                state = "stale"
            dev, uuid = min(a.uuids.items()) if a.uuids else (-1, "")
            gpu = self._gpus.get(uuid or f"cuda{dev}")
            fields = (
                pid,
                gpu.index if gpu is not None else -1,
                state,
                msg.detail,
                msg.role,
                uuid,
                msg.lib,
                msg.mode,
                msg.sent_dropped,
                msg.steps_stale,
                msg.settings_rejected,
                a.graphs[2] if a.graphs is not None else "",
            )
            hit = kept.get(pid)
            if hit is None or hit[0] != fields:  # an agent's state most often stays what it was: shared
                hit = kept[pid] = (fields, AgentState(*fields))
            out.append(hit[1])
        if len(kept) > len(self._agents):  # forgotten agents' states go with them
            self._kept_states = {pid: kept[pid] for pid in self._agents if pid in kept}
        return tuple(sorted(out, key=_pid))

    def close(self) -> None:
        """Stop reading, and remove the socket file only while it is still the one this feed bound."""
        if self._sock is not None:
            self._closing = True
            self._wake.set()  # wakes a paced reader
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)  # wakes the reader thread's receive
            if self._reader is not None:
                self._reader.join(timeout=2.0)
                self._reader = None
            self._sock.close()
            self._sock = None
            if self._sock_stat is not None:
                unixsock.remove_if_ours(self.cfg.socket, self._sock_stat)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    async def aclose(self) -> None:
        """Close the socket (the daemon calls this on its way out)."""
        self.close()


def _raw(pid: int, w: wire.Window) -> AgentWindow:
    """Return one received window as the Snapshot keeps it (its tuples shared, not copied).

    The same object as `AgentWindow(pid=pid, t0=w.t0, ...)`, without the frozen __init__'s one
    object.__setattr__ per field: its fields fill __dict__ in field order, as __init__ would.
    """
    raw = object.__new__(AgentWindow)
    raw.__dict__.update(
        {
            "pid": pid,
            "t0": w.t0,
            "t1": w.t1,
            "busy_ns": w.busy,
            "graph_busy_ns": w.graph_busy,
            "kernels": w.kernels,
            "memcpys": w.memcpys,
            "memsets": w.memsets,
            "graphs": w.graphs,
            "dropped": w.dropped,
            "gap_counts": w.gaps,
            "gap_sum_ns": w.gap_sum,
            "iv": w.iv,
            "slack_ns": w.slack,
        }
    )
    return raw


def _pid(state: AgentState) -> int:
    return state.pid


def _clamp(value: int, hi: int) -> int:
    return max(0, min(value, hi))


@dataclass
class _EngineTotals:
    """One engine core's steps over a tick, summed from its agents' messages (clamped to plausible values)."""

    n: int = 0
    wall: int = 0
    gpu: int = 0
    tokens: int = 0
    seqs: int = 0
    graph: int = 0
    eager: int = 0
    run_ns: int = 0
    wait_ns: int = 0
    hist: list[int] = field(default_factory=lambda: [0] * wire.STEP_BUCKET_COUNT)
    measured: bool = False
    latest_t1: int = -1
    running: int | None = None
    waiting: int | None = None
    max_seqs: int | None = None

    def add(self, s: wire.Steps) -> None:
        """Add one steps entry."""
        self.measured = self.measured or bool(s.measured)
        self.n += _clamp(s.n, MAX_COUNT)
        self.wall += s.wall
        self.gpu += s.gpu
        self.tokens += s.tokens
        self.seqs += s.seqs
        self.graph += _clamp(s.graph, MAX_COUNT)
        self.eager += _clamp(s.eager, MAX_COUNT)
        bound = MAX_REQUESTS * 3600 * 1_000_000_000  # request-ns in one message: an hour at the cap
        self.run_ns += _clamp(s.run_ns, bound)
        self.wait_ns += _clamp(s.wait_ns, bound)
        for i, c in enumerate(s.hist):
            self.hist[i] += c
        if (s.running >= 0 or s.waiting >= 0) and s.t1 >= self.latest_t1:
            self.latest_t1 = s.t1
            self.running = _clamp(s.running, MAX_REQUESTS) if s.running >= 0 else None
            self.waiting = _clamp(s.waiting, MAX_REQUESTS) if s.waiting >= 0 else None
        if s.max_seqs:
            self.max_seqs = _clamp(s.max_seqs, MAX_REQUESTS)

    def steps(self, pid: int, engine: str, dp: int) -> EngineSteps:
        """Return the snapshot's EngineSteps for this engine core."""
        return EngineSteps(
            engine=engine,
            steps=self.n,
            wall_ns=self.wall,
            gpu_busy_ns=self.gpu,
            step_hist=tuple(self.hist),
            tokens=self.tokens,
            seqs=self.seqs,
            gpu_measured=self.measured,
            pid=pid,
            graph_steps=self.graph,
            eager_steps=self.eager,
            running=None if self.running is None else float(self.running),
            waiting=None if self.waiting is None else float(self.waiting),
            running_seconds=self.run_ns / 1e9,
            waiting_seconds=self.wait_ns / 1e9,
            max_num_seqs=self.max_seqs,
            dp_rank=dp if dp >= 0 else None,
        )
