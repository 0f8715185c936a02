"""The plugins against the real vLLM and SGLang packages: patch points, signatures and the real loaders.

Runs only where the packages are importable (`tools/check_engines.sh` runs it in the engine venvs);
CI, which installs neither, skips it with the reason.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.metadata
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import tomllib
import typing
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
OUR_ENTRY = "exporter.agent.plugins"


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


HAS_VLLM = _has("vllm")
HAS_SGLANG = _has("sglang")
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed here (tools/check_engines.sh)")
needs_sglang = pytest.mark.skipif(
    not HAS_SGLANG, reason="sglang is not installed here (tools/check_engines.sh)"
)


def _version(dist: str) -> tuple[int, ...]:
    parts = []
    for p in importlib.metadata.version(dist).split(".")[:3]:
        digits = "".join(c for c in p if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def _params(fn: Any) -> list[str]:
    return list(inspect.signature(fn).parameters)


def _optional_after(fn: Any, first: int) -> bool:
    """Say whether every parameter after the first `first` ones has a default (or is *args / **kwargs)."""
    ps = list(inspect.signature(fn).parameters.values())[first:]
    return all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in ps)


def _field_types(cls: type) -> dict[str, str]:
    return {f.name: str(f.type) for f in dataclasses.fields(cls)}


def _run_child(code: str, tmp_path: Path, timeout: float = 300) -> dict[str, Any]:
    """Run code in a fresh interpreter (plugin state is per process); return the JSON it prints last."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("BOUNDWATCH", "VLLM_PLUGINS", "SGLANG_PLUGINS"))
    }
    env["PYTHONPATH"] = str(ROOT)
    env["BOUNDWATCH_AGENT_SOCKET"] = str(tmp_path / "agent.sock")
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert r.returncode == 0 and lines, (
        f"rc={r.returncode}\nstdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-6000:]}"
    )
    return json.loads(lines[-1])


def _declared_entry(group: str) -> str:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["entry-points"][group]["boundwatch_agent"]


def _registered(group: str) -> dict[str, str]:
    return {ep.name: ep.value for ep in importlib.metadata.entry_points(group=group)}


def _source(module: str) -> str:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin
    return Path(spec.origin).read_text()


def _def_of(module: str, cls: str, method: str) -> Any:
    """Return the ast FunctionDef of cls.method read from the installed file (no import: needs no GPU)."""
    tree = ast.parse(_source(module))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == method:
                    return item
    raise AssertionError(f"{module}.{cls}.{method} not found")


# --- vLLM: patch points --------------------------------------------------------------------------


@needs_vllm
def test_vllm_engine_core_steps_take_only_self_and_are_bound_at_init() -> None:
    from vllm.v1.engine import core

    for name in ("step", "step_with_batch_queue"):
        fn = getattr(core.EngineCore, name)
        assert _params(fn) == ["self"], name
        ret = str(inspect.signature(fn).return_annotation)
        assert "tuple" in ret and "bool" in ret, (name, ret)  # (outputs, model_executed): wrap_step reads [1]
    # step_fn is bound from the class in __init__ (EngineCore's; EngineCoreProc's in 0.10): a patch
    # must land before the engine core is built
    init_src = inspect.getsource(core.EngineCore.__init__) + inspect.getsource(core.EngineCoreProc.__init__)
    assert "self.step_fn = " in init_src and "step_with_batch_queue" in init_src
    # no engine-core subclass overrides step, so patching the base class covers DP and Ray engines
    subclasses = [c for c in vars(core).values() if isinstance(c, type) and issubclass(c, core.EngineCore)]
    assert len(subclasses) >= 2
    for cls in subclasses:
        if cls is not core.EngineCore:
            assert "step" not in vars(cls) and "step_with_batch_queue" not in vars(cls), cls


@needs_vllm
def test_vllm_scheduler_schedule_and_request_counts() -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    assert _params(Scheduler.schedule)[0] == "self" and _optional_after(Scheduler.schedule, 1)
    assert _params(Scheduler.get_request_counts) == ["self"]
    assert str(inspect.signature(Scheduler.get_request_counts).return_annotation) in {
        "tuple[int, int]",
        "typing.Tuple[int, int]",
    }
    src = inspect.getsource(Scheduler.get_request_counts)
    assert "self.running" in src and "self.waiting" in src


