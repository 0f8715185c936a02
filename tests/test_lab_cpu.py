"""The scenario lab on the CPU path: API servers that hold requests before the engine, read by the real daemon.

The lab (bench/scenarios/lab.py --device cpu) runs its whole stack without a GPU: the engine
sleeps for each step's GPU time and publishes it to an NVML stand-in the daemon loads, quotas are
emulated. In its own PID namespace the daemon discovers only the lab's `vllm serve`.
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from exporter.snapshot.codec import read_lines
from tests.fakes.wait import wait_until

ROOT = Path(__file__).resolve().parents[1]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _gauge(port: int, name: str) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return None


def _titles(pids: list[int]) -> list[str]:
    return [Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode() for pid in pids]


def test_serve_titles_processes_and_drives_vllm_gauges(tmp_path: Path) -> None:
    port = _port()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "bench/scenarios/vllm"), "serve", "--port", str(port), "--device", "cpu",
         "--work", str(tmp_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdin is not None
        ready = json.loads(proc.stdout.readline().removeprefix("READY "))
        assert _titles([ready["engine_pid"], *ready["api_server_pids"]]) == [
            "VLLM::EngineCore",
            "VLLM::APIServer_0",
        ]

        def cmd(line: str) -> dict:
            proc.stdin.write(line + "\n")
            proc.stdin.flush()
            got = proc.stdout.readline()
            assert got.startswith("OK "), got
            return json.loads(got.split(" ", 2)[2])

        pids = cmd("servers 4")["pids"]
        assert _titles(pids) == [f"VLLM::APIServer_{i}" for i in range(4)]
        cmd("load short 32")
        # 32 closed-loop clients against max_num_seqs 8: the batch fills and the rest wait in the engine
        wait_until(lambda: _gauge(port, "vllm:num_requests_running") == 8, 15, 0.1, "8 running")
        wait_until(lambda: (_gauge(port, "vllm:num_requests_waiting") or 0) >= 10, 15, 0.1, "10 waiting")
        wait_until(lambda: (_gauge(port, "vllm:iteration_tokens_total_count") or 0) > 50, 15, 0.1, "50 steps")
        cmd("load idle 0")
        wait_until(lambda: _gauge(port, "vllm:num_requests_running") == 0, 15, 0.1, "none running")
        assert _gauge(port, "vllm:num_requests_waiting") == 0
        proc.stdin.write("stop\n")
        proc.stdin.flush()
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")
def test_lab_on_cpu_scores_work_held_before_the_engine(tmp_path: Path) -> None:
    """Every scenario runs; the saturated API server, the container's quota and idle are scored against the truth."""
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "bench/scenarios/lab.py",
         "--device", "cpu", "--seconds", "6", "--out", str(tmp_path), "--name", "lab-cpu"],
        capture_output=True, text=True, cwd=ROOT, timeout=400,
        env={k: v for k, v in os.environ.items() if not k.startswith("BOUNDWATCH_")},  # defaults: the gate on
    )  # fmt: skip
    results = json.loads((tmp_path / "lab-cpu.json").read_text())
    assert "error" not in results, results.get("error")
    assert results["daemon_env"] == {}  # the daemon's defaults: the estimates checked below are the default's
    print(done.stdout[-3000:])  # the lab's table, shown when an assertion below fails
    rows = {r["scenario"]: r for r in results["scores"]}
    assert list(rows) == [
        "api_server_saturated",
        "gpu_bound_decode",
        "fix_four_api_servers",
        "eager_decode",
        "quota_api_servers",
        "quota_container",
        "idle",
    ], done.stdout[-2000:]

    # The truth is the field's: one API server's main thread saturated by tokenising (its demand:
    # CPU plus run-queue wait, as a shared CI machine may not give it a whole core) while the
    # engine's queue is empty and it runs under one request on average.
    sat = rows["api_server_saturated"]["truth"]
    assert sat["api_main_demand"][0] >= 0.8
    assert sat["waiting"] == 0 and sat["running_mean"] < 1.0
    assert 0.05 < sat["busy"] < 0.7
    assert rows["idle"]["truth"]["busy"] == 0 and rows["idle"]["truth"]["running_mean"] == 0
    assert len(rows["gpu_bound_decode"]["truth"]["api_main_cores"]) == 4

    # The verdicts: work stuck before the engine is host-bound, nothing offered is idle.
    assert rows["idle"]["right_share"] >= 0.8, _why(rows["idle"])
    # The container's quota holds the engine's host side back (its graph steps spin their host part,
    # bench/scenarios/engine.py cpu_host_ms) while its queue is full: the GPU idles, host-bound.
    box = rows["quota_container"]["truth"]
    assert box["busy"] < 0.6 and box["running_mean"] > 4, box
    assert rows["quota_container"]["right_share"] >= 0.8, _why(rows["quota_container"])
    assert rows["api_server_saturated"]["right_share"] >= 0.8, _why(rows["api_server_saturated"])

    rec = tmp_path / "lab-cpu.jsonl.gz"
    assert rec.stat().st_size < 2_000_000
    with gzip.open(rec, "rt") as fh:
        head, it = read_lines(fh)
        snaps = list(it)
        servers = {len(e.api_servers) for s in snaps for e in s.engines}
    assert [s["name"] for s in head["schedule"]] == list(rows)
    assert {1, 4} <= servers

    # GRAPHICS_UTIL, live: estimated only away from every edge the last verdict gave (nvml.GraphicsGate).
    estimated = near = 0
    for prev, snap in itertools.pairwise(snaps):
        g, v = snap.gpu(0), next((v for v in prev.verdicts if v.gpu == 0), None)
        if g is None or g.gpm is None or g.gpm.graphics is None or not g.gpm.graphics_estimated:
            continue
        if snap.seq != prev.seq + 1:  # the lab's poll missed a tick: the edges read are not known
            continue
        estimated += 1
        assert v is not None and v.edges  # no verdict, no estimate
        near += any(abs(g.gpm.graphics - e) <= 0.10 for e in v.edges)
    assert estimated > 0 and near == 0


