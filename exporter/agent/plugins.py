"""Ways into inference engines: vLLM and SGLang plugin entry points, and the BOUNDWATCH_AGENT autostart.

Each function is re-entrant, never raises, and does nothing where its target is absent or its
internals differ from what it expects (checked by attribute, not by version number).
"""

from __future__ import annotations

import functools
import os
import sys
import time
from typing import Any

_patched: set[str] = set()
_steps_started: list[bool] = []


def _enabled() -> bool:
    return os.environ.get("BOUNDWATCH_AGENT", "1").strip().lower() not in {"0", "off", "false", "no"}


def _start(role: str, **settings: Any) -> None:
    try:
        from exporter import agent

        agent.start(role=role, **settings)
    except Exception:
        pass


# --- vLLM ---------------------------------------------------------------------------------


def vllm_plugin() -> None:
    """Entry point `vllm.general_plugins`: patch the worker's init_device and EngineCore.step.

    vLLM loads general plugins in its API servers, EngineCore and every GPU worker; the agent
    starts only where init_device runs (a real GPU worker: a VllmWorker process, or EngineCore
    with the uni executor), before CUDA is initialised there, so GRAPH_TRACE precedes any graph.
    """
    if not _enabled():
        return
    try:
        _patch_vllm_worker()
    except Exception:
        pass
    try:
        _patch_vllm_engine_core()
    except Exception:
        pass


def _patch_vllm_worker() -> None:
    if "vllm_worker" in _patched:
        return
    from vllm.v1.worker import worker_base  # type: ignore[import-not-found]

    cls = getattr(worker_base, "WorkerWrapperBase", None)
    init_device = getattr(cls, "init_device", None)
    if cls is None or init_device is None or getattr(init_device, "__boundwatch__", False):
        return

    @functools.wraps(init_device)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        _start("vllm_worker")
        return init_device(self, *args, **kwargs)

    wrapped.__boundwatch__ = True  # type: ignore[attr-defined]
    cls.init_device = wrapped
    _patched.add("vllm_worker")


def scheduled_batch(output: Any) -> tuple[int, int]:
    """Return (tokens, sequences) of a vLLM SchedulerOutput, or (0, 0) when its shape is unknown."""
    tokens = getattr(output, "total_num_scheduled_tokens", 0)
    per_req = getattr(output, "num_scheduled_tokens", None)
    seqs = len(per_req) if isinstance(per_req, dict) else 0
    return (tokens if isinstance(tokens, int) else 0), seqs


def wrap_step(step: Any, engine: str, batch_of: Any) -> Any:
    """Return step wrapped to time each call that ran the model, with the same arguments and result."""

    @functools.wraps(step)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.time_ns()
        result = step(self, *args, **kwargs)
        t1 = time.time_ns()
        try:
            executed = result[1] if isinstance(result, tuple) and len(result) == 2 else True
            if executed is not False:
                tokens, seqs = batch_of(self)
                from exporter import agent

                a = agent.current()
                if a is None and not _steps_started:
                    _steps_started.append(True)  # once: only a process that really steps gets an agent
                    _start(f"{engine}_engine", cupti=False)
                    a = agent.current()
                if a is not None:
                    a.steps.record(engine, t0, t1, tokens, seqs)
        except Exception:
            pass
        return result

    wrapped.__boundwatch__ = True  # type: ignore[attr-defined]
    return wrapped


def _patch_vllm_engine_core() -> None:
    if "vllm_engine" in _patched:
        return
    core_mod = sys.modules.get("vllm.v1.engine.core")
    if core_mod is None:
        return  # not in an EngineCore process: nothing to count here
    engine_core = getattr(core_mod, "EngineCore", None)
    if engine_core is None:
        return
    from vllm.v1.core.sched import scheduler as sched_mod  # type: ignore[import-not-found]

    sched_cls = getattr(sched_mod, "Scheduler", None)
    schedule = getattr(sched_cls, "schedule", None)
    if sched_cls is None or schedule is None:
        return
    last: dict[int, tuple[int, int]] = {}

    @functools.wraps(schedule)
    def schedule_wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        output = schedule(self, *args, **kwargs)
        try:
            last[0] = scheduled_batch(output)
        except Exception:
            pass
        return output

    def batch_of(_core: Any) -> tuple[int, int]:
        return last.pop(0, (0, 0))

    patched_any = False
    for name in ("step", "step_with_batch_queue"):
        fn = getattr(engine_core, name, None)
        if fn is not None and not getattr(fn, "__boundwatch__", False):
            setattr(engine_core, name, wrap_step(fn, "vllm", batch_of))
            patched_any = True
    if patched_any:
        schedule_wrapped.__boundwatch__ = True  # type: ignore[attr-defined]
        sched_cls.schedule = schedule_wrapped
        _patched.add("vllm_engine")  # the steps-only agent starts at the first step (EngineCore only)


# --- SGLang -------------------------------------------------------------------------------


def sglang_plugin() -> None:
    """Entry point `sglang.srt.plugins`: start the agent in the scheduler process (SGLang's GPU worker)."""
    if not _enabled():
        return
    frame = sys._getframe(1)
    while frame is not None:  # loaded from run_scheduler_process: the scheduler, SGLang's GPU worker
        if frame.f_code.co_name == "run_scheduler_process":
            _start("sglang_scheduler")
            return
        frame = frame.f_back  # type: ignore[assignment]


# --- any Python process --------------------------------------------------------------------


def autostart() -> None:
    """Called by boundwatch_agent.pth: start the agent when BOUNDWATCH_AGENT is set, else do nothing.

    BOUNDWATCH_AGENT=1 starts it once torch is imported (before any CUDA work, so GRAPH_TRACE
    precedes any graph), =now at interpreter start-up. Spawned children inherit the variable and
    run site again, so activation never depends on __main__.
    """
    value = os.environ.get("BOUNDWATCH_AGENT", "").strip().lower()
    if value in {"", "0", "off", "false", "no"}:
        return
    if value == "now" or "torch" in sys.modules:
        _start(os.environ.get("BOUNDWATCH_AGENT_ROLE", "generic"))
        return
    sys.meta_path.insert(0, _TorchImportHook())


class _TorchImportHook:
    """Start the agent right after `import torch` finishes; finds nothing itself."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torch":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            return None
        import importlib.util

        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        original_exec = spec.loader.exec_module  # type: ignore[union-attr]

        def exec_module(module: Any) -> None:
            original_exec(module)
            _start(os.environ.get("BOUNDWATCH_AGENT_ROLE", "generic"))

        spec.loader.exec_module = exec_module  # type: ignore[method-assign,union-attr]
        return spec


PTH_NAME = "boundwatch_agent.pth"
PTH_LINE = (
    "import os, sys; exec('try:\\n from exporter.agent.plugins import autostart\\n autostart()\\n"
    "except Exception:\\n pass') if os.environ.get('BOUNDWATCH_AGENT') else None\n"
)