@needs_vllm
def test_vllm_scheduler_output_fields_feed_the_schedule_patch() -> None:
    from vllm.v1.core.sched.output import SchedulerOutput

    from tests.agent.test_steps import scheduled_by

    types = _field_types(SchedulerOutput)
    assert types["total_num_scheduled_tokens"] in {"int", "<class 'int'>"}
    assert types["num_scheduled_tokens"] in {"dict[str, int]", "typing.Dict[str, int]"}
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(SchedulerOutput):
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kwargs[f.name] = None  # the fields boundwatch does not read
    kwargs.update(num_scheduled_tokens={"r1": 7, "r2": 1, "r3": 1}, total_num_scheduled_tokens=9)
    assert scheduled_by(SchedulerOutput(**kwargs)) == [9, 3]


def _worker_module() -> str:
    """Return the module that holds WorkerWrapperBase in this vLLM (moved to v1 in 0.11)."""
    return "vllm.worker.worker_base" if _version("vllm") < (0, 11) else "vllm.v1.worker.worker_base"


@needs_vllm
def test_vllm_worker_wrapper_init_device_exists_where_this_version_keeps_it() -> None:
    mod = importlib.import_module(_worker_module())
    assert _params(mod.WorkerWrapperBase.init_device) == ["self"]


@needs_vllm
def test_vllm_v2_runner_dispatches_graph_mode_through_a_module_global() -> None:
    if not _has("vllm.v1.worker.gpu.model_runner"):
        pytest.skip(f"vLLM {importlib.metadata.version('vllm')} has no V2 model runner")
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.worker.gpu import cudagraph_utils, model_runner

    fn = model_runner.dispatch_cg_and_sync_dp  # imported by name: patch model_runner's global
    assert _params(fn)[:6] == [
        "cudagraph_manager",
        "num_reqs",
        "num_tokens",
        "uniform_token_count",
        "dp_size",
        "dp_rank",
    ]
    assert "dispatch_cg_and_sync_dp(" in inspect.getsource(model_runner.GPUModelRunner.execute_model)
    desc = cudagraph_utils.BatchExecutionDescriptor
    assert {"cg_mode", "num_tokens", "num_reqs"} <= set(_field_types(desc))
    d = desc(cg_mode=CUDAGraphMode.PIECEWISE, num_tokens=16, num_reqs=None)
    assert d.cg_mode is CUDAGraphMode.PIECEWISE


@needs_vllm
def test_vllm_v1_runner_decides_graph_mode_once_per_step() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    fn = getattr(GPUModelRunner, "_determine_batch_execution_and_padding", None)
    if fn is not None:  # 0.12+
        from vllm.config.compilation import CUDAGraphMode

        ret = inspect.signature(fn, eval_str=True).return_annotation
        assert typing.get_origin(ret) is tuple and typing.get_args(ret)[0] is CUDAGraphMode, ret
        assert "_determine_batch_execution_and_padding(" in inspect.getsource(GPUModelRunner.execute_model)
        return
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher  # 0.10-0.11

    assert _params(CudagraphDispatcher.dispatch)[:2] == ["self", "batch_descriptor"]
    assert "cudagraph_dispatcher.dispatch(" in inspect.getsource(GPUModelRunner.execute_model)


V1_RUNNER, V2_RUNNER = "vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.gpu.model_runner"


