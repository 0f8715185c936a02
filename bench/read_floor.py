"""The floor under the daemon's CPU: its inputs read at its cadence, and nothing else.

One thread, no event loop, no exporter code, no analysis, no Snapshot, no HTTP server: every `--tick`
seconds on a fixed schedule, the parts asked for (`--parts`, comma-separated):

- `nvml`: per GPU the calls the daemon's NVML source makes each tick (power, SM clock, clock-event
  reasons, utilization, memory, compute processes, a GPM sample and `nvmlGpmMetricsGet` of SM_UTIL,
  SM_OCCUPANCY, ANY_TENSOR_UTIL and DRAM_BW_UTIL), with GRAPHICS_UTIL on one tick in
  `--graphics-every` (the daemon's gate read it on 49-54% of a busy GPU's ticks in the H200 lab);
- `engine`: a GET of the engine's page (`--engine-url`) on one kept-alive connection, its running and
  waiting requests found by a scan of the lines;
- `procs`: each API server's `/proc/<pid>/stat` (`--pids`) and the schedstat of its `--hot` threads
  that used the most CPU at the last listing (every 5 s, as the daemon's tracker), the files kept open
  and read with one pread each, and each server's cgroup `cpu.stat`;
- `none`: nothing but the wake (the cost of waking twice a second).

Then it sleeps. Run beside the daemon on the same engine (bench/sidecar_beside_engine.py,
`--trees .,floor`), its CPU is what any reader of these inputs at this cadence pays in Python, so the
daemon's CPU less this is what the daemon's own design costs. It prints one JSON line a minute
(`--report`) and at SIGTERM: ticks run and what it read last (a part that fails says so there).

    python3 bench/read_floor.py --parts nvml,engine,procs --engine-url http://127.0.0.1:8000/metrics --pids 12,13
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import sys
import time
from typing import Any
from urllib.parse import urlsplit

PARTS = ("nvml", "engine", "procs", "none")
LIST_EVERY = 5.0  # seconds between listings of every thread (the daemon's HOT_LIST_SECONDS)


class Nvml:
    """The daemon's per-tick NVML calls for every GPU, with pynvml."""

    LEAN = ("NVML_GPM_METRIC_SM_UTIL", "NVML_GPM_METRIC_SM_OCCUPANCY", "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
            "NVML_GPM_METRIC_DRAM_BW_UTIL")  # fmt: skip

    def __init__(self, graphics_every: int) -> None:
        import pynvml as nv

        self.nv = nv
        nv.nvmlInit()
        self.handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
        self.graphics_every = graphics_every
        self.samples = [[nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()] for _ in self.handles]
        for h, (first, _) in zip(self.handles, self.samples, strict=True):
            nv.nvmlGpmSampleGet(h, first)
        self.lean = self._request([getattr(nv, m) for m in self.LEAN])
        self.graphics = self._request([nv.NVML_GPM_METRIC_GRAPHICS_UTIL])
        self.n = 0
        self.last: dict[str, Any] = {}

    def _request(self, ids: list[int]) -> Any:
        req = self.nv.c_nvmlGpmMetricsGet_t()
        req.version = self.nv.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = len(ids)
        for i, m in enumerate(ids):
            req.metrics[i].metricId = m
        return req

    def read(self) -> None:
        nv = self.nv
        self.n += 1
        for h, pair in zip(self.handles, self.samples, strict=True):
            power = nv.nvmlDeviceGetPowerUsage(h)
            nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)
            nv.nvmlDeviceGetCurrentClocksEventReasons(h)
            util = nv.nvmlDeviceGetUtilizationRates(h)
            nv.nvmlDeviceGetMemoryInfo(h)
            nv.nvmlDeviceGetComputeRunningProcesses(h)
            nv.nvmlGpmSampleGet(h, pair[1])
            for req in (self.lean, self.graphics) if self.n % self.graphics_every == 0 else (self.lean,):
                req.sample1, req.sample2 = pair[0], pair[1]
                nv.nvmlGpmMetricsGet(req)
            pair.reverse()
            self.last = {"power_mw": power, "util": util.gpu, "sm": self.lean.metrics[0].value,
                         "graphics": self.graphics.metrics[0].value}  # fmt: skip


