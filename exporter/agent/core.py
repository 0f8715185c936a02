"""The agent: CUPTI activity in, per-device windows out over a unix datagram socket, never blocking.

Threads: CUPTI's own thread calls the buffer callbacks (they copy the bytes and return the buffer:
tens of microseconds with the GIL); the agent's thread flushes every `flush_s` (ctypes, without the
GIL), decodes buffers with numpy, closes windows `lag_s` old and sends them. Nothing here ever
blocks the application's threads or raises into them.
"""

from __future__ import annotations

import collections
import ctypes
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from exporter import wire
from exporter.agent import hooks
from exporter.agent.cuptilib import (
    ATTRIBUTES,
    KIND_CONCURRENT_KERNEL,
    KIND_GRAPH_TRACE,
    KIND_MEMCPY,
    KIND_MEMSET,
    YIELD_S,
    BufferCompleted,
    BufferPool,
    BufferRequested,
    Library,
    api_version_text,
    cupti_python_version,
    decode,
    loaded_libcupti,
    parse_attributes,
    walk,
)
from exporter.agent.hooks import cuda_initialized, gpu_uuid
from exporter.agent.sender import Sender
from exporter.agent.settings import ENV, Settings, _env, _envf
from exporter.agent.steps import StepTracker

# The buffer callback wakes the agent's thread to decode early once the queue holds more than
# 1/EARLY_DRAIN_SHARE of max_queued_mib: at ~600k kernel records a second (a CUDA graph traced node
# by node) one 0.5 s tick's records filled the 64 MiB queue on the H200 (bench/README.md).
EARLY_DRAIN_SHARE = 4
EARLY_DRAIN_BUDGET_NS = 50_000_000

__all__ = [
    "ENV",
    "Agent",
    "Settings",
    "Stats",
    "_env",
    "_envf",
    "cuda_initialized",
    "gpu_uuid",
    "graph_trace_safe",
]


def graph_trace_safe() -> bool:
    """Return whether enabling GRAPH_TRACE now is safe: no graph can exist yet in this process.

    Enabling it after a capture and replaying that graph crashed on the H200. Before CUDA is
    initialised no graph exists. Later, the light hooks tell when they were installed before CUDA
    was initialised (none seen, or some); when they came too late, a heap scan for live
    torch.cuda.CUDAGraph objects (hooks.live_graphs) decides: none alive, none can be replayed.
    """
    if not cuda_initialized():
        return True
    seen = hooks.graphs_so_far()
    if seen != "unknown":
        return seen == "none"
    return hooks.live_graphs() == 0


@dataclass
class Stats:
    """What the agent counted about itself (for benchmarks and agent-check)."""

    buffers: int = 0
    records: int = 0
    incomplete: int = 0
    cupti_dropped: int = 0
    queue_dropped_bytes: int = 0
    foreign_buffers: int = 0
    callback_ns_max: int = 0
    callback_ns_total: int = 0
    decode_ns_total: int = 0
    decode_ns_max: int = 0
    flush_ns_max: int = 0
    loop_ns_max: int = 0
    messages_sent: int = 0
    messages_dropped: int = 0
    windows_sent: int = 0
    layout_checked: int = 0
    layout_mismatch: int = 0
    toggles: int = 0
    requests: int = 0
    null_bytes: int = 0
    reattaches: int = 0
    early_drains: int = 0  # decodes between ticks, the backlog past EARLY_DRAIN_SHARE of the cap
    cupti_walks: int = 0  # buffers whose records CUPTI walked (an unknown record kind was seen)
    unwalkable: int = 0  # buffers neither walk could read (dropped)
    delivery_lag_ns_max: int = 0  # the oldest record's age when its batch was decoded, at most
    queued_bytes_max: int = 0  # the decode backlog, at most
    per_kind: dict[str, int] = field(default_factory=dict)


def guard_kineto_teardown() -> str | None:
    """Keep torch.profiler (kineto) from finalizing CUPTI after a profiling session; return the
    value of TEARDOWN_CUPTI this replaced (None if it was unset or already 0).

    Graphs captured while GRAPH_TRACE is on hold CUPTI's instrumentation; once CUPTI is finalized,
    their next replay hits an illegal memory access (measured on the H200, CUDA 13.0). Kineto reads
    TEARDOWN_CUPTI when a session ends and keeps CUPTI alive when it is 0; torch sets the same
    variable for the same reason when torch.compile uses CUDA graphs. The profiler still works.
    """
    old = os.environ.get("TEARDOWN_CUPTI")
    if old == "0":
        return None
    os.environ["TEARDOWN_CUPTI"] = "0"
    return old


