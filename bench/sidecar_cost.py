"""The sidecar's own cost: CPU and RSS of the real daemon at 1, 8 and 64 GPUs, and its scrapes beside node_exporter.

Everything runs in a PID namespace of its own (re-executed under `unshare --pid --fork --mount-proc`),
so discovery sees only the bench's processes:
- an engine: a process started as `vllm serve --port P` serving a real-size vLLM page (815 lines,
  bench/results/engine_sample_page.prom) whose counters move every 0.5 s, with 4 children titled
  `VLLM::APIServer_<i>`, 8 threads each, one of them using ~30% of a core;
- the agents, by `--agent` (what a GPU's agent sends each 0.5 s over the real wire to the daemon's socket):
  `windows` (the default, as since session 3): one stand-in process sends every GPU's CUPTI windows
  (100 intervals each) under made-up pids that are no engine's, and no engine core reports steps, so
  the engine's page is read every tick and the engine is placed on no GPU; `light` (the agent's
  default mode, as where vLLM loads the plugin with tensor parallelism over the N GPUs): a
  `VLLM::EngineCore` child of the engine reports its steps and scheduler counts (so the page is
  read every `engine.slow_read_seconds`), and per GPU a `VLLM::Worker_TP<i>` child sends its steps'
  CUDA graph mode and replays (the engine is placed on its workers' GPUs); `cupti`: the same, each
  worker's messages with its GPU's CUPTI windows too; `none`: no agent at all;
- the daemon itself (`serve()` with every source; NVML is the tests' driver stand-in with N GPUs,
  since this machine has none).
The daemon's utime+stime and VmRSS are read from /proc over `--seconds`, one GPU count at a time.
Then `--scrapes` scrapes of its /metrics alternate with the same number of Debian's
prometheus-node-exporter (when installed), with `Accept-Encoding: gzip`: CPU per scrape from each
process's /proc times, latency, bytes on the wire and series per page.

    python3 bench/sidecar_cost.py --gpus 1,8,64 --seconds 120 --out bench/results/sidecar_cost.json

`--ab DIR` runs, beside this tree's daemon and at the same time, a second daemon from the tree at
DIR (an unpacked older commit), each with its own agent stand-in and socket, both reading the same
engine: the two CPU figures share the machine's load, so their ratio holds where single timings
on a shared machine do not. `--pairs N` repeats each GPU count N times.

Switches for the daemon part (environment): `BW_COST_STATS=PATH` (per-thread and per-part CPU, see
bench/cost_stats.py), `BW_COST_CAPTURE=PATH` (40 ticks' pipeline inputs), `BW_COST_PROFILE=PATH`
(yappi, or cProfile of the event loop with a `.cprof` suffix), `BW_COST_TRACEMALLOC=PATH` (every 30 s
the source lines holding most memory, to PATH.<gpus>), `BW_COST_DUMP=PATH` (the daemon's last /metrics
page, to PATH.<agent>.<gpus>). For the agents (`--agent light`, `cupti`): `BW_AGENT_ALIGN=1` has every
stand-in agent send at the same instant of each tick (a burst, the socket queue's worst case); each
result says what the agents sent each daemon and how much of it a real agent would have dropped
(`agent_sends`, `agent_sends_would_drop`).
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
PAGE = os.path.join(ROOT, "bench", "results", "engine_sample_page.prom")
TICK = 0.5
WINDOW_NS = 500_000_000  # the agent's window (BOUNDWATCH_AGENT_WINDOW_S)
LAG_NS = 1_000_000_000  # a window is closed this long after its end (BOUNDWATCH_AGENT_LAG_S)
MAX_CATCH_UP = 20  # windows sent at most per GPU and loop after a stall; older ones are skipped
CLK = os.sysconf("SC_CLK_TCK")

API_SERVER = r"""
import ctypes, sys, threading, time
i = sys.argv[1]
ctypes.CDLL(None).prctl(15, ("VLLM::APIServer_" + i).encode(), 0, 0, 0)
for k in range(7):
    threading.Thread(target=lambda: time.sleep(1e6), name=f"worker{k}", daemon=True).start()
busy = 0.3 if i == "0" else 0.02
while True:
    t = time.perf_counter()
    while time.perf_counter() - t < busy * 0.05:
        pass
    time.sleep((1 - busy) * 0.05)
