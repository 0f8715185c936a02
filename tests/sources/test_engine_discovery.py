"""Discovery on a process table of fixture files: which processes are engines, their API servers, ports and dirs.

The table is `tests/fixtures/proc/engines` (a copy where a test changes it); discovery in a PID
namespace of its own, with processes that run, is in test_engine_discovery_ns.py.
"""

from __future__ import annotations

from engine_fixtures import PROC

from exporter.sources.engine_discovery import configured_target, discover, merge_targets


def test_discovery_finds_every_engine_with_its_api_servers_and_multiprocess_dir():
    targets = {t.name: t for t in discover(str(PROC))}
    assert sorted(targets) == ["sglang:30001", "vllm:8001", "vllm:8002", "vllm:8003", "vllm:8004"]
    v = targets["vllm:8001"]
    assert v.url == "http://127.0.0.1:8001/metrics"
    assert v.api_server_pids == (4101, 4102) and v.api_server_count_cmdline == 2
    assert v.multiproc_dir == "/tmp/vllm-mp-a1"
    assert set(v.engine_pids) == {4100, 4101, 4102, 4103, 4104, 4105}
    assert targets["vllm:8002"].api_server_pids == (4500,)  # one API server: the main process serves
    assert targets["vllm:8003"].api_server_pids == (4601, 4602)  # launched by a wrapper script
    assert targets["sglang:30001"].multiproc_dir == "/tmp/sglang-mp"
    # vLLM 0.10 sets no titles: its API servers are the children holding the listening socket.
    assert targets["vllm:8004"].api_server_pids == (4701, 4702)
    assert targets["vllm:8004"].api_server_count_cmdline == 2


def test_a_configured_url_on_a_discovered_port_joins_that_engine():
    merged = merge_targets([configured_target("http://localhost:8001/metrics")], discover(str(PROC)))
    joined = [t for t in merged if t.url == "http://localhost:8001/metrics"]
    assert len(joined) == 1 and joined[0].root_pid == 4100 and joined[0].name == "vllm:8001"
    assert len(merged) == 5


def test_a_multiprocess_dir_inside_another_container_is_reached_through_proc_root(tmp_path):
    import shutil

    import vllm_sim

    proc_root = tmp_path / "proc"
    shutil.copytree(PROC, proc_root, symlinks=True)
    inside = proc_root / "4101" / "root" / "tmp" / "vllm-mp-a1"  # the engine's /tmp, seen from the host
    inside.mkdir(parents=True)
    vllm_sim.run_engine(str(inside), n_servers=1, steps=5, concurrency=2)
    targets = {t.name: t for t in discover(str(proc_root))}
    assert targets["vllm:8001"].multiproc_dir == str(inside)
    assert (
        targets["sglang:30001"].multiproc_dir == "/tmp/sglang-mp"
    )  # not reachable: kept as found, HTTP used


def test_command_lines_int_refuses_are_no_engine_flags_and_stop_no_discovery(tmp_path):
    from exporter.sources.engine_discovery import MAX_API_SERVERS, find_engines
    from exporter.sources.procs import ProcInfo

    hold = ("python3", "-c", "pass")
    table = [
        # digits int() refuses: a superscript port, a 5,000-digit batch limit and API-server count
        ProcInfo(10, 1, "python3", (*hold, "vllm", "serve", "m", "--port", "\u00b2", "--max-num-seqs", "9" * 5000), 1),
        ProcInfo(20, 1, "python3", (*hold, "vllm", "serve", "m", "--port", "8001", "-asc", "7" * 5000), 2),
        # under the engine at 8001: a title whose index has 5,000 digits, and more API servers than are read
        ProcInfo(21, 20, "python3", ("VLLM::APIServer_" + "1" * 5000,), 3),
        *(ProcInfo(100 + i, 20, "python3", (f"VLLM::APIServer_{i}",), 4) for i in range(MAX_API_SERVERS + 6)),
    ]  # fmt: skip
    targets, unread = find_engines(str(tmp_path), table)
    assert unread == 0
    by_name = {t.name: t for t in targets}
    assert set(by_name) == {"vllm:8000", "vllm:8001"}  # the superscript port: the default port
    assert by_name["vllm:8000"].max_num_seqs is None
    served = by_name["vllm:8001"]
    assert served.api_server_count_cmdline is None and 21 not in served.api_server_pids
    assert served.api_server_pids == tuple(100 + i for i in range(MAX_API_SERVERS))
    assert served.over_bound == 6 and by_name["vllm:8000"].over_bound == 0


def test_an_engine_command_line_or_environment_cut_at_its_bound_counts_as_over_bound(tmp_path):
    from exporter.sources import procs
    from exporter.sources.engine_discovery import find_engines
    from exporter.sources.procs import ProcInfo

    hold = ("python3", "-c", "pass")
    flags = (*hold, "vllm", "serve", "m", "--port")
    table = [
        ProcInfo(10, 1, "python3", (*flags, "8001"), 1, cmdline_cut=True),  # flags past 64 KiB unread
        ProcInfo(20, 1, "python3", (*flags, "8002"), 2),
        ProcInfo(21, 20, "python3", ("VLLM::APIServer_0",), 3),
        ProcInfo(22, 20, "python3", ("VLLM::EngineCore_0",), 3),
    ]
    for pid, env in (
        (21, b"PROMETHEUS_MULTIPROC_DIR=/tmp/mp\0"),
        (22, b"A=" + b"x" * procs.MAX_ENVIRON_BYTES),
    ):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "environ").write_bytes(env)
    by_name = {t.name: t for t in find_engines(str(tmp_path), table)[0]}
    assert by_name["vllm:8001"].over_bound == 1
    assert (
        by_name["vllm:8002"].over_bound == 1
    )  # the engine core's environment, read once though listed twice
    assert by_name["vllm:8002"].multiproc_dir == "/tmp/mp"


def test_each_network_namespace_s_tcp_table_is_read_once_a_discovery(tmp_path, monkeypatch):
    import os
    import shutil

    from exporter.sources import procs

    proc_root = tmp_path / "proc"
    shutil.copytree(PROC, proc_root, symlinks=True)
    pids = [p for p in os.listdir(proc_root) if p.isdigit()]
    for pid in pids:  # every process in one network namespace, sharing the table of 4700's
        (proc_root / pid / "ns").mkdir(exist_ok=True)
        os.symlink("net:[4026531840]", proc_root / pid / "ns" / "net")
        if pid != "4700" and not (proc_root / pid / "net").exists():
            shutil.copytree(proc_root / "4700" / "net", proc_root / pid / "net")
    read: list[int] = []
    real = procs._listening

    def counted(root: str, pid: int) -> dict[int, tuple[str, int]]:
        read.append(pid)
        return real(root, pid)

    monkeypatch.setattr(procs, "_listening", counted)
    once = {t.name: t for t in discover(str(proc_root))}
    assert len(read) == 1  # 3 reads before, one a process that asked
    for pid in pids:  # the same table, each process's own namespace: read per process, as without one
        os.remove(proc_root / pid / "ns" / "net")
        os.symlink(f"net:[{pid}]", proc_root / pid / "ns" / "net")
    read.clear()
    each = {t.name: t for t in discover(str(proc_root))}
    assert len(read) == 3 and once == each
