"""How long the agent's own thread keeps the application's Python thread waiting for the GIL.

No GPU: synthetic raw CUPTI buffers with the record mix of the decode benchmark (kernels, graph
launches, memcpy, memset) go through the agent's real path (`_enqueue`, then `_drain` on its own
thread, as `_tick` does) while an "application" thread loops like an engine: it waits 0.7 ms with the
GIL released (a CUDA synchronize does that), then needs the GIL back for a little Python work. The
pause is how much longer than that an iteration took. The same loop without the agent is the floor. Then, with no application thread, the longest
stretches the agent's thread runs between two of its GIL hand-overs.

    python3 bench/agent_gil.py --out bench/results/agent_gil.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import struct
import sys
import threading
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from exporter.agent import cuptilib as cl  # noqa: E402
from exporter.agent.core import Agent, Settings  # noqa: E402

T0 = 1_764_400_000_000_000_000


def record(kind: int, start: int, end: int) -> bytes:
    buf = bytearray(cl.RECORD_SIZE[kind])
    so, eo, do, _go, _edo = cl.FIELDS[kind]
    struct.pack_into("<I", buf, 0, kind)
    struct.pack_into("<Q", buf, so, start)
    struct.pack_into("<Q", buf, eo, end)
    struct.pack_into("<I", buf, do, 0)
    return bytes(buf)


def buffers(n_buffers: int, size: int, seed: int = 0) -> list[tuple[bytes, int]]:
    """Mixed buffers of about `size` bytes (80% kernels, 15% graph launches, 5% memcpy/memset), each
    with the end of its last record; time runs on from one buffer to the next."""
    rnd = random.Random(seed)
    out = []
    t = T0 + 2_000_000_000
    for _ in range(n_buffers):
        parts: list[bytes] = []
        used = 0
        while used < size - 256:
            x = rnd.random()
            kind = (
                cl.KIND_CONCURRENT_KERNEL
                if x < 0.8
                else cl.KIND_GRAPH_TRACE
                if x < 0.95
                else cl.KIND_MEMCPY
                if x < 0.975
                else cl.KIND_MEMSET
            )
            d = rnd.randint(2_000, 60_000)  # ~5.6k records of ~37 us: a buffer spans ~0.2 s of GPU time
            parts.append(record(kind, t, t + d))
            used += cl.RECORD_SIZE[kind]
            t += d + rnd.randint(500, 10_000)
        out.append((b"".join(parts), t))
    return out


def app_loop(seconds: float, wait_s: float, stop: threading.Event) -> list[int]:
    """Iterations of: sleep `wait_s` (GIL released), then a little Python; return the excess ns of each."""
    over = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end and not stop.is_set():
        t = time.perf_counter_ns()
        time.sleep(wait_s)
        x = 0
        for i in range(50):
            x += i
        over.append(time.perf_counter_ns() - t - int(wait_s * 1e9))
    return over


def run(
    with_agent: bool, seconds: float, bufs: list[tuple[bytes, int]], per_tick: int, batch_mib: int
) -> dict[str, Any]:
    path = f"/tmp/bw-gil-{os.getpid()}.sock"
    agent = None
    stop = threading.Event()
    feeder = None
    if with_agent:
        agent = Agent(Settings(socket=path, sampling="off", kernel_trim_ns=680, batch_mib=batch_mib))
        agent.state = "running"
        agent._start_ns = T0
        agent._spans = [[T0, None]]

        def feed() -> None:  # what CUPTI hands over in 0.5 s, drained as the agent's tick does
            i = 0
            while not stop.is_set() and i + per_tick <= len(bufs):
                for b, _ in bufs[i : i + per_tick]:
                    agent._enqueue((b, None), len(b))
                t_last = bufs[i + per_tick - 1][1]
                i += per_tick
                agent._drain(budget_ns=100_000_000)
                agent._close_windows(t_last + 2_000_000_000)
                stop.wait(0.5)

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
    over = app_loop(seconds, 0.0007, stop)
    stop.set()
    if feeder is not None:
        feeder.join(5)
    over.sort()
    n = len(over)
    res: dict[str, Any] = {
        "agent": with_agent,
        "iterations": n,
        "median_excess_us": over[n // 2] / 1e3,
        "p999_excess_us": over[int(n * 0.999)] / 1e3,
        "max_excess_ms": over[-1] / 1e6,
        "over_1ms": sum(1 for x in over if x > 1_000_000),
    }
    if agent is not None:
        res.update(
            records=agent.stats.records,
            buffers=agent.stats.buffers,
            decode_max_ms=agent.stats.decode_ns_max / 1e6,
            decode_ns_per_record=agent.stats.decode_ns_total / max(1, agent.stats.records),
        )
    return res


def segments(bufs: list[tuple[bytes, int]], per_tick: int) -> dict[str, Any]:
    """The longest stretches the agent's thread runs between two of its GIL hand-overs (its sleeps),
    found by timing each `time.sleep` the agent's modules call; no application thread runs."""
    from exporter.agent import core, cuptilib

    marks: list[tuple[str, int, str]] = []
    real = time

    class Timed:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        @staticmethod
        def sleep(seconds: float) -> None:
            marks.append(("s", real.perf_counter_ns(), sys._getframe(1).f_code.co_name))
            real.sleep(seconds)
            marks.append(("e", real.perf_counter_ns(), ""))

    core.time, cuptilib.time = Timed(), Timed()  # type: ignore[assignment]
    try:
        agent = Agent(Settings(socket="/tmp/bw-gil-none.sock", sampling="off"))
        agent.state = "running"
        agent._start_ns = T0
        agent._spans = [[T0, None]]
        for i in range(0, len(bufs) - per_tick + 1, per_tick):
            for b, _ in bufs[i : i + per_tick]:
                agent._enqueue((b, None), len(b))
            marks.append(("e", real.perf_counter_ns(), "tick"))
            agent._drain(budget_ns=100_000_000)
            agent._close_windows(bufs[i + per_tick - 1][1] + 2_000_000_000)
            marks.append(("s", real.perf_counter_ns(), "tick end"))
    finally:
        core.time, cuptilib.time = real, real  # type: ignore[assignment]
    holds: list[tuple[float, str]] = []
    since = None
    for kind, t, where in marks:
        if kind == "e":
            since = t
        elif since is not None:
            holds.append(((t - since) / 1e3, where))
            since = None
    holds.sort(reverse=True)
    return {
        "stretches": len(holds),
        "longest_us": [(round(us, 1), where) for us, where in holds[:8]],
        "p99_us": holds[len(holds) // 100][0] if holds else 0.0,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/agent_gil.json")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--buffer-kib", type=int, default=1024)
    ap.add_argument("--batch-mib", type=int, default=Settings().batch_mib)
    ap.add_argument("--per-tick", type=int, default=2, help="buffers CUPTI hands over per 0.5 s tick")
    args = ap.parse_args()
    bufs = buffers(int(args.per_tick * (args.seconds / 0.5 + 2)), args.buffer_kib * 1024)
    results = {
        "switch_interval_s": sys.getswitchinterval(),
        "cpus": os.cpu_count(),
        "per_tick": args.per_tick,
        "buffer_kib": args.buffer_kib,
        "batch_mib": args.batch_mib,
        "records_per_buffer": sum(len(cl.walk(b) if cl.walk(b) is not None else ()) for b, _ in bufs)
        / len(bufs),
        "runs": [
            run(False, args.seconds, bufs, args.per_tick, args.batch_mib),
            run(True, args.seconds, bufs, args.per_tick, args.batch_mib),
        ],
        "agent_stretches": segments(bufs, args.per_tick),
    }
    with open(args.out, "w") as fh:
        json.dump(results, fh, indent=2)
    for r in results["runs"]:
        print(json.dumps(r))
    print(json.dumps(results["agent_stretches"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
