"""The plugin through vLLM's own `load_general_plugins`, forked the way `vllm serve` forks EngineCore.

Needs a real vLLM: skipped unless it imports here or BOUNDWATCH_TEST_ENGINES_PYTHON names an
interpreter that has it (the developer machine's /work/venvs/engines: vLLM 0.33.0, torch 2.14 CUDA
build, no GPU needed). The entry point is registered through a dist-info written to a temp dir.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CODE = """
import json, os, sys
import vllm.plugins
vllm.plugins.load_general_plugins()                 # the API server: the first load in the process
before = "vllm.v1.engine.core" in sys.modules
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    vllm.plugins.load_general_plugins()             # what EngineCore.__init__ does: nothing, plugins_loaded
    import vllm.v1.engine.core as core
    import vllm.v1.worker.worker_base as wb
    import vllm.v1.worker.gpu.model_runner as v2
    import vllm.v1.worker.gpu_model_runner as v1
    out = {
        "step": getattr(core.EngineCore.step, "__boundwatch__", False),
        "batch_queue": getattr(core.EngineCore.step_with_batch_queue, "__boundwatch__", False),
        "init_device": getattr(wb.WorkerWrapperBase.init_device, "__boundwatch__", False),
        "v2_dispatch": getattr(v2.dispatch_cg_and_sync_dp, "__boundwatch__", False),
        "v2_execute": getattr(v2.GPUModelRunner.execute_model, "__boundwatch__", False),
        "v1_determine": getattr(v1.GPUModelRunner._determine_batch_execution_and_padding, "__boundwatch__", False),
        "plugins_loaded": vllm.plugins.plugins_loaded,
    }
    os.write(w, json.dumps(out).encode())
    os._exit(0)
os.close(w)
os.waitpid(pid, 0)
child = json.loads(os.read(r, 65536))
print(json.dumps({"before": before, **child}))
"""


def engines_python() -> str:
    python = os.environ.get("BOUNDWATCH_TEST_ENGINES_PYTHON") or sys.executable
    probe = subprocess.run([python, "-c", "import vllm.plugins"], capture_output=True, timeout=300)
    if probe.returncode != 0:
        pytest.skip("no vLLM for this interpreter (set BOUNDWATCH_TEST_ENGINES_PYTHON)")
    return python


def test_real_loader_in_a_forked_engine_core_finds_step_wrapped(tmp_path: Path) -> None:
    python = engines_python()
    dist = tmp_path / "eps" / "boundwatch_test-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: boundwatch-test\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(
        "[vllm.general_plugins]\nboundwatch = exporter.agent.plugins:vllm_plugin\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOUNDWATCH")}
    env["PYTHONPATH"] = f"{tmp_path / 'eps'}{os.pathsep}{ROOT}"
    env["BOUNDWATCH_AGENT_SOCKET"] = str(tmp_path / "agent.sock")
    env["VLLM_PLUGINS"] = "boundwatch"
    r = subprocess.run(
        [python, "-c", CODE], env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out.pop("before") is False  # the first load came before vllm.v1.engine.core was imported
    assert all(out.values()), out
