"""Reading the process table and per-thread CPU: boundwatch's /proc reader against psutil, same data.

    pip install psutil   # no longer a dependency of boundwatch; only this bench needs it
    python bench/procs_psutil.py --out bench/results/procs_psutil.json

Two jobs the host source does every tick: (1) the process table with pid, ppid, name, cmdline and
start time (engine and API-server discovery); (2) one 32-thread process's per-thread CPU ticks and
names (the API server's busiest thread). psutil is timed doing the same; what it cannot give is
noted (thread names and /proc schedstat run-queue wait, which the verdict's demand figure needs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil

from exporter.sources import procs


def _time(fn: Callable[[], object], repeat: int) -> dict[str, float]:
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - t0) * 1e3)
    runs.sort()
    return {"median_ms": statistics.median(runs), "p90_ms": runs[int(0.9 * (len(runs) - 1))]}


def table_proc() -> int:
    """Scan the table with boundwatch's reader."""
    return sum(1 for _ in procs.processes("/proc"))


def table_psutil() -> int:
    """Scan the table with psutil (same fields)."""
    attrs = ["pid", "ppid", "name", "cmdline", "create_time"]
    return sum(1 for _ in psutil.process_iter(attrs))


def threads_proc(pid: int) -> int:
    """Read each thread's CPU ticks, name and schedstat with boundwatch's reader."""
    n = 0
    for tid in procs.thread_ids("/proc", pid):
        if procs.read_stat("/proc", pid, tid) is not None:
            procs.read_schedstat("/proc", pid, tid)
            n += 1
    return n


def threads_proc_stat_only(pid: int) -> int:
    """Read each thread's CPU ticks and name only (what psutil gives, plus names)."""
    return sum(1 for tid in procs.thread_ids("/proc", pid) if procs.read_stat("/proc", pid, tid) is not None)


def threads_psutil_with_schedstat(pid: int) -> int:
    """psutil's thread times plus the schedstat the verdict needs (read from /proc anyway)."""
    threads = psutil.Process(pid).threads()
    for t in threads:
        procs.read_schedstat("/proc", pid, t.id)
    return len(threads)


def threads_psutil(pid: int) -> int:
    """Read each thread's CPU times with psutil (no names, no run-queue wait)."""
    return len(psutil.Process(pid).threads())


def main() -> int:
    """Time both readers and write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args()
    stop = threading.Event()
    workers = [threading.Thread(target=stop.wait, daemon=True) for _ in range(31)]
    for w in workers:
        w.start()
    me = os.getpid()
    result = {
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "psutil": psutil.__version__,
        },
        "processes": table_proc(),
        "threads": threads_proc(me),
        "table_proc": _time(table_proc, args.repeat),
        "table_psutil": _time(table_psutil, args.repeat),
        "threads_proc": _time(lambda: threads_proc(me), args.repeat),
        "threads_psutil": _time(lambda: threads_psutil(me), args.repeat),
        "threads_proc_stat_only": _time(lambda: threads_proc_stat_only(me), args.repeat),
        "threads_psutil_with_schedstat": _time(lambda: threads_psutil_with_schedstat(me), args.repeat),
        "psutil_lacks": ["thread names (comm)", "per-thread /proc schedstat run + run-queue wait"],
    }
    stop.set()
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