class Engine:
    """The engine's page on one kept-alive connection; running and waiting from its lines."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.path = parts.path or "/metrics"
        self.conn: http.client.HTTPConnection | None = None
        self.last: dict[str, Any] = {}

    def read(self) -> None:
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=2.0)
        try:
            self.conn.request(
                "GET", self.path, headers={"Accept": "text/plain", "Accept-Encoding": "identity"}
            )
            body = self.conn.getresponse().read()
        except (OSError, http.client.HTTPException) as exc:
            self.conn.close()
            self.conn = None
            self.last = {"error": str(exc)}
            return
        running = waiting = None
        for line in body.split(b"\n"):
            if line.startswith(b"vllm:num_requests_running"):
                running = float(line.rsplit(b" ", 1)[1])
            elif line.startswith(b"vllm:num_requests_waiting"):
                waiting = float(line.rsplit(b" ", 1)[1])
        self.last = {"bytes": len(body), "running": running, "waiting": waiting}


class Procs:
    """Each API server's stat, its hot threads' schedstat and its cgroup's cpu.stat, kept open."""

    def __init__(self, pids: list[int], hot: int) -> None:
        self.pids, self.hot = pids, hot
        self.fds: dict[str, int] = {}
        self.hot_tids: dict[int, list[int]] = {}
        self.ticks: dict[int, dict[int, int]] = {}
        self.listed_at = -LIST_EVERY
        self.cgroups = {pid: self._cgroup(pid) for pid in pids}
        self.last: dict[str, Any] = {}

    @staticmethod
    def _cgroup(pid: int) -> str | None:
        """Return the process's cgroup v2 cpu.stat, or None where there is none (v1, or the root's on an old kernel)."""
        with open(f"/proc/{pid}/cgroup") as f:
            rel = f.read().strip().split("::", 1)[-1].rstrip("/")
        path = f"/sys/fs/cgroup{rel}/cpu.stat"
        return path if os.path.exists(path) else None

    def _pread(self, path: str) -> bytes:
        fd = self.fds.get(path)
        if fd is None:
            fd = self.fds[path] = os.open(path, os.O_RDONLY)
        return os.pread(fd, 4096, 0)

    def _drop(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()

    def read(self) -> None:
        now = time.monotonic()
        listing = now - self.listed_at >= LIST_EVERY
        if listing:
            self.listed_at = now
            self._drop()
        cpu, busiest = {}, {}
        for pid in self.pids:
            stat = self._pread(f"/proc/{pid}/stat").rsplit(b")", 1)[1].split()
            cpu[pid] = int(stat[11]) + int(stat[12])
            if listing:  # every thread's stat, then the hottest few are kept
                ticks = {}
                for tid in map(int, os.listdir(f"/proc/{pid}/task")):
                    f = self._pread(f"/proc/{pid}/task/{tid}/stat").rsplit(b")", 1)[1].split()
                    ticks[tid] = int(f[11]) + int(f[12])
                old = self.ticks.get(pid, {})
                moved = sorted(((t - old.get(tid, t), tid) for tid, t in ticks.items()), reverse=True)
                self.hot_tids[pid] = [tid for _, tid in moved[: self.hot]]
                self.ticks[pid] = ticks
            waits = []
            for tid in self.hot_tids.get(pid, []):
                run, wait, _ = self._pread(f"/proc/{pid}/task/{tid}/schedstat").split()
                waits.append(int(run) + int(wait))
            busiest[pid] = max(waits, default=0)
            cgroup = self.cgroups[pid]
            if cgroup is not None:
                self._pread(cgroup)
        self.last = {
            "cpu_ticks": cpu,
            "hottest_sched_ns": busiest,  # each server's hottest thread's CPU + wait (what saturation reads)
            "threads_hot": {p: len(t) for p, t in self.hot_tids.items()},
            "cgroups": sum(c is not None for c in self.cgroups.values()),
        }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--parts", default="nvml,engine,procs", help=f"comma-separated, of {','.join(PARTS)}")
    p.add_argument("--tick", type=float, default=0.5, help="seconds between reads (the daemon's tick)")
    p.add_argument("--engine-url", default="", help="the engine's page (for `engine`)")
    p.add_argument("--pids", default="", help="API-server pids, comma-separated (for `procs`)")
    p.add_argument(
        "--hot", type=int, default=2, help="threads per API server whose schedstat is read each tick"
    )
    p.add_argument(
        "--graphics-every", type=int, default=2, help="GRAPHICS_UTIL read on one tick in this many"
    )
    p.add_argument("--report", type=float, default=60.0, help="seconds between JSON lines on stdout")
    args = p.parse_args(argv)
    parts = [x for x in args.parts.split(",") if x]
    unknown = set(parts) - set(PARTS)
    if unknown:
        p.error(f"unknown parts {sorted(unknown)}; of {PARTS}")
    readers: list[Any] = []
    if "nvml" in parts:
        readers.append(Nvml(args.graphics_every))
    if "engine" in parts:
        if not args.engine_url:
            p.error("engine needs --engine-url")
        readers.append(Engine(args.engine_url))
    if "procs" in parts:
        pids = [int(x) for x in args.pids.split(",") if x]
        if not pids:
            p.error("procs needs --pids")
        readers.append(Procs(pids, args.hot))
    stopping = False

    def stop(*_: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    ticks, next_at, report_at = 0, time.monotonic(), time.monotonic() + args.report

    def report() -> None:
        last = {type(r).__name__.lower(): r.last for r in readers}
        print(
            json.dumps({"parts": parts, "ticks": ticks, "cpu_s": time.process_time(), "last": last}),
            flush=True,
        )

    while not stopping:
        for r in readers:
            try:
                r.read()
            except Exception as exc:  # a part that fails is reported, the others go on
                r.last = {"error": f"{type(exc).__name__}: {exc}"}
        ticks += 1
        now = time.monotonic()
        if now >= report_at:
            report_at += args.report
            report()
        next_at += args.tick
        if next_at < now:
            next_at = now + args.tick
        time.sleep(max(0.0, next_at - time.monotonic()))
    report()
    return 0


if __name__ == "__main__":
    sys.exit(main())
