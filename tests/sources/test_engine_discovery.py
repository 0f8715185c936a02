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
