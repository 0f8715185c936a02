"""The names and signatures the plugins patch, read (AST, no import) from a real vLLM / SGLang source tree.

Skipped unless the package is installed or BOUNDWATCH_TEST_ENGINE_SRC names a directory holding the
unpacked wheels (`unzip vllm-0.33.0-*.whl` there). A real CUDAGraph class is checked where torch imports
(BOUNDWATCH_TEST_TORCH_PYTHON may name an interpreter that has it).
"""

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def source_root(package: str) -> Path:
    env = os.environ.get("BOUNDWATCH_TEST_ENGINE_SRC")
    if env and (Path(env) / package).is_dir():
        return Path(env)
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{package} is not installed and BOUNDWATCH_TEST_ENGINE_SRC does not hold it")
    return Path(next(iter(spec.submodule_search_locations))).parent


def tree(root: Path, rel: str) -> ast.Module:
    return ast.parse((root / rel).read_text())


def method_args(mod: ast.Module, cls: str, name: str) -> list[str]:
    for node in ast.walk(mod):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return [a.arg for a in item.args.args]
    raise AssertionError(f"{cls}.{name} not found")


def names_in(mod: ast.Module) -> set[str]:
    out = set()
    for node in ast.walk(mod):
        if isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.alias):
            out.add(node.asname or node.name)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out.add(node.name)
    return out


def test_vllm_patch_points() -> None:
    root = source_root("vllm")
    core = tree(root, "vllm/v1/engine/core.py")
    assert method_args(core, "EngineCore", "step") == ["self"]
    assert method_args(core, "EngineCore", "step_with_batch_queue") == ["self"]
    assert {"load_general_plugins", "scheduler", "vllm_config"} <= names_in(core)
    sched = tree(root, "vllm/v1/core/sched/scheduler.py")
    assert method_args(sched, "Scheduler", "get_request_counts") == ["self"]
    assert method_args(sched, "Scheduler", "schedule")[0] == "self"
    assert method_args(tree(root, "vllm/v1/worker/worker_base.py"), "WorkerWrapperBase", "init_device") == [
        "self"
    ]
    plugins = tree(root, "vllm/plugins/__init__.py")
    assert {"plugins_loaded", "load_general_plugins"} <= names_in(plugins)
    v2 = tree(root, "vllm/v1/worker/gpu/model_runner.py")
    assert method_args(v2, "GPUModelRunner", "execute_model")[:4] == [
        "self", "scheduler_output", "intermediate_tensors", "dummy_run"
    ]  # fmt: skip
    imported = [a.name for n in ast.walk(v2) if isinstance(n, ast.ImportFrom) for a in n.names]
    assert "dispatch_cg_and_sync_dp" in imported  # a module global of the runner: patched there
    cg = tree(root, "vllm/v1/worker/gpu/cudagraph_utils.py")
    fields = [
        n.target.id
        for c in ast.walk(cg)
        if isinstance(c, ast.ClassDef) and c.name == "BatchExecutionDescriptor"
        for n in c.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    ]
    assert fields[0] == "cg_mode"
    v1 = tree(root, "vllm/v1/worker/gpu_model_runner.py")
    assert method_args(v1, "GPUModelRunner", "_determine_batch_execution_and_padding")[:3] == [
        "self", "num_tokens", "num_reqs"
    ]  # fmt: skip
    assert method_args(v1, "GPUModelRunner", "execute_model")[:2] == ["self", "scheduler_output"]
    cfg = (root / "vllm/config/scheduler.py").read_text()
    assert "max_num_seqs:" in cfg and "max_num_active_seqs:" in cfg
    assert "data_parallel_rank" in (root / "vllm/config/parallel.py").read_text()
    modes = (root / "vllm/config/compilation.py").read_text()
    assert all(f"    {m} = " in modes for m in ("NONE", "PIECEWISE", "FULL"))


def test_sglang_patch_points() -> None:
    root = source_root("sglang")
    reg = tree(root, "sglang/srt/plugins/hook_registry.py")
    assert method_args(reg, "HookRegistry", "register")[:4] == ["cls", "target", "hook", "hook_type"]
    assert {"AROUND", "AFTER"} <= names_in(reg)
    sched = tree(root, "sglang/srt/managers/scheduler.py")
    assert method_args(sched, "Scheduler", "run_batch")[:2] == ["self", "batch"]
    run = next(
        n for n in ast.walk(sched) if isinstance(n, ast.FunctionDef) and n.name == "run_scheduler_process"
    )
    assert "load_plugins" in names_in(ast.Module(body=run.body, type_ignores=[]))
    assert {"max_running_requests", "waiting_queue", "running_batch", "get_parallel"} <= names_in(sched)
    runner = tree(root, "sglang/srt/model_executor/model_runner.py")
    assert method_args(runner, "ModelRunner", "_forward_raw")[:2] == ["self", "forward_batch"]
    assert "can_run_graph" in names_in(runner)


def test_real_torch_cudagraph_is_patched_at_import() -> None:
    python = os.environ.get("BOUNDWATCH_TEST_TORCH_PYTHON") or sys.executable
    probe = subprocess.run(
        [
            python,
            "-c",
            "import json, sys, torch; print(json.dumps(sorted(m for m in sys.modules if 'cupti' in m)))",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if probe.returncode != 0:
        pytest.skip("no torch for this interpreter")
    # torch itself may register CUPTI-named modules at import (2.14: torch._C._profiler._cupti_monitor)
    torch_own = json.loads(probe.stdout.strip().splitlines()[-1])
    code = """
import json, sys
from exporter import agent
from exporter.agent import hooks
state = agent.start(role="generic")
import torch
cls = torch.cuda.CUDAGraph
print(json.dumps({"state": state, "so_far": hooks.graphs_so_far(), "marked": cls.__dict__.get("__boundwatch_hooks__"),
                  "wrapped": cls.replay.__wrapped__.__module__, "cupti": sorted(m for m in sys.modules if "cupti" in m),
                  "cuda": torch.cuda.is_initialized()}))
agent.stop()
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOUNDWATCH")}
    env["PYTHONPATH"] = str(ROOT)
    r = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    # the light agent loads no CUPTI module of its own: only those torch's import brought
    assert out == {"state": "running", "so_far": "none", "marked": True, "wrapped": "torch.cuda.graphs",
                   "cupti": torch_own, "cuda": False}  # fmt: skip