@needs_vllm
def test_vllm_worker_step_calls_the_runners_own_execute_model_once() -> None:
    # _wrap_execute patches execute_model in the runner class's own __dict__ as the hook cycle's
    # driver site (rank 2): the worker must call it, looked up on the runner, once a model step
    for name, skip_dummy in ((V1_RUNNER, False), (V2_RUNNER, True)):
        if name == V2_RUNNER and not _has(name):
            continue
        cls = importlib.import_module(name).GPUModelRunner
        fn = vars(cls).get("execute_model")
        assert inspect.isfunction(fn), (name, fn)
        ps = inspect.signature(fn).parameters  # through torch.inference_mode's wrapper
        assert list(ps)[:2] == ["self", "scheduler_output"] and _optional_after(fn, 2), (name, list(ps))
        if skip_dummy:  # the wrapper reads dummy_run as args[2] after self, or by keyword
            assert list(ps)[3] == "dummy_run" and ps["dummy_run"].default is False, list(ps)
    worker = "vllm.v1.worker.gpu_worker"
    tree = ast.parse(_source(worker))
    typing_only = {
        id(n)
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
        for n in ast.walk(node)
    }
    built = {  # the runners the worker module imports to build (0.33: in Worker._make_model_runner)
        (n.module, a.name)
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and id(n) not in typing_only
        for a in n.names
    }
    assert (V1_RUNNER, "GPUModelRunner") in built, built
    assert (V2_RUNNER, "GPUModelRunner") in built or not _has(V2_RUNNER), built
    step = _def_of(worker, "Worker", "execute_model")
    calls = [
        n
        for n in ast.walk(step)
        if isinstance(n, ast.Call) and ast.unparse(n.func) == "self.model_runner.execute_model"
    ]
    assert len(calls) == 1, f"Worker.execute_model calls the runner's execute_model {len(calls)} times"
    call = calls[0]
    loops = [n for n in ast.walk(step) if isinstance(n, (ast.For, ast.While))]
    assert not any(call in ast.walk(loop) for loop in loops)
    assert len(call.args) <= 2 and all(k.arg != "dummy_run" for k in call.keywords)  # a step, not a dummy
    # never bound once (a switch swaps only the class attribute): every use in the module is a call
    uses = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute)
        and n.attr == "execute_model"
        and ast.unparse(n.value) == "self.model_runner"
    ]
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert uses and all(id(u) in called for u in uses)


@needs_vllm
def test_vllm_graph_wrapper_and_modes() -> None:
    from vllm.compilation.cuda_graph import CUDAGraphWrapper
    from vllm.config.compilation import CUDAGraphMode

    assert callable(CUDAGraphWrapper.__call__)
    assert "cudagraph_runtime_mode" in inspect.getsource(CUDAGraphWrapper.__call__)
    assert (CUDAGraphMode.NONE.value, CUDAGraphMode.PIECEWISE.value, CUDAGraphMode.FULL.value) == (0, 1, 2)


@needs_vllm
def test_vllm_scheduler_config_has_the_batch_limit() -> None:
    from vllm.config.scheduler import SchedulerConfig

    names = {f.name for f in dataclasses.fields(SchedulerConfig)}
    assert "max_num_seqs" in names
    if _version("vllm") >= (0, 33):
        assert "max_num_active_seqs" in names


@needs_vllm
def test_vllm_metric_names_the_page_reader_uses_still_exist() -> None:
    from vllm.v1.metrics import loggers
    from vllm.v1.spec_decode import metrics as spec_metrics

    from exporter.snapshot import engine_names as ep

    src = inspect.getsource(loggers) + inspect.getsource(spec_metrics)

    def declared(name: str) -> bool:  # counters are declared without their _total suffix
        return f'"{name}"' in src or f'"{name.removesuffix("_total")}"' in src

    for names in (
        ep.VLLM_RUNNING,
        ep.VLLM_WAITING,
        ep.VLLM_KV,
        ep.VLLM_PROMPT,
        ep.VLLM_GENERATION,
        ep.VLLM_PREEMPTIONS,
        ep.VLLM_SPEC_DRAFT_TOKENS,
        ep.VLLM_SPEC_ACCEPTED,
        ep.VLLM_SPEC_DRAFTS,
    ):
        assert any(declared(n) for n in names), names
    assert '"vllm:iteration_tokens_total"' in src
    v = _version("vllm")
    if v >= (0, 33):
        assert '"vllm:gpu_cache_usage_perc"' not in src
    # kv_cache_usage_perc: one series per API-server pid up to 0.11.0 (mode "all"), one ("mostrecent")
    # from 0.11.2 (vLLM PR #28792): a page shows per-pid series only on the old versions
    kv = src[src.index('name="vllm:kv_cache_usage_perc"') :][:400]
    if v >= (0, 11, 2):
        assert 'multiprocess_mode="mostrecent"' in kv
    elif v <= (0, 11, 0):
        assert "multiprocess_mode" not in kv


# --- vLLM: the real loader ---------------------------------------------------------------------------


@needs_vllm
def test_vllm_entry_point_is_declared_and_registered() -> None:
    declared = _declared_entry("vllm.general_plugins")
    assert declared == f"{OUR_ENTRY}:vllm_plugin"
    registered = _registered("vllm.general_plugins")
    assert registered.get("boundwatch_agent") == declared, (
        f"not registered in this environment ({registered}); pip install -e {ROOT} --no-deps"
    )


