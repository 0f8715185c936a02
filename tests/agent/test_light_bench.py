"""bench/light_agent_overhead.py runs where there is no torch or GPU: GPU parts skipped, CPU parts measured."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_light_overhead_bench_runs_without_a_gpu(tmp_path: Path) -> None:
    out = tmp_path / "light.json"
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench/light_agent_overhead.py"), "--out", str(out), "--rounds", "1",
         "--seconds", "0.3"],
        capture_output=True, text=True, timeout=180, cwd=ROOT,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["order"] == ["none", "light"]
    light = next(x for x in data["runs"] if x["mode"] == "light")
    if "skipped" in light["gpu"]:
        assert "GPU workloads skipped" in light["gpu"]["skipped"]
    assert light["agent_mode"] == "light" and light["agent"]["state"] == "running"
    assert set(data["summary"]) >= {"cpu_steps", "pause"}
    assert data["summary"]["cpu_steps"]["none_per_s"] > 0 and data["messages_received"] >= 1
