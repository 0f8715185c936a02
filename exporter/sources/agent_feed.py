"""Receive the in-process agents' windows on a unix datagram socket and merge them per GPU.

Any number of agents send to one socket (`cfg.agent.socket`, mode 0666 so workers running as
other users can send; a message is validated and bounded, so a bad sender can only add bad-message
counts). Windows are aligned to absolute time in every agent, so the windows of several processes
sharing one GPU line up: a window is merged once every running agent on that GPU has sent it, or
`merge_wait_s` after the first copy arrived. The merge unions the processes' busy intervals
(exporter.analysis.intervals.union_busy): two processes' kernels that overlap in time count once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from exporter import wire
from exporter.analysis import intervals
from exporter.config import AgentFeedConfig
from exporter.snapshot.agent import AgentReading, AgentState, EngineSteps, GpuActivity, GraphUse
from exporter.sources.base import SourceUnavailable

MAX_PENDING_WINDOWS = 4096
FORGET_AFTER_STALE = 12  # forget an agent after this many stale periods
# light-agent figures, bounded at the edge
MAX_STEPS_PER_MESSAGE = 16  # steps entries read from one datagram (an agent sends at most 8)
MAX_ENGINES_PER_AGENT = 8  # (engine, DP rank) pairs per engine-core pid in one tick
MAX_ENGINES = 64  # engine entries per tick in all
MAX_GRAPH_PROCESSES = 256  # processes with graph counts per tick
MAX_REQUESTS = 1_000_000  # running / waiting / batch limit above this are not plausible
MAX_COUNT = 10_000_000  # steps, replays or captures per message above this are not plausible


@dataclass
class _Agent:
    pid: int
    last_seen: float
    msg: wire.Message
    uuids: dict[int, str] = field(default_factory=dict)


@dataclass
class _Gpu:
    last_end: int | None = None
    last_busy: int = 0
    last_span: int = 0
    last_at: float = 0.0
    fallback_dev: int = -1


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, feed: AgentFeed) -> None:
        self.feed = feed

    def datagram_received(self, data: bytes, addr: object) -> None:
        self.feed.receive(data)


class AgentFeed:
    """The agent feed source: `await start()`, then `await read()` every tick."""

    name = "agent"

    def __init__(
        self,
        cfg: AgentFeedConfig,
        clock: Callable[[], float] = time.monotonic,
        merge_wait_s: float = 1.0,
    ) -> None:
        self.cfg = cfg
        self.clock = clock
        self.merge_wait_s = merge_wait_s
        self._transport: asyncio.DatagramTransport | None = None
        self._agents: dict[int, _Agent] = {}
        # (gpu key, t0) -> (first arrival, {pid: (window, uuid)})
        self._pending: dict[tuple[str, int], tuple[float, dict[int, tuple[wire.Window, str]]]] = {}
        self._gpus: dict[str, _Gpu] = {}
        self._steps: list[tuple[int, wire.Steps]] = []  # (message pid, steps)
        self._graphs: dict[int, list[int | str]] = {}  # pid -> [observed ns, replays, captures, dev, uuid]
        self._messages = 0
        self._bad = 0
        self.last_error = ""

    async def start(self) -> None:
        """Bind the socket (replacing a stale one); raise SourceUnavailable when that is impossible."""
        path = self.cfg.socket
        try:
            directory = os.path.dirname(path)
            if directory and not os.path.isdir(directory):
                os.makedirs(directory, mode=0o755, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
            sock.bind(path)
            os.chmod(path, 0o666)
            sock.setblocking(False)
        except OSError as exc:
            raise SourceUnavailable(f"cannot bind agent socket {path}: {exc}") from exc
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(lambda: _Protocol(self), sock=sock)
        self._transport = transport

    def receive(self, data: bytes) -> None:
        """Take one datagram (called by the protocol; public for tests and replay)."""
        self._messages += 1
        try:
            msg = wire.decode(data)
        except wire.WireError as exc:
            self._bad += 1
            self.last_error = str(exc)
            return
        now = self.clock()
        agent = self._agents.get(msg.pid)
        if agent is None:
            agent = self._agents[msg.pid] = _Agent(msg.pid, now, msg)
        agent.last_seen, agent.msg = now, msg
        agent.uuids.update(dict(msg.devices))
        for w in msg.windows:
            uuid = msg.uuid_of(w.dev)
            key = uuid or f"cuda{w.dev}"
            if len(self._pending) >= MAX_PENDING_WINDOWS:
                self._bad += 1
                continue
            _, by_pid = self._pending.setdefault((key, w.t0), (now, {}))
            by_pid[msg.pid] = (w, uuid)
            self._gpus.setdefault(key, _Gpu()).fallback_dev = w.dev
        if len(msg.steps) > MAX_STEPS_PER_MESSAGE:
            self._bad += 1
        self._steps.extend((msg.pid, st) for st in msg.steps[:MAX_STEPS_PER_MESSAGE])
        if len(self._steps) > 10_000:
            del self._steps[:-10_000]
        if msg.graphs is not None:
            self._take_graphs(msg.pid, msg.graphs)

    async def read(self) -> AgentReading:
        """Return what the agents reported since the last read, merged per GPU."""
        if self._transport is None:
            raise SourceUnavailable("agent feed not started")
        return self.collect()

    def collect(self) -> AgentReading:
        """Merge and hand out everything ready now (the synchronous body of read())."""
        now = self.clock()
        agents = self._agent_states(now)
        running_on: dict[str, set[int]] = {}
        for a in self._agents.values():
            if now - a.last_seen <= self.cfg.stale_seconds and a.msg.state == "running":
                for dev, uuid in a.uuids.items():
                    running_on.setdefault(uuid or f"cuda{dev}", set()).add(a.pid)
        ready: dict[str, list[tuple[int, dict[int, tuple[wire.Window, str]]]]] = {}
        for (key, t0), (first, by_pid) in list(self._pending.items()):
            expected = running_on.get(key, set())
            if expected.issubset(by_pid) or now - first >= self.merge_wait_s:
                ready.setdefault(key, []).append((t0, by_pid))
                del self._pending[(key, t0)]
        activity = [self._merge(key, sorted(items, key=lambda x: x[0]), now) for key, items in ready.items()]
        for key, gpu in self._gpus.items():  # keep the latest ratio while the agents are alive
            if key not in ready and gpu.last_span and key in running_on:
                activity.append(
                    GpuActivity(
                        gpu=gpu.fallback_dev,
                        uuid=key if key.startswith("GPU-") else "",
                        observed_ns=0,
                        busy_ns=0,
                        last_window_busy_ns=gpu.last_busy,
                        last_window_ns=gpu.last_span,
                        processes=len(running_on[key]),
                    )
                )
        steps = self._merge_steps()
        reading = AgentReading(
            activity=tuple(sorted(activity, key=lambda a: (a.uuid, a.gpu))),
            agents=agents,
            steps=steps,
            graphs=self._graph_uses(),
            messages=self._messages,
            bad_messages=self._bad,
        )
        self._messages = self._bad = 0
        return reading

    def _merge(
        self, key: str, items: list[tuple[int, dict[int, tuple[wire.Window, str]]]], now: float
    ) -> GpuActivity:
        gpu = self._gpus.setdefault(key, _Gpu())
        observed = busy = graph = 0
        counts = {"kernels": 0, "memcpys": 0, "memsets": 0, "graphs": 0, "dropped": 0}
        hist = [0] * (len(intervals.IDLE_GAP_BUCKETS_NS) + 1)
        gap_sum = 0
        processes = 1
        for t0, by_pid in items:
            windows = [w for w, _ in by_pid.values()]
            span = max(w.t1 for w in windows) - t0
            processes = max(processes, len(windows))
            if len(windows) == 1:
                w = windows[0]
                wbusy = min(w.busy, span)
                if any(w.gaps):
                    for i, c in enumerate(w.gaps):
                        hist[i] += c
                    gap_sum += w.gap_sum
                ivs = wire.unpack_intervals(w.iv, t0)
                if ivs:
                    gpu.last_end = max(gpu.last_end or 0, ivs[-1][1])
                wgraph = w.graph_busy
            else:
                pw = [
                    intervals.ProcessWindow(w.busy, tuple(wire.unpack_intervals(w.iv, t0)), w.slack)
                    for w in windows
                ]
                wbusy, merged = intervals.union_busy(pw, span)
                found, gpu.last_end = intervals.gaps(intervals.clip(merged, t0, t0 + span), gpu.last_end)
                h, s = intervals.gap_histogram(found)
                for i, c in enumerate(h):
                    hist[i] += c
                gap_sum += s
                wgraph = min(sum(w.graph_busy for w in windows), wbusy)  # graph spans carry no intervals
            observed += span
            busy += wbusy
            graph += wgraph
            for w in windows:
                for k in counts:
                    counts[k] += getattr(w, k)
            gpu.last_busy, gpu.last_span, gpu.last_at = wbusy, span, now
        last_uuid = key if key.startswith("GPU-") else ""
        return GpuActivity(
            gpu=gpu.fallback_dev,
            uuid=last_uuid,
            observed_ns=observed,
            busy_ns=busy,
            graph_busy_ns=graph,
            kernels=counts["kernels"],
            memcpys=counts["memcpys"],
            memsets=counts["memsets"],
            graphs=counts["graphs"],
            dropped=counts["dropped"],
            idle_gap_counts=tuple(hist),
            idle_gap_sum_ns=gap_sum,
            last_window_busy_ns=gpu.last_busy,
            last_window_ns=gpu.last_span,
            processes=processes,
        )

    def _take_graphs(self, pid: int, g: wire.GraphCounts) -> None:
        """Add one message's light-hook graph counts to its process's totals for this tick (bounded)."""
        tot = self._graphs.get(pid)
        if tot is None:
            if len(self._graphs) >= MAX_GRAPH_PROCESSES:
                self._bad += 1
                return
            tot = self._graphs[pid] = [0, 0, 0, -1, ""]
        span = min(g.t1 - g.t0, 60 * 1_000_000_000)  # one message covers seconds, not minutes
        tot[0] = int(tot[0]) + span
        tot[1] = int(tot[1]) + min(g.replays, MAX_COUNT)
        tot[2] = min(g.captures, MAX_COUNT)  # cumulative: the newest
        if g.dev >= 0:
            tot[3] = min(g.dev, 1023)
        if g.uuid:
            tot[4] = g.uuid

    def _graph_uses(self) -> tuple[GraphUse, ...]:
        out = tuple(
            GraphUse(
                pid=pid,
                gpu=int(t[3]),
                uuid=str(t[4]),
                observed_ns=int(t[0]),
                replays=int(t[1]),
                captures=int(t[2]),
            )
            for pid, t in sorted(self._graphs.items())
        )
        self._graphs.clear()
        return out

    def _merge_steps(self) -> tuple[EngineSteps, ...]:
        """Sum the steps per engine core: (engine-core pid, engine, DP rank); workers' mode counts join their owner."""
        groups: dict[tuple[int, str, int], _EngineTotals] = {}
        per_pid: dict[int, int] = {}
        for pid, s in self._steps:
            key = (s.owner or pid, s.engine, s.dp)
            tot = groups.get(key)
            if tot is None:
                if len(groups) >= MAX_ENGINES or per_pid.get(key[0], 0) >= MAX_ENGINES_PER_AGENT:
                    self._bad += 1
                    continue
                per_pid[key[0]] = per_pid.get(key[0], 0) + 1
                tot = groups[key] = _EngineTotals()
            tot.add(s)
        self._steps.clear()
        return tuple(groups[k].steps(*k) for k in sorted(groups))

    def _agent_states(self, now: float) -> tuple[AgentState, ...]:
        out: list[AgentState] = []
        for pid, a in list(self._agents.items()):
            age = now - a.last_seen
            if age > self.cfg.stale_seconds * FORGET_AFTER_STALE or a.msg.state == "stopped":
                del self._agents[pid]
                continue
            state = "stale" if age > self.cfg.stale_seconds else a.msg.state
            dev, uuid = min(a.uuids.items()) if a.uuids else (-1, "")
            out.append(
                AgentState(
                    pid=pid,
                    gpu=dev,
                    state=state,
                    detail=a.msg.detail,
                    role=a.msg.role,
                    uuid=uuid,
                    lib=a.msg.lib,
                    mode=a.msg.mode,
                    dropped_messages=a.msg.sent_dropped,
                )
            )
        return tuple(sorted(out, key=lambda s: s.pid))

    def close(self) -> None:
        """Close the socket and remove its file."""
        if self._transport is not None:
            self._transport.close()
            self._transport = None
            with contextlib.suppress(OSError):
                os.unlink(self.cfg.socket)


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