_SERVE_ORDER = r"""
import json, os, sys
from vllm.engine.arg_utils import AsyncEngineArgs
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.utils.system_utils import get_mp_context
except ImportError:  # vLLM 0.10
    from vllm.utils import FlexibleArgumentParser, get_mp_context
assert "vllm.v1.engine.core" not in sys.modules
import vllm.plugins
try:  # vllm serve's first plugin load: the first line of add_cli_args (the rest needs a device)
    AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
except RuntimeError:
    pass
assert vllm.plugins.plugins_loaded
before_core = "vllm.v1.engine.core" in sys.modules
import vllm.v1.engine.core_client  # the API server's AsyncLLM imports the engine core before forking it

def child(q):
    from vllm.plugins import load_general_plugins
    import vllm.v1.engine.core as core
    load_general_plugins()  # what EngineCore.__init__ does first
    from vllm.v1.core.sched.scheduler import Scheduler
    q.put({
        "step": bool(getattr(core.EngineCore.step, "__boundwatch__", False)),
        "step_with_batch_queue": bool(getattr(core.EngineCore.step_with_batch_queue, "__boundwatch__", False)),
        "schedule": bool(getattr(Scheduler.schedule, "__boundwatch__", False)),
        "pid": os.getpid(),
    })

ctx = get_mp_context()
q = ctx.Queue()
p = ctx.Process(target=child, args=(q,))
p.start()
res = q.get(timeout=240)
p.join(60)
res.update(method=ctx.get_start_method(), parent=os.getpid(), core_before_plugins=before_core)
print(json.dumps(res))
"""


@needs_vllm
def test_vllm_engine_core_step_is_wrapped_in_a_forked_engine_core(tmp_path: Path) -> None:
    """vllm serve: plugins load in the API server before the engine core module; EngineCore is forked."""
    res = _run_child(_SERVE_ORDER, tmp_path)
    assert res["method"] == "fork" and res["pid"] != res["parent"]
    assert res["core_before_plugins"] is False
    # Scheduler.schedule is wrapped at the engine's first step, on whichever scheduler class it runs
    # (tests/agent/test_vllm_patch.py), so before any step only the EngineCore methods are.
    assert res["step"] and res["step_with_batch_queue"], res


_SPAWNED = r"""
import json, sys
import vllm.v1.engine.core as core  # a spawned EngineCore imports the module, then __init__ loads plugins
from vllm.plugins import load_general_plugins
load_general_plugins()
print(json.dumps({"step": bool(getattr(core.EngineCore.step, "__boundwatch__", False)),
                  "step_with_batch_queue": bool(getattr(core.EngineCore.step_with_batch_queue, "__boundwatch__", False))}))
"""


@needs_vllm
def test_vllm_engine_core_step_is_wrapped_when_the_engine_core_loads_plugins_itself(tmp_path: Path) -> None:
    res = _run_child(_SPAWNED, tmp_path)
    assert res == {"step": True, "step_with_batch_queue": True}


_WORKER = r"""
import importlib, json, os
from vllm.plugins import load_general_plugins
load_general_plugins()
mod = importlib.import_module(%r)
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(w, b"1" if getattr(mod.WorkerWrapperBase.init_device, "__boundwatch__", False) else b"0")
    os._exit(0)
os.waitpid(pid, 0)
print(json.dumps({"worker_wrapped": os.read(r, 1) == b"1"}))
"""


@needs_vllm
def test_vllm_worker_init_device_is_wrapped_through_the_real_loader_and_survives_fork(tmp_path: Path) -> None:
    res = _run_child(_WORKER % _worker_module(), tmp_path)
    assert res == {"worker_wrapped": True}


