"""Discovery in a PID namespace of its own: titled processes as the field has them, read as the daemon does.

Each test runs `ns_engines.py` as pid 1 of `unshare --pid --fork --mount-proc` (we are root), so
the process table holds only the scenario's processes.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from engine_fixtures import HERE

from tests.fakes.cgroups import remove_cgroups

ROOT = Path(__file__).resolve().parents[2]
CPU_V1 = Path("/sys/fs/cgroup/cpu")

pytestmark = pytest.mark.skipif(
    shutil.which("unshare") is None or os.geteuid() != 0, reason="needs unshare and root"
)


def run_scenario(name: str, *args: str, own_network: bool = False) -> dict:
    """Run a scenario as pid 1 of a PID namespace; `own_network`: in a network namespace of its own too
    (nothing it names can be reached from it)."""
    out = subprocess.run(
        [
            "unshare",
            "--pid",
            "--fork",
            "--mount-proc",
            *(["--net"] if own_network else []),
            sys.executable,
            str(HERE / "ns_engines.py"),
            name,
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "BOUNDWATCH_LOG_FORMAT": "json",
            **({"BW_NS_NET": "own"} if own_network else {}),
        },
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(x for x in reversed(out.stdout.splitlines()) if x.startswith("{"))
    return json.loads(line)


@pytest.mark.parametrize("layout", ["one_parent", "three_parents", "under_init"])
def test_three_unrelated_api_servers_are_three_engines_without_a_duplicate_series(layout):
    got = run_scenario(layout)
    names = [e["name"] for e in got["engines"]]
    assert sorted(names) == ["vllm:8000", "vllm:8000-2", "vllm:8000-3"]
    assert got["duplicates"] == []
    assert all(e["servers"] == ["0"] and e["api_server_count"] == 1 for e in got["engines"])
    # Only one of them may read the page at the default port; the others have no URL of their own.
    assert sum(1 for t in got["targets"] if t["url"]) == 1
    assert len(got["saturated_series"]) == 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_wrapper_with_two_api_servers_on_one_socket_is_one_engine_at_the_port_it_listens_on():
    port = free_port()
    got = run_scenario("wrapped_engine", str(port))
    (target,) = got["targets"]
    assert (target["name"], target["servers"], target["port_known"]) == (f"vllm:{port}", 2, True)
    (engine,) = got["engines"]
    assert (engine["error"], engine["running"], engine["servers"]) == ("", 4.0, ["0", "1"])
    assert got["duplicates"] == []


def test_the_batch_limit_comes_from_the_engine_command_line_or_its_config_file(tmp_path):
    (tmp_path / "cfg.yaml").write_text("model: m\n# a comment\nmax-num-seqs: 96  # per engine\n")
    got = run_scenario("batch_limits", str(tmp_path))
    limits = {t["name"]: t["max_num_seqs"] for t in got["targets"]}
    assert limits == {"vllm:18001": 64, "vllm:18002": 96, "vllm:18003": None, "sglang:18004": 48}
    assert {e["name"]: e["max_num_seqs"] for e in got["engines"]} == limits  # in every reading, page or not
    graphs = {e["name"]: e["graph_config"] for e in got["engines"]}
    assert graphs["vllm:18001"] == {"off": False, "capture_limit": 64, "limit_in_tokens": True, "spec_tokens": 1,
                                    "source": "max_cudagraph_capture_size", "refused": 0}  # fmt: skip
    assert graphs["sglang:18004"]["off"] is True and graphs["vllm:18003"] is None


@pytest.fixture
def cgroups():
    if not (CPU_V1 / "cpu.cfs_quota_us").exists() or not os.access(CPU_V1, os.W_OK):
        pytest.skip("needs a writable cgroup v1 cpu hierarchy")
    base = CPU_V1 / f"bw-test-{os.getpid()}"
    api, core = base / "api", base / "core"
    for d in (base, api, core):
        d.mkdir()
    (api / "cpu.cfs_period_us").write_text("100000")
    (api / "cpu.cfs_quota_us").write_text("20000")  # 0.2 of a core for the API servers alone
    yield api, core
    remove_cgroups((api, core, base))


def test_the_api_servers_and_the_engine_core_cgroups_are_all_in_the_reading(cgroups):
    api, core = cgroups
    got = run_scenario("quota_on_api_servers", str(api), str(core))
    (engine,) = got["engines"]
    rel_api, rel_core = "/" + str(api.relative_to(CPU_V1)), "/" + str(core.relative_to(CPU_V1))
    assert engine["cgroups"][rel_api] == pytest.approx(0.2)
    assert rel_core in engine["cgroups"]
    assert engine["server_cgroups"] == [rel_api]


def test_processes_that_look_like_engines_past_the_bound_are_counted_and_not_read():
    got = run_scenario("many_engines", own_network=True)
    # the 32 started first are read; the 8 started last are counted, in the source's status and on the page
    assert sorted(t["name"] for t in got["targets"]) == [f"vllm:{21000 + i}" for i in range(32)]
    assert got["over_bound"] == {"engine": 8}
    assert 'boundwatch_source_over_bound{source="engine"} 8.0' in got["over_bound_series"]
    assert len(got["engine_labels"]) == 32 and got["duplicates"] == []


def test_a_page_is_read_only_at_loopback_or_where_the_engine_itself_listens():
    got = run_scenario("named_hosts", own_network=True)
    urls = {t["name"]: t["url"] for t in got["targets"]}
    assert urls == {
        "vllm:22001": "http://127.0.0.1:22001/metrics",  # --host names an address nobody listens at
        "vllm:22002": "http://10.9.9.8:22002/metrics",  # the engine listens at the address it names
        "vllm:22003": "http://10.9.9.7:22003/metrics",  # a host name: the address its socket is bound to
        "vllm:22004": "http://127.0.0.1:22004/metrics",  # a host name, bound to every address
        "vllm:22005": "http://[::1]:22005/metrics",  # loopback, v6
    }
    assert got["over_bound"]["engine"] == 0


def test_of_two_engines_named_alike_the_one_that_listens_on_the_port_keeps_the_name_and_the_page():
    """A process that only has `vllm serve --port N` on its command line, started first, is not the engine."""
    got = run_scenario("impostor", own_network=True)
    by_name = {t["name"]: t for t in got["targets"]}
    assert sorted(by_name) == ["vllm:22100", "vllm:22100-2"]
    assert (
        by_name["vllm:22100"]["root_listens"]
        and by_name["vllm:22100"]["url"] == "http://127.0.0.1:22100/metrics"
    )
    assert not by_name["vllm:22100-2"]["root_listens"] and by_name["vllm:22100-2"]["url"] == ""
