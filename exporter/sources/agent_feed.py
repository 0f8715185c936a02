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
from exporter.snapshot.agent import AgentReading, AgentState, EngineSteps, GpuActivity
from exporter.sources.base import SourceUnavailable

MAX_PENDING_WINDOWS = 4096
FORGET_AFTER_STALE = 12  # forget an agent after this many stale periods


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
        self._steps: list[wire.Steps] = []
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
        self._steps.extend(msg.steps)
        if len(self._steps) > 10_000:
            del self._steps[:-10_000]

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

    def _merge_steps(self) -> tuple[EngineSteps, ...]:
        by_engine: dict[str, list[int]] = {}
        hists: dict[str, list[int]] = {}
        measured: dict[str, bool] = {}
        for s in self._steps:
            measured[s.engine] = measured.get(s.engine, False) or bool(s.measured)
            tot = by_engine.setdefault(s.engine, [0, 0, 0, 0, 0])
            tot[0] += s.n
            tot[1] += s.wall
            tot[2] += s.gpu
            tot[3] += s.tokens
            tot[4] += s.seqs
            h = hists.setdefault(s.engine, [0] * wire.STEP_BUCKET_COUNT)
            for i, c in enumerate(s.hist):
                h[i] += c
        self._steps.clear()
        return tuple(
            EngineSteps(
                engine=e,
                steps=t[0],
                wall_ns=t[1],
                gpu_busy_ns=t[2],
                step_hist=tuple(hists[e]),
                tokens=t[3],
                seqs=t[4],
                gpu_measured=measured[e],
            )
            for e, t in sorted(by_engine.items())
        )

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