_DRIVES = r"""
import importlib, json, os, sys
from vllm.plugins import load_general_plugins
load_general_plugins()
if %(forked)r:
    import vllm.v1.engine.core  # the engine core process, which forks its GPU workers (multiproc's default)
r, w = os.pipe()
pid = os.fork()  # a GPU worker (forked=False: as a spawned one, no engine core in it)
if pid == 0:
    import vllm.v1.worker.gpu_worker  # the worker's class, then the runner it builds (_make_model_runner)
    v2_first = "vllm.v1.worker.gpu.model_runner" in sys.modules
    mod = importlib.import_module(%(runner)r)
    from exporter.agent.switch import SWITCH
    SWITCH.drive_inline(10**9, 10**9, 0, lambda: iter(()), lambda wake: None, quiet=True)
    try:  # one step: only the driver site resumes a quiet agent (the runner itself fails after: no GPU)
        mod.GPUModelRunner.execute_model(object(), None)
    except Exception:
        pass
    os.write(w, json.dumps({"drove": not SWITCH.quiet, "v2_first": v2_first}).encode())
    os._exit(0)
os.waitpid(pid, 0)
print(os.read(r, 4096).decode())
"""


@needs_vllm
@pytest.mark.parametrize("runner", [V2_RUNNER, V1_RUNNER], ids=["v2", "v1"])
@pytest.mark.parametrize("forked", [False, True], ids=["spawned", "forked"])
def test_vllm_runner_execute_model_drives_the_hook_cycle_in_a_gpu_worker(
    tmp_path: Path, forked: bool, runner: str
) -> None:
    if not _has(runner):
        pytest.skip(f"vLLM {importlib.metadata.version('vllm')} has no {runner}")
    res = _run_child(_DRIVES % {"forked": forked, "runner": runner}, tmp_path)
    # the worker's runner drives even where a driver site it never calls came first: EngineCore.step
    # in a worker forked from the engine core, the V2 runner's execute_model in a V1 runner's worker
    # (gpu_worker imports that module first): the first driver site called claims the drive
    assert res["drove"], res


# --- SGLang: patch points --------------------------------------------------------------------------


@needs_sglang
def test_sglang_plugin_group_and_hook_registry() -> None:
    import sglang.srt.plugins as sp
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    assert sp.GENERAL_PLUGINS_GROUP == "sglang.srt.plugins"
    assert _declared_entry(sp.GENERAL_PLUGINS_GROUP) == f"{OUR_ENTRY}:sglang_plugin"
    assert _params(HookRegistry.register)[:3] == ["target", "hook", "hook_type"]
    assert {t.name for t in HookType} >= {"BEFORE", "AFTER", "AROUND", "REPLACE"}
    assert "HookRegistry.apply_hooks()" in inspect.getsource(sp.load_plugins)


def _ast_params(fn: Any) -> list[str]:
    return [a.arg for a in fn.args.args]


@needs_sglang
def test_sglang_model_runner_forward_raw_and_its_output() -> None:
    mod = "sglang.srt.model_executor.model_runner"
    fn = _def_of(mod, "ModelRunner", "_forward_raw")
    assert _ast_params(fn)[:3] == ["self", "forward_batch", "pp_proxy_tensors"]
    src = _source(mod)
    assert (
        "decode_cuda_graph_runner.can_run_graph(" in src and "prefill_cuda_graph_runner.can_run_graph(" in src
    )
    tree = ast.parse(src)
    out = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelRunnerOutput")
    fields = {n.target.id: ast.unparse(n.annotation) for n in out.body if isinstance(n, ast.AnnAssign)}
    assert fields.get("can_run_graph") == "bool"


@needs_sglang
def test_sglang_scheduler_queue_attributes_and_batch_methods() -> None:
    mod = "sglang.srt.managers.scheduler"
    assert _ast_params(_def_of(mod, "Scheduler", "run_batch"))[:2] == ["self", "batch"]
    assert _ast_params(_def_of(mod, "Scheduler", "process_batch_result"))[:3] == [
        "self",
        "batch",
        "result",
    ]
    src = _source(mod)
    assert "self.waiting_queue: List[Req] = []" in src
    assert "self.running_batch: ScheduleBatch = ScheduleBatch(" in src
    assert "self.max_running_requests" in src
    assert "def run_scheduler_process(" in src and "    load_plugins()" in src


SGLANG_LOOP_MODULES = (
    "sglang.srt.managers.scheduler",
    "sglang.srt.managers.scheduler_pp_mixin",
    "sglang.srt.disaggregation.prefill",
    "sglang.srt.disaggregation.decode",
    "sglang.srt.multiplex.multiplexing_mixin",
)


def _sglang_methods() -> dict[str, Any]:
    """Return the scheduler's and its mixins' methods by name, as ast FunctionDefs."""
    out: dict[str, Any] = {}
    for module in SGLANG_LOOP_MODULES:
        for node in ast.parse(_source(module)).body:
            if isinstance(node, ast.ClassDef):
                out.update({f.name: f for f in node.body if isinstance(f, ast.FunctionDef)})
    return out


