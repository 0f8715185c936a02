"""Regenerate the engine test fixtures: a /proc tree of engine hosts and a page from a real multiprocess run.

    python tests/fakes/engine/make_fixtures.py

The /proc tree holds the files boundwatch reads (stat, cmdline, environ, comm, cgroup, task/*/stat)
for a host running a vLLM with 2 API servers and DP 2, a vLLM 0.10 with one API server, a
wrapper-launched vLLM, an SGLang with metrics, one without, and an unrelated Python process.
The page comes from `vllm_sim.run_engine`: prometheus_client's multiprocess mode, 4 API servers.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parents[1] / "fixtures"
PROC = FIXTURES / "proc" / "engines"
PAGE = FIXTURES / "engine" / "vllm-sim-0.11-asc4.prom"

# pid: (ppid, comm, cmdline, environ, cgroup, threads {tid: (comm, utime, stime)})
Proc = tuple[int, str, list[str], dict[str, str], str, dict[int, tuple[str, int, int]]]
VLLM_CG = "/kubepods.slice/pod-a/ctr-vllm"
SPAWN = [
    "/usr/bin/python3",
    "-c",
    "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5)",
    "--multiprocessing-fork",
]
# pid -> open fds (fd -> link target); pid -> /proc/<pid>/net/tcp LISTEN entries (port, inode)
FDS: dict[int, dict[int, str]] = {
    4700: {0: "/dev/null", 7: "socket:[91001]"},
    4701: {0: "/dev/null", 7: "socket:[91001]", 9: "socket:[91077]"},
    4702: {0: "/dev/null", 7: "socket:[91001]"},
    4703: {0: "/dev/null", 5: "pipe:[4242]", 6: "socket:[91078]"},
}
LISTEN: dict[int, list[tuple[int, int]]] = {4700: [(8004, 91001), (22, 1234)]}
PROCS: dict[int, Proc] = {
    1: (0, "systemd", ["/sbin/init"], {}, "/init.scope", {}),
    4100: (
        1,
        "vllm",
        [
            "/usr/bin/python3",
            "/usr/local/bin/vllm",
            "serve",
            "Qwen/Qwen3-8B",
            "--port",
            "8001",
            "--api-server-count",
            "2",
            "--data-parallel-size",
            "2",
        ],
        {"HOME": "/root"},
        VLLM_CG,
        {},
    ),
    4101: (
        4100,
        "VLLM::APIServer",
        ["VLLM::APIServer_0" + " " * 40],
        {"PROMETHEUS_MULTIPROC_DIR": "/tmp/vllm-mp-a1"},
        VLLM_CG,
        {4111: ("asyncio (0)", 900, 50)},
    ),
    4102: (
        4100,
        "VLLM::APIServer",
        ["VLLM::APIServer_1" + " " * 40],
        {"PROMETHEUS_MULTIPROC_DIR": "/tmp/vllm-mp-a1"},
        VLLM_CG,
        {},
    ),
    4103: (
        4100,
        "VLLM::EngineCo",
        ["VLLM::EngineCore_DP0"],
        {"PROMETHEUS_MULTIPROC_DIR": "/tmp/vllm-mp-a1"},
        VLLM_CG + "/engine",
        {},
    ),
    4104: (
        4100,
        "VLLM::EngineCo",
        ["VLLM::EngineCore_DP1"],
        {"PROMETHEUS_MULTIPROC_DIR": "/tmp/vllm-mp-a1"},
        VLLM_CG + "/engine",
        {},
    ),
    4105: (4103, "VLLM::Worker_D", ["VLLM::Worker_DP0_TP0"], {}, VLLM_CG + "/engine", {}),
    4200: (
        1,
        "python3",
        [
            "python3",
            "-m",
            "sglang.launch_server",
            "--model-path",
            "meta-llama/Llama-3.1-8B-Instruct",
            "--port",
            "30001",
            "--enable-metrics",
        ],
        {},
        "/system.slice/sglang.service",
        {},
    ),
    4201: (
        4200,
        "sglang::schedu",
        ["sglang::scheduler_TP0"],
        {"PROMETHEUS_MULTIPROC_DIR": "/tmp/sglang-mp"},
        "/system.slice/sglang.service",
        {},
    ),
    4300: (1, "python3", ["python3", "-m", "sglang.launch_server", "--port", "30002"], {}, "/", {}),
    4400: (1, "python3", ["python3", "train.py", "--vllm", "serve"], {}, "/", {}),
    4500: (
        1,
        "python",
        [
            "/opt/venv/bin/python",
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            "m",
            "--port",
            "8002",
        ],
        {},
        "/",
        {},
    ),
    4501: (
        4500,
        "python",
        [
            "/opt/venv/bin/python",
            "-c",
            "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)",
            "--multiprocessing-fork",
        ],
        {},
        "/",
        {},
    ),
    4600: (1, "python3", ["python3", "serve_wrapper.py", "--port", "8003"], {}, "/", {}),
    # vLLM 0.10 with 2 API servers: no process titles; the API servers hold the listening socket.
    4700: (
        1,
        "vllm",
        ["/usr/bin/python3", "/usr/local/bin/vllm", "serve", "m", "--port", "8004", "-asc", "2"],
        {},
        "/",
        {},
    ),
    4701: (4700, "python3", SPAWN, {"PROMETHEUS_MULTIPROC_DIR": "/tmp/vllm-010"}, "/", {}),
    4702: (4700, "python3", SPAWN, {"PROMETHEUS_MULTIPROC_DIR": "/tmp/vllm-010"}, "/", {}),
    4703: (4700, "python3", SPAWN, {"PROMETHEUS_MULTIPROC_DIR": "/tmp/vllm-010"}, "/", {}),
    4601: (4600, "VLLM::APIServer", ["VLLM::APIServer_0"], {}, "/", {}),
    4602: (4600, "VLLM::APIServer", ["VLLM::APIServer_1"], {}, "/", {}),
}


def stat_line(pid: int, comm: str, ppid: int, utime: int, stime: int, start: int) -> str:
    """Return a /proc stat line with the fields boundwatch reads set."""
    fields = ["S", ppid, pid, pid, 0, -1, 4194560, 100, 0, 0, 0, utime, stime, 0, 0, 20, 0, 1, 0, start]
    fields += [0] * 32
    return f"{pid} ({comm}) " + " ".join(str(f) for f in fields) + "\n"


def write_proc(root: Path) -> None:
    """Write the /proc tree."""
    shutil.rmtree(root, ignore_errors=True)
    for pid, (ppid, comm, cmdline, env, cgroup, threads) in PROCS.items():
        d = root / str(pid)
        (d / "task").mkdir(parents=True)
        utime, stime, start = 1000 + pid % 97, 200, 50_000 + pid
        (d / "stat").write_text(stat_line(pid, comm, ppid, utime, stime, start))
        (d / "comm").write_text(comm + "\n")
        (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in cmdline) + b"\0")
        (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))
        (d / "cgroup").write_text(f"0::{cgroup}\n")
        for fd, target in FDS.get(pid, {}).items():
            (d / "fd").mkdir(exist_ok=True)
            os.symlink(target, d / "fd" / str(fd))
        if pid in LISTEN:
            (d / "net").mkdir()
            rows = [
                "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode"
            ]
            for i, (port, inode) in enumerate(LISTEN[pid]):
                rows.append(
                    f"   {i}: 00000000:{port:04X} 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0"
                    f"        0 {inode} 1 0000000000000000 100 0 0 10 0"
                )
            rows.append(  # a connection to the same port: not a listener
                "   9: 0100007F:1F44 0100007F:D6A2 01 00000000:00000000 00:00000000 00000000     0        0 91099 1"
            )
            (d / "net" / "tcp").write_text("\n".join(rows) + "\n")
        for tid, (tcomm, tu, ts) in {
            pid: (comm, utime - 950 if utime > 950 else 0, stime - 50),
            **threads,
        }.items():
            (d / "task" / str(tid)).mkdir()
            (d / "task" / str(tid) / "stat").write_text(stat_line(tid, tcomm, ppid, tu, ts, start))


def write_page(path: Path) -> None:
    """Run 4 API servers in multiprocess mode and write the page any of them would serve, with the truth."""
    sys.path.insert(0, str(HERE))
    import vllm_sim
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess

    with tempfile.TemporaryDirectory() as mp_dir:
        truth, _ = vllm_sim.run_engine(
            mp_dir, n_servers=4, steps=300, concurrency=24, seed=11, version="0.11"
        )
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, mp_dir)
        page = generate_latest(registry).decode()
    header = (
        "# source: generated by tests/fakes/engine/make_fixtures.py: prometheus_client multiprocess mode, vLLM 0.11 "
        "metric definitions (tests/fakes/engine/vllm_sim.py), 1 EngineCore + 4 API servers, 300 steps, concurrency 24. "
        "Truth in the .truth.json beside this file.\n"
    )
    path.write_text(header + page)
    path.with_suffix(".truth.json").write_text(json.dumps(truth.__dict__, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    write_proc(PROC)
    if "--proc-only" not in sys.argv:
        write_page(PAGE)
    print(f"wrote {PROC} and {PAGE}")
