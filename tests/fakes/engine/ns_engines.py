"""Run as pid 1 of `unshare --pid --fork --mount-proc`: start titled processes, read them as the daemon does.

Usage: `python ns_engines.py SCENARIO [ARG...]`. It starts the scenario's processes, waits until
their titles show in /proc, then runs discovery, the engine source under the daemon's sampler
(two ticks) and the daemon's /metrics, and prints one JSON line: the targets, the engines of the
last Snapshot, their cgroups, and every series that /metrics shows more than once. Everything in
the namespace dies with this process.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable

from exporter.config import Config, EngineConfig, HostConfig
from exporter.sampling import Sampler
from exporter.serve.web import make_app
from exporter.sources.engine import EngineSource
from exporter.sources.engine_discovery import discover

HOLD = "import sys; sys.stdin.read()"  # a process that waits until its parent goes
# A wrapper script (not recognised as an engine) that starts titled children and, given a port,
# serves a vLLM page on one listening socket that its children inherit, as vLLM's API servers do.
WRAPPER = """
import http.server, os, socket, subprocess, sys, threading
titles, port = sys.argv[1].split(","), int(sys.argv[2])
fds = ()
if port:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(16)
    page = b'vllm:num_requests_running{engine="0",model_name="m"} 4\\n'

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *a):
            pass

    server = http.server.HTTPServer(("127.0.0.1", port), H, bind_and_activate=False)
    server.socket = sock
    threading.Thread(target=server.serve_forever, daemon=True).start()
    fds = (sock.fileno(),)
kids = [
    subprocess.Popen([t, "-c", "import sys; sys.stdin.read()"], executable=os.environ["BW_PYTHON"],
                     stdin=subprocess.PIPE, pass_fds=fds)
    for t in titles
]
print("ready", flush=True)
sys.stdin.read()
"""


# An engine's main process that listens where its flags say (`--bind`: the address; IP_FREEBIND, so an
# address this network namespace lacks can be bound), as vLLM's API server does at `--host`.
LISTEN = """
import socket, sys
addr, port = sys.argv[sys.argv.index("--bind") + 1], int(sys.argv[sys.argv.index("--port") + 1])
sock = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET)
sock.setsockopt(socket.SOL_IP, 15, 1)
sock.bind((addr, port))
sock.listen(4)
print("ready", flush=True)
sys.stdin.read()
"""
MANY = 40  # engines started by `many_engines`: past discovery's bound


def spawn(argv: list[str], cwd: str | None = None) -> subprocess.Popen[str]:
    """Start a process whose command line is argv (argv[0] may be any title), running Python."""
    return subprocess.Popen(
        argv, executable=sys.executable, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=cwd
    )


def wrapper(titles: list[str], port: int = 0) -> subprocess.Popen[str]:
    proc = spawn(["python3", "-c", WRAPPER, ",".join(titles), str(port)])
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(count: int, shows: Callable[[list[bytes]], bool], what: str, seconds: float) -> None:
    """Wait until count processes' command lines (as words) show what `shows` looks for."""
    end = time.monotonic() + seconds
    seen = 0
    while time.monotonic() < end:
        seen = 0
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as fh:
                        seen += shows(fh.read().split(b"\0"))
                except OSError:
                    pass
        if seen >= count:
            return
        time.sleep(0.05)
    raise SystemExit(f"{what} did not show: {seen} of {count}")


def wait_for_serving(count: int) -> None:
    """Wait until count processes show `serve` on their command line."""
    _wait_for(count, lambda words: b"serve" in words, "engines", 20)


def loopback_up() -> None:
    """Bring up `lo` in a network namespace of this test's own (`unshare --net`: it starts down)."""
    import fcntl
    import struct

    siocsifflags, up, loopback, running = 0x8914, 0x1, 0x8, 0x40
    with socket.socket() as s:
        fcntl.ioctl(s, siocsifflags, struct.pack("16sH", b"lo", up | loopback | running))


def wait_for_titles(count: int) -> None:
    """Wait until count processes titled APIServer_<i> show in the table."""
    _wait_for(count, lambda words: b"APIServer_" in words[0], "titles", 10)


def into_cgroup(path: str, pids: list[int]) -> None:
    for pid in pids:
        with open(os.path.join(path, "cgroup.procs"), "w") as fh:
            fh.write(str(pid))