def _self_calls(fn: Any) -> set[str]:
    return {
        n.func.attr
        for n in ast.walk(fn)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and isinstance(n.func.value, ast.Name)
        and n.func.value.id == "self"
    }


@needs_sglang
def test_sglang_every_event_loop_launches_its_batches_through_run_batch() -> None:
    # sglang_run_batch (AROUND Scheduler.run_batch) times each batch and polls the hook switch
    tree = ast.parse(_source("sglang.srt.managers.scheduler"))
    dispatch = [n for n in tree.body if isinstance(n, ast.FunctionDef) and "dispatch_event_loop" in n.name]
    loops = {
        n.func.attr
        for d in dispatch
        for n in ast.walk(d)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr.startswith("event_loop")
    }
    loops.discard("event_loop_overlap_mlx")  # Apple's MLX backend, no CUDA: never calls run_batch
    assert {"event_loop_normal", "event_loop_overlap"} <= loops, loops
    methods = _sglang_methods()
    for loop in sorted(loops):
        seen, todo = set(), [loop]
        for _ in range(3):  # the loop itself, then the scheduler methods it calls (_pp_launch_batch)
            calls = set().union(*(_self_calls(methods[m]) for m in todo if m in methods))
            seen |= calls
            todo = [c for c in calls if c in methods and c != "run_batch"]
        assert "run_batch" in seen, loop


@needs_sglang
def test_sglang_only_run_batch_calls_the_model_workers_forward() -> None:
    def outside(node: Any, fn: str) -> list[str]:
        if isinstance(node, ast.FunctionDef):
            fn = node.name
        here = []
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr.startswith("forward_batch_") and fn != "run_batch":
                here.append(f"{fn}: {ast.unparse(node.func)}")
        return here + [x for child in ast.iter_child_nodes(node) for x in outside(child, fn)]

    for module in SGLANG_LOOP_MODULES:
        assert outside(ast.parse(_source(module)), "") == [], module
    run_batch = _def_of("sglang.srt.managers.scheduler", "Scheduler", "run_batch")
    assert "forward_batch_generation" in ast.unparse(run_batch)


@needs_sglang
def test_sglang_metric_names_the_page_reader_uses_still_exist() -> None:
    from exporter.snapshot import engine_names as ep

    src = _source("sglang.srt.observability.metrics_collector")
    for names in (
        ep.SGLANG_RUNNING,
        ep.SGLANG_WAITING,
        ep.SGLANG_KV,
        ep.SGLANG_PROMPT,
        ep.SGLANG_GENERATION,
        ep.SGLANG_SPEC_ACCEPT_RATE,
    ):
        assert any(f'"{n}"' in src for n in names), names
    for name in (ep.SGLANG_PASSES, ep.SGLANG_DP_ATTENTION_STEPS):
        assert f'"{name}"' in src, name
    for mode in ("decode_cuda_graph", "decode_none", "prefill_cuda_graph", "prefill_none"):
        assert mode in src, mode


# --- SGLang: the real loader ----------------------------------------------------------------------

_SGLANG_SCHEDULER = r"""
import json, multiprocessing as mp, sys

def scheduler_child(q):
    out = {}
    try:
        from sglang.srt.managers.scheduler import run_scheduler_process
        try:  # the real entry: it loads plugins first, then fails here for want of real arguments / a GPU
            run_scheduler_process(None, None, 0, 0, 0, None, None)
        except BaseException as e:
            out["stopped_at"] = type(e).__name__
        from exporter import agent
        from sglang.srt.plugins.hook_registry import HookRegistry
        a = agent.current()
        out["agent_role"] = getattr(getattr(a, "settings", None), "role", None)
        ours = sorted(t for t, hooks in HookRegistry._hooks.items()
                      if any(src is not None and src.plugin_name == "boundwatch_agent" for _, _, src in hooks))
        out["our_hooks"] = ours
        out["applied"] = sorted(t for t in ours if t in HookRegistry._patched)
    except BaseException as e:
        out["error"] = repr(e)
    q.put(out)

if __name__ == "__main__":
    ctx = mp.get_context("spawn")  # SGLang spawns its schedulers (engine.py: set_start_method("spawn"))
    q = ctx.Queue()
    p = ctx.Process(target=scheduler_child, args=(q,))
    p.start()
    res = q.get(timeout=280)
    p.join(30)
    print(json.dumps(res))
"""