"""


def cpu_seconds(pid: int) -> float:
    """Return a process's utime + stime, s (in clock ticks: 1/CLK s steps)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def user_system(pid: int) -> tuple[float, float]:
    """Return a process's utime and stime apart, s (1/CLK s steps): how much of its CPU is the kernel's."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLK, int(fields[12]) / CLK


def run_seconds(pid: int) -> float:
    """Return a long-lived process's time on CPU, s: its threads' schedstat (ns), else `cpu_seconds`.

    The daemon's threads live as long as it does, so the sum over its tasks is its CPU at ns
    resolution, where utime + stime move in 10 ms steps (2.5% of a 1%-of-a-core figure over 40 s).
    Not for a process whose threads come and go (node_exporter's): an ended thread's time is gone.
    """
    try:
        total = 0
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        return total / 1e9
    except (OSError, ValueError, IndexError):
        return cpu_seconds(pid)


def thread_wakes(pid: int) -> dict[str, list[int]]:
    """Return each thread's [voluntary, involuntary] context switches so far, by name (`comm`), summed per name."""
    out: dict[str, list[int]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                got = {
                    k: int(v)
                    for k, _, v in (line.partition(":") for line in f)
                    if k in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")
                }
        except (OSError, ValueError):
            continue
        row = out.setdefault(name, [0, 0])
        row[0] += got.get("voluntary_ctxt_switches", 0)
        row[1] += got.get("nonvoluntary_ctxt_switches", 0)
    return out


def wakes_per_tick(before: dict[str, list[int]], after: dict[str, list[int]], ticks: float) -> dict[str, Any]:
    """Return each thread's context switches a tick between two `thread_wakes` (voluntary: it slept or waited)."""
    if ticks <= 0:
        return {}
    rows = {
        name: [
            round((a[0] - before.get(name, [0, 0])[0]) / ticks, 2),
            round((a[1] - before.get(name, [0, 0])[1]) / ticks, 2),
        ]
        for name, a in sorted(after.items())
    }
    return {"voluntary_involuntary_by_thread": rows, "total": round(sum(sum(r) for r in rows.values()), 2)}


def rss_bytes(pid: int) -> int:
    """Return a process's resident set, bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- the parts, each run as `sidecar_cost.py --part NAME` ------------------------------------


def part_engine(port: int) -> None:
    """Serve a changing real-size vLLM page and keep 4 titled API-server children."""
    import http.server

    base = open(PAGE).read().splitlines()
    state = {"page": b"", "n": 0}

    def refresh() -> None:
        while True:
            n = state["n"] = state["n"] + 1
            out = []
            for line in base:
                if line.startswith("#") or ("_total" not in line.split("{")[0] and "_count" not in line):
                    out.append(line)
                    continue
                name, _, value = line.rpartition(" ")
                try:
                    out.append(f"{name} {float(value) + n}")
                except ValueError:
                    out.append(line)
            state["page"] = ("\n".join(out) + "\n").encode()
            time.sleep(TICK)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as vLLM's uvicorn: one connection for every read

        def do_GET(self) -> None:
            page = state["page"]
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *a: object) -> None:
            pass

    threading.Thread(target=refresh, daemon=True).start()
    time.sleep(0.2)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kids = [
        subprocess.Popen([f"VLLM::APIServer_{i}", "-c", API_SERVER, str(i)], executable=os.environ["BW_PY"])
        for i in range(4)
    ]
    socks = [p for p in os.environ.get("BW_AGENT_SOCKS", "").split(",") if p]
    mode = os.environ.get("BW_AGENT_MODE", "windows")
    if socks and mode in ("cupti", "light"):  # the agents inside vLLM's engine core and its workers
        me = os.path.abspath(__file__)
        core = subprocess.Popen(
            ["VLLM::EngineCore", me, "--part", "core", "--sock", ",".join(socks)],
            executable=os.environ["BW_PY"],
        )
        kids.append(core)
        worker = [
            me,
            "--part",
            "worker",
            "--sock",
            ",".join(socks),
            "--port",
            str(core.pid),
        ]  # owner: the core
        kids += [
            subprocess.Popen(
                [f"VLLM::Worker_TP{g}", *worker, "--gpus", str(g)], executable=os.environ["BW_PY"]
            )
            for g in range(int(os.environ["BW_AGENT_GPUS"]))
        ]
    # SIGTERM (stop_parts) must stop the children too: orphans would stay in the namespace under
    # pid 1 and the next GPU count's daemon would find them as engines of their own
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        sys.stdin.read()
    finally:
        for k in kids:
            k.kill()


AGENT_MODES = ("windows", "cupti", "light", "none")


def _title(title: str) -> None:
    """Name this process as vLLM's setproctitle does (its comm; argv[0] is the title already)."""
    import ctypes

    ctypes.CDLL(None).prctl(15, title.encode()[:15], 0, 0, 0)


def uuid_of(i: int) -> str:
    return f"GPU-00000000-0000-0000-0000-{i:012d}"


def agent_windows(next_t0: int, now: int) -> tuple[list[tuple[int, int]], int]:
    """Return the aligned windows due by `now` from `next_t0` on, as the agent closes them, and the next t0.

    As exporter.agent.windows.DeviceWindows: windows lie on the absolute 0.5 s grid, are closed
    `LAG_NS` after their end, and follow each other without gap or overlap (t0 of one = t1 of the
    previous). After a stall longer than MAX_CATCH_UP windows the oldest are skipped, never resent.
    """
    due = (now - LAG_NS - next_t0) // WINDOW_NS
    if due > MAX_CATCH_UP:
        next_t0 += (due - MAX_CATCH_UP) * WINDOW_NS
        due = MAX_CATCH_UP
    out = [(next_t0 + k * WINDOW_NS, next_t0 + (k + 1) * WINDOW_NS) for k in range(max(0, due))]
    return out, next_t0 + max(0, due) * WINDOW_NS


def cupti_window(t0: int, t1: int) -> Any:
    """Return one GPU's closed CUPTI window as the agent sends it: 100 busy intervals, 80% busy."""
    from exporter import wire

    iv = wire.pack_intervals([(t0 + k * 5_000_000, t0 + k * 5_000_000 + 4_000_000) for k in range(100)], t0)
    return wire.Window(dev=0, t0=t0, t1=t1, busy=400_000_000, kernels=8000, graphs=100, iv=iv[0])


def part_agent(sock_path: str, gpus: int, count_path: str = "") -> None:
    """Send every GPU's windows over the real wire as N worker processes' agents would, one GPU each.

    Each stand-in agent (its own pid and sequence) closes aligned, consecutive 0.5 s windows once
    they are 1 s old and sends at most two windows per datagram, as exporter.agent.core does.
    Every 5 s the datagrams and windows sent so far are written to `count_path`, if given.
    """
    from exporter import wire

    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    start = time.time_ns() - LAG_NS
    next_t0 = [start - start % WINDOW_NS] * gpus
    seq = [0] * gpus
    sent = {"datagrams": 0, "windows": 0, "send_errors": 0}
    counted_at = 0.0
    while True:
        now = time.time_ns()
        for g in range(gpus):
            due, next_t0[g] = agent_windows(next_t0[g], now)
            windows = [cupti_window(t0, t1) for t0, t1 in due]
            for i in range(0, len(windows), 2):
                seq[g] += 1
                msg = wire.Message(
                    pid=10_000 + g,
                    state="running",
                    seq=seq[g],
                    role="vllm_worker",
                    devices=((0, uuid_of(g)),),
                    windows=tuple(windows[i : i + 2]),
                )
                try:
                    s.sendto(wire.encode(msg), sock_path)
                    sent["datagrams"] += 1
                    sent["windows"] += len(msg.windows)
                except OSError:
                    sent["send_errors"] += 1
        if count_path and time.monotonic() - counted_at >= 5.0:
            counted_at = time.monotonic()
            with open(count_path + ".tmp", "w") as f:
                json.dump(sent, f)
            os.replace(count_path + ".tmp", count_path)
        time.sleep(TICK)


def _agent_sleep() -> None:
    """Wait one tick: each stand-in agent on its own clock, or with BW_AGENT_ALIGN=1 all at once.

    Aligned (every agent sends at the same instant of each 0.5 s, as tensor-parallel workers that step
    in lockstep and started together could): the daemon's socket queue then takes every GPU's
    datagram in one burst, the case where agents drop first.
    """
    if os.environ.get("BW_AGENT_ALIGN") == "1":
        time.sleep(TICK - time.time() % TICK)
    else:
        time.sleep(TICK)


def _sender(socks: str) -> Any:
    """Return a function that sends one datagram to each of the daemons' sockets (missing ones skipped).

    First without blocking, as the real agent sends; where a daemon's queue is full (the agent would
    have dropped the message) that is counted and the stand-in then waits and sends it anyway. So
    every message reaches the daemon (its measured work is an upper bound) and the drops a real
    agent would have had are counted: every 5 s, per socket, in `sends.<pid>.json` beside the
    sockets (`sent_counts`).
    """
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.setblocking(False)
    paths = socks.split(",")
    counts = {path: [0, 0] for path in paths}  # sent, of which the agent would have dropped
    out = os.path.join(os.path.dirname(paths[0]), f"sends.{os.getpid()}.json")
    written = [time.monotonic()]

    def send(data: bytes) -> None:
        for path in paths:
            try:
                s.sendto(data, path)
            except BlockingIOError:  # the daemon's queue is full: a real agent drops here
                counts[path][1] += 1
                s.setblocking(True)
                try:
                    s.sendto(data, path)
                except OSError:
                    continue
                finally:
                    s.setblocking(False)
            except OSError:
                continue  # that daemon not listening yet (or gone)
            counts[path][0] += 1
        if time.monotonic() - written[0] >= 5.0:
            written[0] = time.monotonic()
            with open(out + ".tmp", "w") as f:
                json.dump(counts, f)
            os.replace(out + ".tmp", out)

    return send


def sent_counts(sock_dir: str) -> dict[str, list[int]]:
    """Return, per socket name, what the stand-in agents sent and how much of it a real agent would have dropped."""
    total: dict[str, list[int]] = {}
    for name in os.listdir(sock_dir):
        if name.startswith("sends.") and name.endswith(".json"):
            try:
                with open(os.path.join(sock_dir, name)) as f:
                    counts = json.load(f)
            except (OSError, ValueError):
                continue
            for path, (n, dropped) in counts.items():
                t = total.setdefault(os.path.basename(path), [0, 0])
                t[0], t[1] = t[0] + n, t[1] + dropped
    return total


def part_core(socks: str) -> None:
    """Report an engine core's steps every 0.5 s, as the agent in vLLM's EngineCore does (light or CUPTI mode).

    A decode engine at 20 ms a step with 8 requests running and 22 waiting: 25 steps a tick, the
    scheduler's counts after the newest step, sent from this process (its own pid, a descendant of
    the engine's main process, which joins the steps to the engine). The steps' CUDA graph mode is
    counted where the model runs: in the workers (`part_worker`).
    """
    from exporter import wire

    send = _sender(socks)
    seq, start = 0, time.time_ns()
    hist = [0] * wire.STEP_BUCKET_COUNT
    hist[2] = 25  # 20 ms steps: the (10, 20] ms bucket
    last = start
    while True:
        _agent_sleep()
        now = time.time_ns()
        seq += 1
        steps = wire.Steps(
            engine="vllm",
            n=25,
            wall=25 * 20_000_000,
            tokens=25 * 8,
            seqs=25 * 8,
            hist=tuple(hist),
            t0=last,
            t1=now,
            run_ns=8 * (now - last),
            wait_ns=22 * (now - last),
            running=8,
            waiting=22,
            max_seqs=256,
        )
        last = now
        msg = wire.Message(
            pid=os.getpid(),
            state="running",
            seq=seq,
            role="vllm_engine",
            mode="light",
            steps=(steps,),
            silent_ms=1250,
        )
        send(wire.encode(msg))


def part_worker(socks: str, gpu: int, mode: str, owner: int) -> None:
    """Report one GPU every 0.5 s as the agent in a vLLM worker does (tensor parallel: one GPU each).

    Both modes: the steps' CUDA graph mode (the model runner's, counted in the worker; `owner` is
    the engine core's pid) and the CUDA graph replays. `cupti` adds the GPU's closed windows
    (`cupti_window`), the device windows of the CUPTI agent.
    """
    from exporter import wire

    send = _sender(socks)
    uuid = uuid_of(gpu)
    seq, last = 0, time.time_ns()
    start = last - LAG_NS
    next_t0 = start - start % WINDOW_NS
    while True:
        _agent_sleep()
        now = time.time_ns()
        windows: list[wire.Window] = []
        if mode == "cupti":
            due, next_t0 = agent_windows(next_t0, now)
            windows = [cupti_window(t0, t1) for t0, t1 in due]
        graphs = wire.GraphCounts(t0=last, t1=now, replays=25, captures=67, dev=0, uuid=uuid)
        modes = wire.Steps(engine="vllm", n=0, wall=0, graph=25, owner=owner)
        last = now
        for i in range(0, max(1, len(windows)), 2):  # at most two windows a datagram, as the agent
            seq += 1
            msg = wire.Message(
                pid=os.getpid(),
                state="running",
                seq=seq,
                role="vllm_worker",
                mode="light" if mode == "light" else "cupti:records",
                devices=((0, uuid),),
                windows=tuple(windows[i : i + 2]),
                steps=(modes,) if i == 0 else (),
                graphs=graphs if i == 0 else None,
                silent_ms=1250 if mode == "light" else 0,
            )
            send(wire.encode(msg))


def mappingproxy_of(d: dict[Any, Any]) -> Any:
    """Return a read-only view of d (how captured Snapshots' mapping fields are unpickled)."""
    import types

    return types.MappingProxyType(d)


def capture_ticks(path: str, gpus: int, skip: int = 20, keep: int = 40) -> None:
    """Pickle the inputs of `keep` ticks' `advance` (history, raw Snapshot) after `skip` ticks, to time offline."""
    import copyreg
    import pickle
    import types

    from exporter import sampling

    copyreg.pickle(types.MappingProxyType, lambda m: (mappingproxy_of, (dict(m),)))
    real = sampling.advance
    got: list[Any] = []
    n = [0]

    def advance(history: Any, raw: Any, cfg: Any) -> Any:
        n[0] += 1
        if skip < n[0] <= skip + keep:
            got.append((history, raw))
            if len(got) == keep:
                with open(f"{path}.{gpus}", "wb") as f:
                    pickle.dump({"ticks": got, "cfg": cfg}, f)
        return real(history, raw, cfg)

    sampling.advance = advance  # type: ignore[assignment]


def time_parts() -> dict[str, float]:
    """Add up the CPU time (time.thread_time, in their own thread) of the daemon's synchronous parts."""
    from exporter import sampling, wire
    from exporter.sources import base, engine, placement, procs, unixsock
    from exporter.sources.agent_feed import AgentFeed
    from exporter.sources.engine import EngineSource
    from exporter.sources.host import HostSource
    from exporter.sources.nvml import NvmlSource

    out: dict[str, float] = {}

    def wrap(owner: Any, attr: str, label: str) -> None:
        real = getattr(owner, attr, None)
        if real is None:  # not in this tree (the other side of --ab may be older or newer)
            return

        def timed(*a: Any, **k: Any) -> Any:
            t = time.thread_time()
            try:
                return real(*a, **k)
            finally:
                out[label] = out.get(label, 0.0) + time.thread_time() - t

        setattr(owner, attr, timed)

    wrap(sampling, "advance", "main:advance")
    wrap(sampling, "compact", "main:compact")
    wrap(AgentFeed, "_readable", "main:agent_readable")  # trees before the feed's reader thread
    wrap(unixsock, "receive", "main:agent_readable:receive")  # inside _readable
    wrap(unixsock, "receive_one", "agent:receive")  # the feed's reader thread (its whole CPU: bw-agent_0)
    # decoded and taken when the tick collects (the inbox), or in _readable when the inbox is full
    wrap(wire, "decode", "main:agent_decode")
    wrap(AgentFeed, "_take", "main:agent_take")
    wrap(AgentFeed, "collect", "main:agent_collect")
    wrap(EngineSource, "_build", "engine:build")
    wrap(EngineSource, "_fetch", "engine:build:fetch")  # inside _build, as the next five
    wrap(EngineSource, "_read_one", "engine:build:parse")
    wrap(procs.CpuTracker, "sample", "engine:build:cpu")
    wrap(EngineSource, "_with_processes", "engine:build:processes")  # the next two inside it
    wrap(engine, "read_cgroup_cpu", "engine:build:processes:cgroups")
    wrap(placement, "placements", "engine:build:processes:placements")
    wrap(EngineSource, "_rediscover", "engine:rediscover")
    wrap(NvmlSource, "read_blocking", "nvml:read")
    wrap(HostSource, "read_blocking", "host:read")
    # the tick's own handling around those parts (the event loop's thread); main:start holds the reads
    # the tick starts on the loop (the agent feed's drain and main:agent_collect, host:read)
    wrap(sampling, "retire", "main:retire")
    wrap(sampling.Sampler, "_result", "main:result")
    wrap(sampling.Sampler, "_start", "main:start")
    wrap(sampling.Sampler, "_compact_old", "main:compact_old")  # compact inside it
    wrap(NvmlSource, "follow", "main:follow:nvml")
    wrap(EngineSource, "follow", "main:follow:engine")
    wrap(base.BlockingReader, "submit", "main:submit")
    if os.environ.get("BW_COST_LOOP"):  # every event-loop callback's CPU, by what it runs ("loop:...")
        time_callbacks(out)
    return out


def _callback_label(handle: Any) -> str:
    """Return what an event-loop callback runs: a task's coroutine, else the callback's qualified name."""
    cb = handle._callback
    owner = getattr(cb, "__self__", None)
    if isinstance(owner, __import__("asyncio").Task):
        coro = owner.get_coro()
        return "loop:task:" + getattr(coro, "__qualname__", type(coro).__name__)
    name = getattr(cb, "__qualname__", None) or type(cb).__name__
    return "loop:" + name


def time_callbacks(out: dict[str, float]) -> None:
    """Add up the CPU time of each event-loop callback (asyncio's Handle._run), by `_callback_label`."""
    import asyncio.events

    real = asyncio.events.Handle._run

    def _run(self: Any) -> None:
        label = _callback_label(self)
        t = time.thread_time()
        try:
            real(self)
        finally:
            out[label] = out.get(label, 0.0) + time.thread_time() - t

    asyncio.events.Handle._run = _run  # type: ignore[method-assign]


def watch_gc() -> dict[str, float]:
    """Count the collector's passes and CPU time per generation from now on (gc.callbacks)."""
    import gc

    out: dict[str, float] = {}
    started: list[float] = [0.0]

    def cb(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.thread_time()
            return
        g = info["generation"]
        out[f"gen{g}_seconds"] = out.get(f"gen{g}_seconds", 0.0) + time.thread_time() - started[0]
        out[f"gen{g}_passes"] = out.get(f"gen{g}_passes", 0) + 1

    gc.callbacks.append(cb)
    return out


def thread_cpu() -> dict[str, float]:
    """Return this process's CPU seconds by thread name: each Python thread's CPU clock (ns), else utime + stime."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    clocked = set()
    for t in threading.enumerate():
        try:
            seconds = time.clock_gettime(time.pthread_getcpuclockid(t.ident or 0))
        except (OSError, OverflowError):
            continue
        out[t.name] = out.get(t.name, 0.0) + seconds
        clocked.add(t.native_id)
    for tid in os.listdir("/proc/self/task"):
        if int(tid) in clocked:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
            name = names.get(int(tid), "other")
            out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / CLK
        except OSError:
            pass
    return out


def trace_memory(path: str, every: float = 30.0, top: int = 30) -> None:
    """Trace allocations from now on and write, every `every` s, the `top` source lines holding most memory."""
    import tracemalloc

    tracemalloc.start(1)

    def write() -> None:
        rows: list[dict[str, Any]] = []
        while True:
            time.sleep(every)
            stats = tracemalloc.take_snapshot().statistics("lineno")
            rows.append(
                {
                    "t": time.monotonic(),
                    "traced_mib": round(sum(s.size for s in stats) / 2**20, 2),
                    "top": [[str(s.traceback[0]), round(s.size / 2**20, 3), s.count] for s in stats[:top]],
                }
            )
            with open(path + ".tmp", "w") as f:
                json.dump(rows, f, indent=1)
            os.replace(path + ".tmp", path)

    threading.Thread(target=write, name="bench-tracemalloc", daemon=True).start()


def part_daemon(port: int, sock_path: str, gpus: int) -> None:
    """Run the real daemon with the NVML stand-in for N GPUs (0: the machine's own NVML, as on the device)."""
    import asyncio

    from exporter.config import load
    from exporter.daemon import build_sources, serve
    from exporter.logs import configure
    from exporter.sources.nvml import NvmlSource
    from tests.fakes.nvml_standin import FakeGpu, FakeNvml

    configure(os.environ.get("BW_COST_LOG", "warning"), "json")  # info: the daemon's state changes too
    cfg = load(
        overrides={"web.address": "127.0.0.1", "web.port": port, "agent.socket": sock_path}, environ={}
    )
    sources = build_sources(cfg)
    if gpus > 0:
        fake = FakeNvml([FakeGpu(uuid=uuid_of(i)) for i in range(gpus)])
        sources = [NvmlSource(cfg.nvml, nvml=fake) if s.name == "nvml" else s for s in sources]  # type: ignore[arg-type]
    capture = os.environ.get("BW_COST_CAPTURE")  # a path: the pipeline's inputs of 40 ticks, pickled
    if capture:
        capture_ticks(capture, gpus)
    traced = os.environ.get("BW_COST_TRACEMALLOC")  # a path: the 30 lines holding most memory, every 30 s
    if traced:
        trace_memory(f"{traced}.{gpus}")
    profile = os.environ.get("BW_COST_PROFILE")  # a path: profile every thread's CPU (yappi, if installed)
    stats = os.environ.get("BW_COST_STATS")  # a path: each thread's CPU and the time in gc, at the end
    if not profile:
        if stats:  # written every 5 s (the reader threads are gone once the daemon stopped)
            gc_time = watch_gc()
            timed = time_parts()

            def write_stats() -> None:
                rows: list[dict[str, Any]] = []
                while True:
                    time.sleep(5.0)
                    rows.append(
                        {
                            "t": time.monotonic(),
                            "threads": thread_cpu(),
                            "gc": dict(gc_time),
                            "parts": dict(timed),
                        }
                    )
                    with open(f"{stats}.{gpus}.tmp", "w") as f:
                        json.dump(rows, f)
                    os.replace(f"{stats}.{gpus}.tmp", f"{stats}.{gpus}")

            threading.Thread(target=write_stats, name="bench-stats", daemon=True).start()
        asyncio.run(serve(cfg, sources))
        return
    if profile.endswith(".cprof"):  # the event loop's thread only, with cProfile
        import cProfile

        prof = cProfile.Profile(time.thread_time)
        prof.enable()
        try:
            asyncio.run(serve(cfg, sources))
        finally:
            prof.disable()
            prof.dump_stats(f"{profile}.{gpus}")
        return
    import yappi  # type: ignore[import-not-found]

    yappi.set_clock_type("cpu")
    yappi.start()
    try:
        asyncio.run(serve(cfg, sources))
    finally:
        yappi.stop()
        yappi.get_func_stats().save(f"{profile}.{gpus}", type="pstat")


# --- measurement -------------------------------------------------------------------------


def scrape(port: int, gz: bool = True) -> tuple[float, int, int]:
    """Return (seconds, bytes on the wire, series) of one /metrics scrape."""
    t = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"} if gz else {})
    r = c.getresponse()
    body = r.read()
    dt = time.perf_counter() - t
    enc = r.getheader("Content-Encoding", "")
    c.close()
    text = gzip.decompress(body) if enc == "gzip" else body
    series = sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))
    return dt, len(body), series


def wait_port(port: int, timeout: float = 30.0) -> bool:
    end = time.time() + timeout
    while time.time() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.1)
    return False


def metric(port: int, name: str) -> float | None:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def metric_sum(port: int, name: str, having: str) -> float:
    """Return the sum of a metric's series whose line contains `having` (a label pair), 0 without any."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") and having in line
    )


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def compare_scrapes(bw_pid: int, bw_port: int, n: int, bw_idle: float) -> dict[str, Any]:
    """Alternate n scrapes of boundwatch and of node_exporter; CPU per scrape, latency, bytes.

    CPU per scrape: each process's CPU over the whole phase, less its own background rate (the
    daemon's ticks, `bw_idle` cores; node_exporter does nothing between scrapes), over n.
    """
    out: dict[str, Any] = {}
    ne = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    targets = [("boundwatch", bw_pid, bw_port)]
    ne_proc = None
    if ne:
        ne_port = free_port()
        ne_proc = subprocess.Popen(
            [ne, f"--web.listen-address=127.0.0.1:{ne_port}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if wait_port(ne_port):
            targets.append(("node_exporter", ne_proc.pid, ne_port))
    try:
        for _name, _pid, port in targets:
            for _ in range(20):
                scrape(port)  # warm up
        lat: dict[str, list[float]] = {t[0]: [] for t in targets}
        size: dict[str, list[int]] = {t[0]: [] for t in targets}
        series: dict[str, int] = {}
        c0 = {name: cpu_seconds(pid) for name, pid, _ in targets}
        t0 = time.time()
        for _ in range(n):
            for name, _pid, port in targets:
                dt, nbytes, s = scrape(port)
                lat[name].append(dt)
                size[name].append(nbytes)
                series[name] = s
        span = time.time() - t0
        idle = {"boundwatch": bw_idle}
        cpu = {name: cpu_seconds(pid) - c0[name] - idle.get(name, 0.0) * span for name, pid, _ in targets}
        for name, _pid, _port in targets:
            per = max(0.0, cpu[name]) / n
            out[name] = {
                "scrapes": n,
                "series": series[name],
                "cpu_ms_per_scrape": round(per * 1e3, 3),
                "cpu_ms_per_1000_series": round(per * 1e3 * 1000 / max(1, series[name]), 3),
                "latency_ms_median": round(pct(lat[name], 0.5) * 1e3, 3),
                "latency_ms_p99": round(pct(lat[name], 0.99) * 1e3, 3),
                "gzip_bytes": int(sum(size[name]) / n),
                "gzip_bytes_per_series": round(sum(size[name]) / n / max(1, series[name]), 2),
            }
        if "node_exporter" in out:
            b, ne_ = out["boundwatch"], out["node_exporter"]
            out["ratio_cpu_per_1000_series"] = round(
                b["cpu_ms_per_1000_series"] / ne_["cpu_ms_per_1000_series"], 3
            )
            out["ratio_bytes_per_series"] = round(
                b["gzip_bytes_per_series"] / ne_["gzip_bytes_per_series"], 3
            )
    finally:
        if ne_proc is not None:
            ne_proc.kill()
            ne_proc.wait()
    return out


LAUNCHER = """import sys
sys.path.insert(0, {root!r})
from bench.sidecar_cost import part_engine
part_engine(int(sys.argv[sys.argv.index("--port") + 1]))
"""


def start_engine(workdir: str, port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start the engine stand-in as `python .../vllm serve --port P`, the command line discovery knows."""
    launcher = os.path.join(workdir, "vllm")
    with open(launcher, "w") as f:
        f.write(LAUNCHER.format(root=ROOT))
    return subprocess.Popen(
        [sys.executable, launcher, "serve", "--port", str(port)], stdin=subprocess.PIPE, env=env
    )


def stop_parts(procs: list[subprocess.Popen[bytes]], workdir: str) -> None:
    """Stop the bench's processes, newest first (terminate, then kill after 5 s), and remove their dir."""
    for p in reversed(procs):
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
    shutil.rmtree(workdir, ignore_errors=True)


def start_daemon(
    root: str, gpus: int, sock_dir: str, env: dict[str, str], name: str = "agent.sock", python: str = ""
) -> tuple[subprocess.Popen[bytes], int, str]:
    """Start the daemon of the tree at `root` (its own bench's daemon part) under `python` (default: this
    interpreter); return it, its port, its socket."""
    port, sock_path = free_port(), os.path.join(sock_dir, name)
    me = os.path.join(root, "bench", "sidecar_cost.py")
    argv = [
        python or sys.executable,
        me,
        "--part",
        "daemon",
        "--port",
        str(port),
        "--sock",
        sock_path,
        "--gpus",
        str(gpus),
    ]
    return subprocess.Popen(argv, env=dict(env, PYTHONPATH=root), cwd=root), port, sock_path


def run_one(
    gpus: int,
    seconds: float,
    scrapes: int,
    scrape_every: float,
    other: str = "",
    other_first: bool = False,
    agent: str = "windows",
    other_python: str = "",
    warmup: float = 8.0,
) -> dict[str, Any]:
    """Measure the daemon at one GPU count (and the daemon of the tree `other` beside it, if given)."""
    from exporter.sources import unixsock

    me = os.path.abspath(__file__)
    eng_port = free_port()
    sock_dir = tempfile.mkdtemp(prefix=f"bw-cost-{gpus}-")  # pid 1 in the namespace: never the pid
    os.chmod(sock_dir, 0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOUNDWATCH")}
    env["PYTHONPATH"] = ROOT
    env["BW_PY"] = sys.executable
    # the agents inside the engine's processes (--agent cupti, light) send to both daemons' sockets
    env["BW_AGENT_MODE"], env["BW_AGENT_GPUS"] = agent, str(gpus)
    env["BW_AGENT_SOCKS"] = ",".join(
        os.path.join(sock_dir, n) for n in ("agent.sock", "agent-a.sock")[: 2 if other else 1]
    )
    procs: list[subprocess.Popen[bytes]] = []
    # the engine main process is started as `vllm serve`, so discovery finds it as it finds a real one
    engine = start_engine(sock_dir, eng_port, env)
    procs.append(engine)
    env_other = {k: v for k, v in env.items() if not k.startswith("BW_COST_")}  # switches: this tree's
    if env.get("BW_COST_STATS"):  # except the per-part figures, which both write (the other's with ".a")
        env_other["BW_COST_STATS"] = env["BW_COST_STATS"] + ".a"
    # start order sets the two daemons' tick phases: alternated between pairs (`other_first`)
    starts = [(other, env_other, "agent-a.sock", other_python)] if other else []
    starts.insert(1 if other_first else 0, (ROOT, env, "agent.sock", ""))
    started = {name: start_daemon(root, gpus, sock_dir, e, name, py) for root, e, name, py in starts}
    procs.extend(d for d, _, _ in started.values())
    daemon, bw_port, sock_path = started["agent.sock"]
    daemons = [daemon]
    if other:  # the same tree on both sides (an A/A) is two daemons too: told apart by their sockets
        daemon_a, port_a, sock_a = started["agent-a.sock"]
        daemons.append(daemon_a)
    try:
        if not wait_port(bw_port) or (other and not wait_port(port_a)):
            return {"gpus": gpus, "error": "daemon did not listen"}
        for path in [sock_path] + ([sock_a] if other else []) if agent == "windows" else []:
            procs.append(
                subprocess.Popen(
                    [sys.executable, me, "--part", "agent", "--sock", path, "--gpus", str(gpus)], env=env
                )
            )
        time.sleep(warmup)  # discovery, the first agent windows, history warming (see --warmup)
        # the tick count read by a scrape before the CPU span starts (and the other daemon scraped
        # alike): a /metrics render is ~10 ms at 8 GPUs, a scrape the span is not about
        ticks0 = metric(bw_port, "boundwatch_ticks_total")
        if other:
            metric(port_a, "boundwatch_ticks_total")
        time.sleep(0.1)
        t0, c0 = time.time(), run_seconds(daemon.pid)
        w0 = thread_wakes(daemon.pid)
        c0_other = run_seconds(daemons[-1].pid)
        us0 = user_system(daemon.pid)
        rss = []
        next_scrape = time.time()
        while time.time() - t0 < seconds:
            if scrape_every and time.time() >= next_scrape:
                scrape(bw_port)
                if other:  # the other daemon scraped alike, its event loop held up as long
                    scrape(port_a)
                next_scrape += scrape_every
            rss.append(rss_bytes(daemon.pid))
            time.sleep(1.0)
        t1, c1, w1 = time.time(), run_seconds(daemon.pid), thread_wakes(daemon.pid)
        c1_other = run_seconds(daemons[-1].pid)
        us1 = user_system(daemon.pid)
        ticks1 = metric(bw_port, "boundwatch_ticks_total")
        _dt, nbytes, series = scrape(bw_port)
        dump = os.environ.get("BW_COST_DUMP")  # a path: the daemon's last /metrics page, to see what it read
        if dump:
            c = http.client.HTTPConnection("127.0.0.1", bw_port, timeout=10)
            c.request("GET", "/metrics")
            with open(f"{dump}.{agent}.{gpus}", "wb") as f:
                f.write(c.getresponse().read())
            c.close()
        api_servers = metric(bw_port, "boundwatch_engine_api_servers")
        sends = sent_counts(sock_dir)  # the light and CUPTI stand-ins' (every 5 s: the last few s not in)
        res: dict[str, Any] = {
            "gpus": gpus,
            "agent": agent,
            "seconds": round(t1 - t0, 1),
            "warmup_seconds": warmup,
            "cpu_share_of_core": round((c1 - c0) / (t1 - t0), 5),
            "user_system_share_of_core": [
                round((b - a) / (t1 - t0), 5) for a, b in zip(us0, us1, strict=True)
            ],
            "ticks_per_second": round(((ticks1 or 0) - (ticks0 or 0)) / (t1 - t0), 3),
            "rss_mib_first": round(rss[0] / 2**20, 1) if rss else None,
            "rss_mib_last": round(rss[-1] / 2**20, 1) if rss else None,
            "rss_mib_max": round(max(rss) / 2**20, 1) if rss else None,
            "rss_mib_each_minute": [round(r / 2**20, 1) for r in rss[::60]],  # ~1 s apart
            "engine_api_servers_seen": api_servers,
            # what the daemon made of the agents: each GPU's running agents, the engine's counts' source
            "agents_running": metric_sum(bw_port, "boundwatch_agents", 'state="running"'),
            "engine_counts_from_agent": metric_sum(
                bw_port, "boundwatch_engine_counts_source", 'source="agent"'
            ),
            # what the agents sent this daemon since they started, and what a real agent would have
            # dropped of it (the daemon's socket queue full: net.unix.max_dgram_qlen)
            "agent_sends": sends.get("agent.sock", [0, 0])[0],
            "agent_sends_would_drop": sends.get("agent.sock", [0, 0])[1],
            "dgram_qlen": unixsock.dgram_queue_limit(),  # this namespace's: what the daemons' sockets got
            "metrics_series": series,
            "metrics_gzip_bytes": nbytes,
            "scrape_every_seconds": scrape_every,
            # how often each of the daemon's threads was switched out a tick: a thread's first wake in a
            # tick costs far more than its CPU in a profile shows on a VM (README: "Session 24")
            "context_switches_per_tick": wakes_per_tick(w0, w1, (ticks1 or 0) - (ticks0 or 0)),
        }
        if other:
            share_a = (c1_other - c0_other) / (t1 - t0)
            res["ab"] = {
                "tree_a": other,
                "a_started_first": other_first,
                "python_a": other_python or sys.executable,
                "cpu_share_of_core_a": round(share_a, 5),
                "engine_api_servers_seen_a": metric(port_a, "boundwatch_engine_api_servers"),
                "ratio_b_over_a": round(res["cpu_share_of_core"] / share_a, 3) if share_a else None,
                "agent_sends_a": sends.get("agent-a.sock", [0, 0])[0],
                "agent_sends_would_drop_a": sends.get("agent-a.sock", [0, 0])[1],
            }
        if scrapes:
            res["scrapes"] = compare_scrapes(daemon.pid, bw_port, scrapes, res["cpu_share_of_core"])
        return res
    finally:
        stop_parts(procs, sock_dir)


def summarise(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Return each GPU count's figures (share of a core, %): this tree's, the --ab tree's, their medians and ratios.

    Identical daemons side by side differ by up to 6% in one pair (bench/README.md, session 35), so
    a figure is read as the median over pairs; with the same tree on both sides (an A/A) every
    figure is one of that daemon's, and `both_median` is its median.
    """
    out: dict[str, dict[str, Any]] = {}
    for gpus in sorted({r["gpus"] for r in rows}):
        mine = [r for r in rows if r["gpus"] == gpus]
        this = [round(r["cpu_share_of_core"] * 100, 3) for r in mine]
        other = [round(r["ab"]["cpu_share_of_core_a"] * 100, 3) for r in mine if "ab" in r]
        ratios = [r["ab"]["ratio_b_over_a"] for r in mine if r.get("ab", {}).get("ratio_b_over_a")]
        row: dict[str, Any] = {
            "pairs": len(mine),
            "this_pct": this,
            "this_median_pct": statistics.median(this),
        }
        if other:
            row["ab_pct"] = other
            row["ab_median_pct"] = statistics.median(other)
            row["ratio_median"] = statistics.median(ratios) if ratios else None
            row["both_median_pct"] = statistics.median(this + other)
        out[str(gpus)] = row
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", default="1,8,64", help="GPU counts to measure, comma-separated")
    ap.add_argument("--seconds", type=float, default=120.0, help="CPU measurement span per GPU count")
    ap.add_argument(
        "--scrapes", type=int, default=1000, help="scrapes per target in the comparison (0: none)"
    )
    ap.add_argument(
        "--scrape-every", type=float, default=0.0, help="scrape while measuring CPU (s; 0: never)"
    )
    ap.add_argument("--ab", default="", help="run the daemon of the tree at this path beside this one's")
    ap.add_argument(
        "--ab-python",
        default="",
        help="the interpreter of the --ab tree's daemon (default: this one): a Python version against another",
    )
    ap.add_argument(
        "--warmup",
        type=float,
        default=8.0,
        help="seconds from start to the CPU span (8: discovery and the history warm; over 60: every"
        " process older than the process table's young window, as on a host that serves for hours)",
    )
    ap.add_argument(
        "--pairs", type=int, default=1, help="runs per GPU count (the two daemons' start order alternating)"
    )
    ap.add_argument(
        "--agent",
        default="windows",
        choices=AGENT_MODES,
        help="what the GPUs' agents send (see the module's doc; default: windows)",
    )
    ap.add_argument(
        "--dgram-qlen",
        type=int,
        default=0,
        help="run in a network namespace of its own whose net.unix.max_dgram_qlen is this"
        " (512: what systemd sets on most hosts; 0: this machine's, in its own namespace)",
    )
    ap.add_argument("--out", default="")
    ap.add_argument("--part", default="", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--sock", default="", help=argparse.SUPPRESS)
    args, _rest = ap.parse_known_args()
    if args.part == "engine":
        part_engine(args.port)
        return 0
    if args.part == "core":
        _title("VLLM::EngineCore")
        part_core(args.sock)
        return 0
    if args.part == "worker":
        _title(f"VLLM::Worker_TP{args.gpus}")
        part_worker(args.sock, int(args.gpus), os.environ.get("BW_AGENT_MODE", "light"), args.port)
        return 0
    if args.part == "agent":
        part_agent(args.sock, int(args.gpus))
        return 0
    if args.part == "daemon":
        part_daemon(args.port, args.sock, int(args.gpus))
        return 0
    if os.getpid() != 1 and os.environ.get("BW_COST_NS") != "1":
        if not shutil.which("unshare") or os.geteuid() != 0:
            print("needs root and unshare(1) for a PID namespace of its own", file=sys.stderr)
            return 2
        env = dict(os.environ, BW_COST_NS="1")
        if args.dgram_qlen > 0:  # loopback up and the queue set, inside a network namespace of its own
            script = 'ip link set lo up && echo "$0" > /proc/sys/net/unix/max_dgram_qlen && exec "$@"'
            cmd = ["sh", "-c", script, str(args.dgram_qlen), sys.executable, *sys.argv]
            return subprocess.call(["unshare", "--net", "--pid", "--fork", "--mount-proc", *cmd], env=env)
        return subprocess.call(
            ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, *sys.argv], env=env
        )
    if args.dgram_qlen > 0:
        from exporter.sources import unixsock

        qlen = unixsock.dgram_queue_limit()
        if qlen != args.dgram_qlen:  # started as pid 1 already: no namespace of ours
            print(
                f"warning: --dgram-qlen {args.dgram_qlen} not applied: this runs in a PID namespace it did not "
                f"make (as pid 1), without a network namespace of its own; the queue is "
                f"{qlen}. Run the bench without unshare.",
                file=sys.stderr,
            )
    rows = []
    for pair in range(args.pairs):
        for g in [int(x) for x in args.gpus.split(",")]:
            r = run_one(
                g,
                args.seconds,
                args.scrapes,
                args.scrape_every,
                os.path.abspath(args.ab) if args.ab else "",
                other_first=pair % 2 == 1,
                agent=args.agent,
                other_python=args.ab_python,
                warmup=args.warmup,
            )
            print(json.dumps(r), flush=True)
            rows.append(r)
    summary = summarise(rows)
    for gpus, row in summary.items():
        line = f"{gpus} GPUs, {row['pairs']} pairs: this tree median {row['this_median_pct']:.3f}% of a core"
        if "ab_median_pct" in row:
            line += (
                f", --ab tree {row['ab_median_pct']:.3f}%, median ratio {row['ratio_median'] or float('nan'):.3f}, "
                f"both sides {row['both_median_pct']:.3f}%"
            )
        print(line, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {"rows": rows, "summary": summary, "argv": sys.argv[1:], "cpus": os.cpu_count()}, f, indent=1
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