def _why(row: dict) -> tuple:
    """Return what a failed share should show: the share, the wrong verdicts and what was said (a row's dict is cut)."""
    return row["right_share"], row["ticks_scored"], row["wrong"], row["said"], row["right_after_seconds"]


# A tick's verdict reads a 1.5 s window and the tick before it: until 2 s after a switch it holds the
# scenario before (eager_decode's steps, really eager), and a loaded machine reads a tick late.
_SETTLE = 2.5


def _reason_ticks(recording: Path) -> dict[str, tuple[int, int]]:
    """Return, per scenario, (ticks after its first _SETTLE s, those whose verdict gives cuda_graph_fallback)."""
    with gzip.open(recording, "rt") as fh:
        head, it = read_lines(fh)
        snaps = list(it)
    out = {}
    for sc in head["schedule"]:
        ticks = [s for s in snaps if sc["start"] + _SETTLE <= s.at <= sc["end"]]
        fallback = [s for s in ticks if any("cuda_graph_fallback" in v.reasons for v in s.verdicts)]
        out[sc["name"]] = (len(ticks), len(fallback))
    return out


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")
def test_lab_on_cpu_with_the_light_agent_reads_eager_decode_and_no_fallback_where_graphs_replay(
    tmp_path: Path,
) -> None:
    """The CPU engine replays stand-in CUDA graphs (bench/scenarios/cpugraphs) and the light agent counts them.

    Eager decode replays none: `cuda_graph_fallback`. An engine held back by its API servers (one
    saturated, or all throttled) steps a request at a time, in bursts: a sampled replay count missed
    them and read that engine as eager too (bench/README.md, session 30); every replay is counted now.
    """
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "bench/scenarios/lab.py",
         "--device", "cpu", "--agent", "light", "--seconds", "9", "--out", str(tmp_path), "--name", "lab-light",
         "--only", "api_server_saturated,eager_decode,quota_api_servers"],
        capture_output=True, text=True, cwd=ROOT, timeout=400,
        env={k: v for k, v in os.environ.items() if not k.startswith("BOUNDWATCH_")},
    )  # fmt: skip
    results = json.loads((tmp_path / "lab-light.json").read_text())
    assert "error" not in results, results.get("error")
    print(done.stdout[-3000:])
    assert results["engine"]["cpu_graphs"] == 5 and results["engine"]["agent"] == "running", results["engine"]
    ticks = _reason_ticks(tmp_path / "lab-light.jsonl.gz")
    n, fallback = ticks["eager_decode"]
    assert n >= 8 and fallback >= 0.8 * n, ticks
    for name in ("api_server_saturated", "quota_api_servers"):
        n, fallback = ticks[name]
        assert n >= 8 and fallback == 0, (name, ticks)
    rows = {r["scenario"]: r for r in results["scores"]}
    assert rows["quota_api_servers"]["right_share"] >= 0.8, _why(rows["quota_api_servers"])