def children_of(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as fh:
        return [int(p) for p in fh.read().split()]


def scenario(name: str, args: list[str]) -> list[subprocess.Popen[str]]:
    """Start a scenario's processes and return them (kept alive while this process runs)."""
    if name == "one_parent":  # three unrelated APIServer_0 under one wrapper
        return [wrapper(["VLLM::APIServer_0"] * 3)]
    if name == "three_parents":  # each under a wrapper of its own
        return [wrapper(["VLLM::APIServer_0"]) for _ in range(3)]
    if name == "under_init":  # orphans of this namespace's init
        return [spawn(["VLLM::APIServer_0", "-c", HOLD]) for _ in range(3)]
    if name == "wrapped_engine":  # a real wrapper: two API servers on one listening socket, no --port
        return [wrapper(["VLLM::APIServer_0", "VLLM::APIServer_1"], int(args[0]))]
    if name == "batch_limits":
        cwd = args[0]
        procs = [
            spawn(
                [
                    "python3",
                    "-c",
                    HOLD,
                    "vllm",
                    "serve",
                    "m",
                    "--port",
                    "18001",
                    "--max-num-seqs",
                    "64",
                    "-O",
                    '{"max_cudagraph_capture_size": 64}',
                    "--speculative-config",
                    '{"num_speculative_tokens": 1}',
                ]
            ),
            spawn(
                ["python3", "-c", HOLD, "vllm", "serve", "m", "--port", "18002", "--config", "cfg.yaml"], cwd
            ),
            spawn(["python3", "-c", HOLD, "vllm", "serve", "m", "--port", "18003"]),
            spawn(
                [
                    "python3",
                    "-c",
                    HOLD,
                    "-m",
                    "sglang.launch_server",
                    "--enable-metrics",
                    "--port",
                    "18004",
                    "--max-running-requests",
                    "48",
                    "--disable-cuda-graph",
                ]
            ),
        ]
        return procs
    if name == "quota_on_api_servers":  # vLLM main, 2 API servers in a 0.2-core cgroup, an engine core apart
        api_cgroup, core_cgroup = args
        main = spawn(
            [
                "python3",
                "-c",
                WRAPPER.replace(
                    "kids = [",
                    "kids = [subprocess.Popen(['VLLM::EngineCore_0', '-c', 'import sys; sys.stdin.read()'], executable=os.environ['BW_PYTHON'], stdin=subprocess.PIPE)] + [",
                ),
                "VLLM::APIServer_0,VLLM::APIServer_1",
                "0",
                "vllm",
                "serve",
                "m",
            ]
        )
        assert main.stdout is not None and main.stdout.readline().strip() == "ready"
        time.sleep(0.2)
        kids = children_of(main.pid)
        titles = {}
        for pid in kids:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                titles[pid] = fh.read().split(b"\0")[0].decode()
        into_cgroup(api_cgroup, [p for p, t in titles.items() if "APIServer" in t])
        into_cgroup(core_cgroup, [p for p, t in titles.items() if "EngineCore" in t])
        return [main]
    if name == "many_engines":  # processes that look like engines, more than discovery reads at once
        return [
            spawn(["python3", "-c", HOLD, "vllm", "serve", "m", "--port", str(21000 + i)])
            for i in range(MANY)
        ]
    if name == "named_hosts":  # --host: an address nobody listens at, one listened at, a name, loopback v6
        procs = [
            spawn(["python3", "-c", HOLD, "vllm", "serve", "m", "--port", "22001", "--host", "10.9.9.9"]),
            spawn(["python3", "-c", LISTEN, "vllm", "serve", "m", "--port", "22002", "--host", "10.9.9.8", "--bind", "10.9.9.8"]),
            spawn(["python3", "-c", LISTEN, "vllm", "serve", "m", "--port", "22003", "--host", "gpu-box", "--bind", "10.9.9.7"]),
            spawn(["python3", "-c", LISTEN, "vllm", "serve", "m", "--port", "22004", "--host", "gpu-box", "--bind", "0.0.0.0"]),
            spawn(["python3", "-c", HOLD, "vllm", "serve", "m", "--port", "22005", "--host", "::1"]),
        ]  # fmt: skip
        for p in procs:
            if "--bind" in p.args:
                assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        return procs
    if name == "impostor":  # a process with only the command line, started first, and the engine that listens
        impostor = spawn(["python3", "-c", HOLD, "vllm", "serve", "m", "--port", "22100"])
        time.sleep(0.2)  # the impostor's pid is the lower one
        real = spawn(
            ["python3", "-c", LISTEN, "vllm", "serve", "m", "--port", "22100", "--bind", "127.0.0.1"]
        )
        assert real.stdout is not None and real.stdout.readline().strip() == "ready"
        return [impostor, real]
    raise SystemExit(f"unknown scenario {name}")


async def read_like_the_daemon() -> dict[str, object]:
    cfg = dataclasses.replace(
        Config(),
        tick_seconds=0.5,
        engine=EngineConfig(),
        host=HostConfig(proc_root="/proc", cgroup_root="/sys/fs/cgroup"),
    )
    targets = discover("/proc")
    source = EngineSource(cfg)
    sampler = Sampler(cfg, [source])
    try:
        # Two reads that came in on their tick: the second has CPU since the first (on a crowded
        # host a read may outlast its tick and be reused, so fixed two ticks could both carry read 1).
        done = 0
        for _ in range(40):
            snap = await sampler.tick()
            done += not any(st.late for st in snap.sources)
            if done == 2:
                break
            await asyncio.sleep(0.3)
        from aiohttp.test_utils import TestClient, TestServer

        async with TestClient(TestServer(make_app(cfg, sampler), host="127.0.0.1")) as client:
            metrics = await (await client.get("/metrics")).text()
    finally:
        await source.aclose()
    series = collections.Counter(
        line.rsplit(" ", 1)[0] for line in metrics.splitlines() if line and not line.startswith("#")
    )
    return {
        "targets": [
            {
                "name": t.name,
                "url": t.url,
                "servers": len(t.api_server_pids),
                "root_is_server": t.root_pid in t.api_server_pids,
                "port_known": getattr(t, "port_known", None),
                "root_listens": "--bind" in _cmdline(t.root_pid),  # this scenario's listeners have --bind
                "max_num_seqs": getattr(t, "max_num_seqs", None),
            }
            for t in targets
        ],
        "engines": [
            {
                "name": e.name,
                "error": e.error,
                "running": e.running,
                "max_num_seqs": e.max_num_seqs,
                "graph_config": dataclasses.asdict(e.graph_config) if e.graph_config else None,
                "api_server_count": e.api_server_count,
                "servers": [s for s, _ in e.servers()],
                "server_cgroups": sorted({p.cgroup or "" for p in e.api_servers}),
                "cgroups": {c.path: c.quota_cores for c in e.cgroups},
            }
            for e in snap.engines
        ],
        "duplicates": sorted(k for k, n in series.items() if n > 1),
        "over_bound": {st.name: st.over_bound for st in snap.sources},
        "over_bound_series": sorted(
            k + " " + str(v) for k, v in _values(metrics, "boundwatch_source_over_bound")
        ),
        "engine_labels": sorted(set(re.findall(r'engine="([^"]*)"', metrics))),
        "saturated_series": sorted(k for k in series if k.startswith("boundwatch_api_server_saturated")),
    }


def _cmdline(pid: int | None) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().decode().split("\0")
    except OSError:
        return []


def _values(metrics: str, name: str) -> list[tuple[str, float]]:
    """Return one family's samples on a page: (series, value)."""
    out = []
    for line in metrics.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            key, value = line.rsplit(" ", 1)
            out.append((key, float(value)))
    return out


def main() -> None:
    name, *args = sys.argv[1:]
    os.environ["BW_PYTHON"] = sys.executable  # a python that keeps the title it is started with
    if os.environ.get("BW_NS_NET") == "own":
        loopback_up()
    procs = scenario(name, args)
    if name in ("many_engines", "named_hosts", "impostor"):
        wait_for_serving({"many_engines": MANY, "named_hosts": 5, "impostor": 2}[name])
    wait_for_titles(
        {"batch_limits": 0, "many_engines": 0, "named_hosts": 0, "impostor": 0}.get(
            name, 2 if name == "wrapped_engine" else 3 if name != "quota_on_api_servers" else 2
        )
    )
    print(json.dumps(asyncio.run(read_like_the_daemon())), flush=True)
    for p in procs:
        p.kill()


if __name__ == "__main__":
    main()