def _sglang_scheduler_run(tmp_path: Path) -> dict[str, Any]:
    script = tmp_path / "sglang_scheduler_child.py"
    script.write_text(_SGLANG_SCHEDULER)
    return _run_child(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')", tmp_path)


@needs_sglang
def test_sglang_entry_point_is_registered() -> None:
    registered = _registered("sglang.srt.plugins")
    assert registered.get("boundwatch_agent") == f"{OUR_ENTRY}:sglang_plugin", registered


@needs_sglang
def test_sglang_plugin_runs_in_the_spawned_scheduler_through_the_real_loader(tmp_path: Path) -> None:
    res = _sglang_scheduler_run(tmp_path)
    assert "error" not in res, res
    assert res["agent_role"] == "sglang_scheduler", res


@needs_sglang
def test_sglang_plugin_hooks_are_applied_in_the_scheduler(tmp_path: Path) -> None:
    res = _sglang_scheduler_run(tmp_path)
    assert "error" not in res, res
    assert res["our_hooks"] and res["applied"] == res["our_hooks"], res


PAGE_FILTER = """
import json, os, sys
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import Gauge
from exporter.sources.engine_scrape import filtered_url
kind = sys.argv[1]
if kind == "vllm":  # one API server: the global registry, as vLLM's own get_prometheus_registry() gives
    from vllm.entrypoints.serve.instrumentator.metrics import attach_router
    Gauge("vllm:num_requests_running", "running", ["model_name"]).labels("m").set(3)
    Gauge("vllm:e2e_request_latency_seconds_unread", "not read", ["model_name"]).labels("m").set(1)
    app = FastAPI()
    attach_router(app)
else:  # SGLang: always a multiprocess registry (PROMETHEUS_MULTIPROC_DIR set before the import)
    from sglang.srt.utils.common import add_prometheus_middleware
    g = Gauge("sglang:num_running_reqs", "running", ["tp_rank"], multiprocess_mode="sum")
    g.labels("0").set(3)
    app = FastAPI()
    add_prometheus_middleware(app)
client = TestClient(app)
url = filtered_url("http://127.0.0.1:8000/metrics", kind)
asked = url[len("http://127.0.0.1:8000"):]
out = {}
for name, path in (("whole", "/metrics"), ("asked", asked), ("query_on_plain_path", "/metrics?" + asked.split("?", 1)[1])):
    r = client.get(path, follow_redirects=False)
    out[name] = {"status": r.status_code, "lines": [l for l in r.text.splitlines() if l and not l.startswith("#")]}
print(json.dumps(out))
"""


def _page_filter(kind: str, tmp_path: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if kind == "sglang":
        env["PROMETHEUS_MULTIPROC_DIR"] = str(tmp_path)
    r = subprocess.run(
        [sys.executable, "-c", PAGE_FILTER, kind], env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@needs_vllm
def test_vllm_serves_the_filtered_page_at_the_asked_path_and_the_whole_one_at_metrics(tmp_path: Path) -> None:
    # vLLM's /metrics route (its HTTP instrumentator's) ignores name[]; /metrics/ reaches prometheus_client's app
    out = _page_filter("vllm", tmp_path)
    assert out["asked"]["status"] == 200
    running = 'vllm:num_requests_running{model_name="m"} 3.0'
    assert running in out["asked"]["lines"] and not any("unread" in ln for ln in out["asked"]["lines"]), out
    assert any(ln.startswith("process_cpu_seconds_total") for ln in out["asked"]["lines"]), out  # the mark
    for whole in (out["whole"], out["query_on_plain_path"]):
        assert running in whole["lines"] and any("unread" in ln for ln in whole["lines"]), out


@needs_sglang
def test_sglang_answers_the_filter_with_an_empty_page_so_it_is_read_whole(tmp_path: Path) -> None:
    # a multiprocess registry restricts nothing it can name: the client falls back to the whole page
    out = _page_filter("sglang", tmp_path)
    assert out["asked"] == {"status": 200, "lines": []}, out
    assert any(ln.startswith("sglang:num_running_reqs") for ln in out["whole"]["lines"]), out