class Agent:
    """One process's CUPTI collector and sender."""

    def __init__(
        self, settings: Settings | None = None, steps: StepTracker | None = None, sender: Sender | None = None
    ) -> None:
        self.settings = settings or Settings.from_env()
        self.state = "stopped"
        self.detail = self.settings.rejected_detail()
        self.lib_text = ""
        self.mode = ""
        self.cupti_attributes: dict[str, int | None] = {}  # read back from CUPTI after start
        self.hw_trace = "off"
        self.stats = Stats()
        self.steps = steps or StepTracker()
        self.steps.lag_ns = 1_500_000_000  # steps wait for this process's windows to carry GPU time
        self.steps.per_step = True
        self.sender = sender or Sender(self.settings.socket)
        self.sent_log = self.sender.sent_log  # for benchmarks
        self.graphs = hooks.GraphReader()
        self._cupti: Any = None
        self._lib: Library | None = None
        self._pool: BufferPool | None = None
        self._queue: collections.deque[tuple[bytes, list[int] | None] | list[tuple[int, ...]]] = (
            collections.deque()
        )
        self._queued_bytes = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by the buffer callback when a decode backlog builds up
        self._thread: threading.Thread | None = None
        self._windows: dict[int, Any] = {}
        self._uuids: dict[int, str] = {}
        self._dropped_pending: dict[int, int] = {}
        self._enabled: list[int] = []
        self._graph_trace = False
        self._cb_req: Any = None
        self._cb_done: Any = None
        self._verify_left = 3
        self._lag_tick_ns = 0  # the oldest record's age at decode, this tick and recently (_hold_ns)
        self._lag_recent_ns = 0
        self._use_cupti_walk = False
        self._spans: list[list[int | None]] = []  # [since_ns, until_ns or None]: kernel records collected
        self._kernel_on = False
        self._sampling_active = False
        self._next_toggle_ns = 0
        self._last_send_ns = 0
        self._start_ns = 0
        self._paused = False
        self._last_rate = 0.0
        self._rate_known = False
        self._reattach_due: float | None = None
        self._ts_offset = 0
        self._base_kinds: list[int] = []
        self._liveness: list[Any] | None = None

    def _now(self) -> int:
        """Return CUPTI's time on the wall clock (CLOCK_REALTIME ns).

        Normally the two agree to microseconds. A profiler (kineto) may register its own CUPTI
        timestamp callback, after which records and cuptiGetTimestamp use its clock: the offset
        then moves every record back onto the wall clock, so windows stay aligned across processes.
        """
        assert self._lib is not None
        t = self._lib.timestamp()
        off = time.time_ns() - t
        self._ts_offset = off if abs(off) > 1_000_000 else 0
        return t + self._ts_offset

    def windows_sent(self) -> list[wire.Window]:
        """Return a copy of the windows sent so far (bounded log, for benchmarks and tests)."""
        for _ in range(10):
            try:
                return list(self.sent_log)
            except RuntimeError:  # appended to while copying
                time.sleep(0.001)
        return []

    # --- start and stop -----------------------------------------------------------------

    def start(self) -> str:
        """Start collecting; return the state ('running' or 'unavailable'), never raise."""
        if self.state == "running":
            return self.state
        hooks.install()  # the light hooks stay on in the deep mode
        if self.settings.cupti:
            self.mode = "cupti"  # "cupti:<decode>[+graph_trace]..." once CUPTI has started
            self._try_cupti()
        else:
            self.state, self.mode = "running", "steps"
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="boundwatch-agent", daemon=True)
        self._thread.start()
        return self.state

    def _try_cupti(self) -> None:
        try:
            self._start_cupti()
        except Exception as exc:  # CUPTI or cupti-python missing, another subscriber, bad lib
            self._disable_enabled()
            self.state = "unavailable"
            self.detail = f"{type(exc).__name__}: {exc}"[:400]
        else:
            self.state = "running"
            self.detail = self.settings.rejected_detail()

    def add_cupti(self) -> str:
        """Start CUPTI in an agent that so far only counted engine steps; return the state."""
        if self.mode == "steps":
            with self._lock:
                self.settings.cupti = True
                self._try_cupti()
        return self.state

    def _start_cupti(self) -> None:
        from cupti import cupti  # cupti-python; ImportError -> unavailable

        self._cupti = cupti
        cupti.get_timestamp()  # makes cupti-python load libcupti (reusing torch's copy if loaded)
        self._lib = Library.open()
        libs = loaded_libcupti()
        pyver = cupti_python_version()
        libver = api_version_text(self._lib.api_version)
        self.lib_text = f"libcupti {libver} ({self._lib.api_version}) {self._lib.path}; cupti-python {pyver}"
        if len(libs) > 1:
            self.lib_text += f"; WARNING {len(libs)} libcupti copies loaded"
        s = self.settings
        self._apply_attributes(parse_attributes(s.cupti_attrs))  # ValueError -> unavailable, with the reason
        want = {k.strip() for k in s.kinds.split(",")}
        if s.kernels == "off":
            want.discard("kernel")
        self._graph_trace = "graph" in want and (
            s.graph_trace == "on" or (s.graph_trace == "auto" and graph_trace_safe())
        )
        self._register()
        import exporter.agent.windows  # noqa: F401  (here, not on the agent's thread at its first buffer)

        if s.hw_trace == "on":
            try:
                cupti.activity_enable_hw_trace(1)  # before any context; Blackwell and later
                self.hw_trace = "on"
            except Exception as exc:  # refused (pre-Blackwell GPU, no counter permission): trace as usual
                self.hw_trace = f"refused: {type(exc).__name__}: {exc}"[:200]
        names = ((KIND_CONCURRENT_KERNEL, "kernel"), (KIND_MEMCPY, "memcpy"), (KIND_MEMSET, "memset"))
        self._base_kinds = [kind for kind, name in names if name in want]
        kinds = list(self._base_kinds)
        if self._graph_trace:
            kinds.insert(0, KIND_GRAPH_TRACE)  # before any graph is captured, or never
            replaced = guard_kineto_teardown()
            if replaced:
                self.lib_text += f"; TEARDOWN_CUPTI={replaced} set to 0 (graphs under GRAPH_TRACE)"
        for kind in kinds:
            cupti.activity_enable(kind)  # raises cuptiError when another subscriber holds CUPTI
            self._enabled.append(kind)
        self._start_ns = self._now()
        self._spans = [[self._start_ns, None]]
        self._kernel_on = True  # collecting (sampling may switch it off)
        self.mode = "cupti:" + s.decode + ("+graph_trace" if self._graph_trace else "")
        if KIND_CONCURRENT_KERNEL not in self._base_kinds:
            self.mode += "+no_kernels"  # busy time then misses eager kernels
        if self.hw_trace == "on":
            self.mode += "+hw_trace"

    def _apply_attributes(self, wanted: dict[str, int]) -> None:
        """Set the CUPTI activity attributes asked for, then read all of them back."""
        assert self._lib is not None
        members = self._cupti.ActivityAttribute.__members__
        for name, value in wanted.items():
            if "ATTR_" + name not in members:
                raise ValueError(f"this CUPTI has no activity attribute {name}")
            status = self._lib.set_attribute(int(members["ATTR_" + name]), name, value)
            if status != 0:
                raise RuntimeError(f"cuptiActivitySetAttribute({name}={value}) returned {status}")
        self.cupti_attributes = {
            name: self._lib.attribute(int(members["ATTR_" + name]), name)
            for name in ATTRIBUTES
            if "ATTR_" + name in members
        }

    def _register(self) -> None:
        s = self.settings
        if s.decode == "objects":
            self._cupti.activity_register_callbacks(self._objects_requested, self._objects_completed)
            return
        assert self._lib is not None
        if self._pool is None:
            self._pool = BufferPool(s.buffer_kib * 1024, s.max_buffers)
        if self._cb_req is None:
            self._cb_req = BufferRequested(self._raw_requested)
            self._cb_done = BufferCompleted(self._raw_completed)
        status = self._lib.handle.cuptiActivityRegisterCallbacks(self._cb_req, self._cb_done)
        if status != 0:
            raise RuntimeError(f"cuptiActivityRegisterCallbacks returned {status}")

    def _disable_enabled(self) -> None:
        for kind in self._enabled:
            try:
                self._cupti.activity_disable(kind)
            except Exception:
                pass
        self._enabled.clear()

    def stop(self) -> None:
        """Flush what is left, send it and disable the activity kinds; safe to call twice.

        CUPTI itself stays attached until the process exits (no cuptiFinalize): on the H200,
        replaying a graph captured under GRAPH_TRACE after a finalize hit an illegal memory access,
        and finalizing while another thread launched work failed the next launch
        (bench/README.md, "Finalizing CUPTI").
        """
        if self._thread is None:
            return
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5.0)
        self._thread = None
        if self.state == "running" and self._lib is not None:
            try:
                self._lib.flush(forced=True)
                self._drain(budget_ns=None)
                now = self._now()
                self._send(self._close_windows(now + int(self.settings.lag_s * 1e9)), force=True, final=True)
            except Exception:
                pass
        self._disable_enabled()
        self.state = "stopped"
        self._send([], force=True, final=True)
        self.sender.close()

    # --- takeover by torch.profiler ---------------------------------------------------------

    def yield_cupti(self, why: str) -> None:
        """Give CUPTI to another client (torch.profiler): flush ours back, stop reporting windows."""
        if self.state != "running" or self._lib is None:
            return
        with self._lock:
            self._paused = True
            try:
                self._lib.flush()
            except Exception:
                pass
            self.state = "preempted"
            self.detail = why
            self._close_span(self._now())

    def reattach(self) -> None:
        """Schedule taking CUPTI back now the other client is done (the agent's thread does it)."""
        if self.state != "preempted" or self._lib is None:
            return
        # kineto may finalize CUPTI at the next CUDA call after the profiler stops, which wipes a
        # registration made before it: re-register shortly after, and again while nothing arrives.
        self._reattach_due = time.monotonic() + 0.3
        self._liveness = None

    def _register_and_enable(self) -> bool:
        try:
            self._register()
            kinds = list(self._base_kinds) if self._kernel_on or self.state == "preempted" else []
            for kind in kinds:  # never GRAPH_TRACE: graphs captured without it would crash on replay
                self._cupti.activity_enable(kind)
        except Exception as exc:
            self.detail = f"re-attach failed: {type(exc).__name__}: {exc}"[:400]
            return False
        self.stats.reattaches += 1
        return True

    def _maybe_reattach(self) -> None:
        """Run with the lock held on the agent's thread: re-attach when due, check that records flow."""
        assert self._lib is not None
        mono = time.monotonic()
        if self.state == "preempted" and self._reattach_due is not None and mono >= self._reattach_due:
            if self._pool is not None:
                self._pool.forget_outstanding()
            if self._register_and_enable():
                self._reattach_due = None
                self._open_span(self._now())
                self.state, self.detail, self._paused = "running", "", False
                self._liveness = [mono + 1.0, self.stats.requests, 1]
            else:
                self._reattach_due = mono + 2.0
        elif self.state == "running" and self._liveness is not None and mono >= self._liveness[0]:
            _, requests, tries = self._liveness
            if self.stats.requests == requests:  # nothing asked for a buffer: maybe finalized under us
                self._register_and_enable()
            self._liveness = [mono + 2.0**tries, self.stats.requests, tries + 1] if tries < 5 else None

    # --- CUPTI callbacks (CUPTI's thread) ------------------------------------------------------

    def _raw_requested(self, buf: Any, size: Any, max_records: Any) -> None:
        self.stats.requests += 1
        pool = self._pool
        ptr = pool.take() if pool is not None else 0
        buf[0] = ptr or None
        size[0] = pool.size if ptr and pool is not None else 0
        max_records[0] = 0

    def _raw_completed(self, ctx: int | None, stream: int, ptr: int | None, size: int, valid: int) -> None:
        t = time.perf_counter_ns()
        try:
            if not ptr or self._pool is None or ptr not in self._pool.outstanding:
                self.stats.foreign_buffers += 1
                return
            try:
                if valid and self.settings.decode == "null":
                    self.stats.null_bytes += valid
                elif valid:
                    data = ctypes.string_at(ptr, valid)
                    offsets = None
                    if self._use_cupti_walk or self._verify_left > 0:
                        assert self._lib is not None
                        offsets = self._lib.record_offsets(ptr, valid)
                    self._enqueue((data, offsets), valid)
                if self._lib is not None:
                    dropped = self._lib.dropped(ctx, stream)
                    if dropped:
                        self.stats.cupti_dropped += dropped
                        self._dropped_pending[-1] = self._dropped_pending.get(-1, 0) + dropped
            finally:
                self._pool.give(ptr)
        except Exception:
            pass
        finally:
            self._count_callback(time.perf_counter_ns() - t)

    def _count_callback(self, dt: int) -> None:
        """Add one buffer callback's time to the stats (its total and its longest)."""
        self.stats.callback_ns_total += dt
        self.stats.callback_ns_max = max(self.stats.callback_ns_max, dt)

    def _objects_requested(self) -> tuple[int, int]:
        return self.settings.buffer_kib * 1024, 0

    def _objects_completed(self, activities: list[Any]) -> None:
        t = time.perf_counter_ns()
        rows: list[tuple[int, ...]] = []
        try:
            for r in activities:
                kind = int(r.kind)
                if kind == KIND_GRAPH_TRACE:
                    dev = r.device_id if r.device_id != 0x7FFFFFFF else r.end_device_id
                    rows.append((3, dev, r.start, r.end))
                elif kind == KIND_CONCURRENT_KERNEL:
                    rows.append((4 if r.graph_id else 0, r.device_id, r.start, r.end))
                elif kind in (KIND_MEMCPY, KIND_MEMSET):
                    rows.append((1 if kind == KIND_MEMCPY else 2, r.device_id, r.start, r.end))
            self._enqueue(rows, 32 * len(rows))
        except Exception:
            pass
        finally:
            self._count_callback(time.perf_counter_ns() - t)

    def _enqueue(self, item: Any, nbytes: int) -> None:
        if self._paused:
            return
        limit = self.settings.max_queued_mib * 1024 * 1024
        if self._queued_bytes + nbytes > limit:
            self.stats.queue_dropped_bytes += nbytes
            self._dropped_pending[-1] = self._dropped_pending.get(-1, 0) + max(1, nbytes // 216)
            return
        self._queued_bytes += nbytes
        self._queue.append(item)
        if self._queued_bytes > self.stats.queued_bytes_max:
            self.stats.queued_bytes_max = self._queued_bytes
        if self._queued_bytes * EARLY_DRAIN_SHARE > limit and not self._wake.is_set():
            self._wake.set()  # decode now rather than drop at the cap before the next tick

    # --- the agent's thread -------------------------------------------------------------------

    def _loop(self) -> None:
        """Tick every flush_s (a period from the last tick's start, not its end); between ticks,
        decode early when the buffer callback says a backlog is building up."""
        period = self.settings.flush_s
        next_tick = time.monotonic() + period
        while not self._stop.is_set():
            self._wake.wait(max(0.0, next_tick - time.monotonic()))
            if self._stop.is_set():
                return
            self._wake.clear()
            t = time.perf_counter_ns()
            try:
                now = time.monotonic()
                if now >= next_tick:
                    next_tick = max(next_tick + period, now + period / 4)  # never a burst of ticks
                    self._tick()
                else:
                    self._drain_early()
            except Exception as exc:  # never let the thread die silently
                self.detail = f"agent loop: {type(exc).__name__}: {exc}"[:400]
            self.stats.loop_ns_max = max(self.stats.loop_ns_max, time.perf_counter_ns() - t)

    def _drain_early(self) -> None:
        """Decode part of the backlog between ticks (no flush, no windows closed)."""
        with self._lock:
            if self.state == "running" and self._lib is not None and not self._paused and self._enabled:
                self.stats.early_drains += 1
                self._drain(budget_ns=EARLY_DRAIN_BUDGET_NS)

    def _tick(self) -> None:
        with self._lock:
            if self._lib is not None and (self._reattach_due is not None or self._liveness is not None):
                self._maybe_reattach()
            if self.state == "running" and self._lib is not None and not self._paused and self._enabled:
                t = time.perf_counter_ns()
                self._lib.flush()
                self.stats.flush_ns_max = max(self.stats.flush_ns_max, time.perf_counter_ns() - t)
                self._drain(budget_ns=100_000_000)
                now = self._now()
                self._sample(now)
                windows = self._close_windows(now - self._hold_ns())
            else:
                windows = []
        self._send(windows)

    def _hold_ns(self) -> int:
        """Return how much longer than lag_s windows wait this tick (0 up to lag_max_s - lag_s).

        A window closes once the records that fall in it have arrived: where records arrive older
        than lag_s (CUPTI's own delivery, or decoding behind at hundreds of thousands of kernel
        records a second), windows wait up to lag_max_s instead of counting them late. The
        records' age is the recent maximum, decaying by a fifth a tick. (Holding windows whenever
        a backlog was queued made closing them dearer and the backlog longer: on the H200 the
        queue then reached its cap and dropped records; bench/README.md.)
        """
        s = self.settings
        recent = self._lag_recent_ns
        self._lag_recent_ns = max(self._lag_tick_ns, int(recent * 0.8))
        self._lag_tick_ns = 0
        lag_ns, lag_max_ns = int(s.lag_s * 1e9), int(max(s.lag_s, s.lag_max_s) * 1e9)
        want = self._lag_recent_ns + self._lag_recent_ns // 4 + int(s.window_s * 1e9) // 4
        return min(lag_max_ns, max(lag_ns, want)) - lag_ns

    def _drain(self, budget_ns: int | None) -> None:
        """Decode queued buffers in batches of up to `batch_mib`, handing the GIL over between them."""
        t_slice = time.perf_counter_ns()
        while self._queue:
            self._drain_batch()
            time.sleep(YIELD_S)  # let the application thread take the GIL between batches
            if budget_ns is not None and time.perf_counter_ns() - t_slice > budget_ns:
                break

    def _drain_batch(self) -> None:
        import numpy as np

        t = time.perf_counter_ns()
        bufs: list[bytes] = []
        offs: list[Any] = []
        rows: list[tuple[int, ...]] = []
        size = 0
        limit = self.settings.batch_mib * 1024 * 1024
        while self._queue and (size == 0 or size + self._item_bytes(self._queue[0]) <= limit):
            item = self._queue.popleft()
            self.stats.buffers += 1
            if isinstance(item, list):
                self._queued_bytes -= 32 * len(item)
                rows.extend(item)
                size += 32 * len(item)
                continue
            data, cupti_offsets = item
            self._queued_bytes -= len(data)
            offsets: Any
            if self._use_cupti_walk and cupti_offsets is not None:
                offsets = np.asarray(cupti_offsets, dtype=np.int64)
                self.stats.cupti_walks += 1
            else:  # queued before CUPTI was asked to walk: ours may still read it
                offsets = walk(data)
            if cupti_offsets is not None and self._verify_left > 0:
                self._verify_left -= 1
                self.stats.layout_checked += 1
                if offsets is None or offsets.tolist() != cupti_offsets:
                    self.stats.layout_mismatch += 1
                    self._use_cupti_walk = True
                    offsets = np.asarray(cupti_offsets, dtype=np.int64)
            if offsets is None:
                self._use_cupti_walk = True  # unknown record kind: let CUPTI walk from now on
                self.stats.unwalkable += 1
                continue
            offs.append(offsets + size)
            bufs.append(data)
            size += len(data)
        parts = []
        if bufs:
            time.sleep(YIELD_S)  # hand the GIL over between walking, decoding and windowing
            d = decode(bufs[0] if len(bufs) == 1 else b"".join(bufs), np.concatenate(offs))
            self.stats.incomplete += d.incomplete
            parts.append((d.code, d.dev, d.start, d.end))
            time.sleep(YIELD_S)
        if rows:
            arr = np.asarray(rows, dtype=np.int64)
            code, dev, start, end = arr[:, 0].astype(np.int8), arr[:, 1], arr[:, 2], arr[:, 3]
            ok = (start > 0) & (end >= start)
            self.stats.incomplete += int((~ok).sum())
            parts.append((code[ok], dev[ok], start[ok], end[ok]))
        for code, dev, start, end in parts:
            self._add(code, dev, start, end)
        dt = time.perf_counter_ns() - t
        self.stats.decode_ns_total += dt
        self.stats.decode_ns_max = max(self.stats.decode_ns_max, dt)

    @staticmethod
    def _item_bytes(item: Any) -> int:
        return 32 * len(item) if isinstance(item, list) else len(item[0])

    def _add(self, code: Any, dev: Any, start: Any, end: Any) -> None:
        import numpy as np

        from exporter.agent.windows import DeviceWindows

        if not code.size:
            return
        if self._ts_offset:
            start = start + self._ts_offset
            end = end + self._ts_offset
        trim = self.settings.kernel_trim_ns
        if trim:  # eager kernels only: graph nodes carry no such excess (bench/agent_graph_truth.py)
            end = np.where(code == 0, np.maximum(start, end - trim), end)
        self.stats.records += int(code.size)
        lag = time.time_ns() - int(end.min())  # CLOCK_REALTIME, as the windows close by
        if lag > self._lag_tick_ns:
            self._lag_tick_ns = lag
        if lag > self.stats.delivery_lag_ns_max:
            self.stats.delivery_lag_ns_max = lag
        first = int(dev[0])
        devs = [first] if bool((dev == first).all()) else np.unique(dev).tolist()
        for dv in devs:
            w = self._windows.get(dv)
            if w is None:
                w = DeviceWindows(
                    window_ns=int(self.settings.window_s * 1e9),
                    lag_ns=int(self.settings.lag_s * 1e9),
                    start_ns=self._start_ns,
                )
                self._windows[dv] = w
                if dv not in self._uuids:  # run_offline may have named it
                    self._uuids[dv] = gpu_uuid(int(dv))
            if len(devs) == 1:
                w.add(start, end, code)
            else:
                m = dev == dv
                w.add(start[m], end[m], code[m])

    def _close_span(self, now: int) -> None:
        if self._spans and self._spans[-1][1] is None:
            self._spans[-1][1] = now
        self._kernel_on = False

    def _open_span(self, now: int) -> None:
        self._spans.append([now, None])
        self._kernel_on = True
        for w in self._windows.values():
            w.forget_gap()  # a gap across an unobserved stretch is not a gap we saw

    def _covered(self, t0: int, t1: int) -> bool:
        for since, until in self._spans:
            assert since is not None
            if since <= t0 and (until is None or until >= t1):
                return True
        return False

    def _sampled_kinds(self) -> list[int]:
        if self.settings.sample_kinds == "all" and not self._graph_trace:
            return list(self._base_kinds)  # GRAPH_TRACE is never switched: re-enabling it crashes replays
        return [k for k in self._base_kinds if k == KIND_CONCURRENT_KERNEL]

    def _sample(self, now: int) -> None:
        """Duty-cycle records when the eager kernel rate is high (GRAPH_TRACE, if on, keeps graphs)."""
        s = self.settings
        kinds = self._sampled_kinds()
        if s.sampling == "off" or self._cupti is None or not kinds:
            return
        if not self._sampling_active:
            if s.sampling == "on" or self._eager_rate() > s.sample_above:
                self._sampling_active = True
                self._next_toggle_ns = now
            else:
                return
        if now < self._next_toggle_ns:
            return
        try:
            if self._kernel_on:
                for kind in kinds:
                    self._cupti.activity_disable(kind)
                self._close_span(now)
                self._next_toggle_ns = now + int((s.sample_period_s - s.sample_on_s) * 1e9)
            else:
                if s.sampling == "auto" and self._last_rate < s.sample_above / 2 and self._rate_known:
                    self._sampling_active = False
                for kind in kinds:
                    self._cupti.activity_enable(kind)
                self._open_span(now)
                self._rate_known = False
                # stay on long enough that whole windows (plus the lag) are covered
                self._next_toggle_ns = now + int((s.sample_on_s + s.window_s) * 1e9)
            self.stats.toggles += 1
            del self._spans[:-16]
        except Exception as exc:
            self.detail = f"sampling: {exc}"[:400]

    def _eager_rate(self) -> float:
        return self._last_rate

    def _close_windows(self, now: int) -> list[wire.Window]:
        out: list[wire.Window] = []
        dropped_all = self._dropped_pending.pop(-1, 0)
        for dv, w in sorted(self._windows.items()):
            while True:  # one window at a time, handing the GIL over between them
                closed = w.close(now, max_windows=1)
                if not closed:
                    break
                summ = closed[0]
                time.sleep(YIELD_S)
                self.steps.attach_gpu(summ, dv)
                if not self._covered(summ.t0, summ.t1):
                    continue
                kernels = summ.count("kernel")
                span_s = (summ.t1 - summ.t0) / 1e9
                self._last_rate = kernels / span_s if span_s else 0.0
                self._rate_known = True
                extra = dropped_all + w.dropped
                dropped_all, w.dropped = 0, 0
                out.append(
                    wire.Window(
                        dev=int(dv),
                        t0=summ.t0,
                        t1=summ.t1,
                        busy=summ.busy_ns,
                        graph_busy=summ.graph_busy_ns,
                        kernels=kernels,
                        memcpys=summ.count("memcpy"),
                        memsets=summ.count("memset"),
                        graphs=summ.count("graph"),
                        dropped=summ.late + extra,
                        gaps=summ.gap_counts,
                        gap_sum=summ.gap_sum_ns,
                        iv=summ.iv,
                        slack=summ.slack_ns,
                    )
                )
        if dropped_all:
            self._dropped_pending[-1] = dropped_all
        return out

    # --- offline: buffers from elsewhere (tests, recorded buffers), no CUPTI --------------------

    def run_offline(
        self,
        start_ns: int,
        spans: list[tuple[int, int | None]] | None = None,
        uuids: dict[int, str] | None = None,
    ) -> None:
        """Take records from feed_raw / feed_rows instead of CUPTI, as if collecting since start_ns.

        spans: when kernel records were collected ([since, until or None]; default since start_ns);
        uuids: CUDA device ordinal -> GPU UUID, instead of asking NVML.
        """
        self.state = "running"
        self._start_ns = start_ns
        self._spans = [[since, until] for since, until in (spans or [(start_ns, None)])]
        self._uuids.update(uuids or {})

    def feed_raw(self, *bufs: bytes) -> None:
        """Decode raw activity buffers as CUPTI would have completed them (queued together, then drained)."""
        for buf in bufs:
            self._enqueue((buf, None), len(buf))
        self._drain(budget_ns=None)

    def feed_rows(self, rows: list[tuple[int, ...]]) -> None:
        """Take records as cupti-python's objects mode turns them into rows: (code, device, start, end)."""
        self._enqueue(rows, 32 * len(rows))
        self._drain(budget_ns=None)

    def close_windows(self, now_ns: int, hold: bool = False) -> list[wire.Window]:
        """Return the windows that closed by now_ns (their steps' GPU time attached); hold: as a tick
        does, waiting longer for records that arrive late (_hold_ns)."""
        return self._close_windows(now_ns - (self._hold_ns() if hold else 0))

    def send_windows(self, windows: list[wire.Window]) -> None:
        """Send windows (and the steps ready) now, as the agent's tick does."""
        self._send(windows, force=True)

    # --- sending ---------------------------------------------------------------------------

    def _send(self, windows: list[wire.Window], force: bool = False, final: bool = False) -> None:
        now = time.monotonic_ns()
        steps = self.steps.take(final=final)
        if not windows and not steps and not force and now - self._last_send_ns < 1_000_000_000:
            return  # heartbeat once a second when there is nothing else
        self._last_send_ns = now
        devices = tuple(sorted(self._uuids.items()))
        # at most two windows per datagram keeps each message small (wire.MAX_DATAGRAM_BYTES)
        batches: list[list[wire.Window]] = [[]]
        for w in windows:
            if len(batches[-1]) >= 2:
                batches.append([])
            batches[-1].append(w)
        graphs = self._graph_counts()
        for i, batch in enumerate(batches):
            msg = wire.Message(
                pid=os.getpid(),
                state=self.state,
                seq=self.sender.next_seq(),
                role=self.settings.role,
                detail=self.detail,
                lib=self.lib_text,
                mode=self.mode + ("+sampling" if self._sampling_active else ""),
                devices=devices,
                windows=tuple(batch),
                steps=tuple(steps) if i == 0 else (),
                sent_dropped=self.stats.messages_dropped,
                settings_rejected=len(self.settings.rejected),
                graphs=graphs if i == 0 else None,
            )
            self._send_one(msg)

    def _graph_counts(self) -> wire.GraphCounts | None:
        win = self.graphs.take()
        if win is None:
            return None
        dev = hooks.device()
        uuid = self._uuids.get(dev, "") or self.graphs.uuid(dev)
        return wire.GraphCounts(
            t0=win.t0, t1=win.t1, replays=win.replays, captures=win.captures, dev=dev, uuid=uuid
        )

    def _send_one(self, msg: wire.Message) -> None:
        if self.sender.send(msg):
            self.stats.messages_sent += 1
            self.stats.windows_sent += len(msg.windows)
        else:
            self.stats.messages_dropped += 1
