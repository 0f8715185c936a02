"""The in-process agent: `start()` inside the process that drives the GPU, `stop()` at exit.

Two modes. `light` (the default) uses no CUPTI at all: Python hooks count CUDA-graph replays and
captures (torch.cuda.CUDAGraph) and engine steps with the scheduler's counts (the vLLM and SGLang
plugins), and a thread sends per-window totals (exporter.agent.light). `cupti` (asked for with
`BOUNDWATCH_AGENT=cupti` or `start(mode="cupti")`) adds CUPTI activity records: exact GPU busy
time, at a measured cost to the engine (exporter.agent.core). A light agent is upgraded in place
when the deep mode is asked for later.

Ways in: `exporter.agent.start()`; the vLLM and SGLang plugin entry points
(`exporter.agent.plugins`); or `BOUNDWATCH_AGENT=1|now|cupti` with the `.pth` hook installed
(`boundwatch agent-install-pth`). Imports nothing of the sidecar but `exporter.wire` and
`exporter.analysis.intervals`, and never raises into the application: when CUPTI cannot start the
agent reports "unavailable" with the reason and leaves the process alone.
"""

from __future__ import annotations

import atexit
import os
import threading
from typing import Any

_agent: Any = None
_lock = threading.Lock()
_atexit = [False]


def start(role: str | None = None, mode: str | None = None, **settings: Any) -> str:
    """Start the agent once per process (light unless mode='cupti'); return its state, never raise."""
    global _agent
    with _lock:
        try:
            from exporter.agent.settings import Settings, resolve_mode

            want = resolve_mode(mode, settings)
            settings.pop("cupti", None)  # the mode says it now
            if _agent is not None and _agent.state in ("running", "preempted", "unavailable"):
                if want == "cupti" and getattr(_agent, "mode", "") in ("light", "steps"):
                    _agent = _upgrade(_agent, role, settings)
                return str(_agent.state)
            cfg = Settings.from_env(role=role, mode=want, **settings)
            _agent = _new_agent(cfg)
        except Exception as exc:  # numpy missing, broken install: stay out of the way
            return f"disabled: {type(exc).__name__}: {exc}"
        if not _atexit[0]:
            _atexit[0] = True
            atexit.register(stop)
        return str(_agent.state)


def _new_agent(cfg: Any, steps: Any = None, sender: Any = None) -> Any:
    if cfg.mode != "cupti":
        from exporter.agent.light import LightAgent

        light = LightAgent(cfg, steps=steps, sender=sender)
        light.start()
        return light
    from exporter.agent.core import Agent
    from exporter.agent.profiler_guard import install as install_profiler_guard

    agent = Agent(cfg, steps=steps, sender=sender)
    agent.start()
    install_profiler_guard(agent)
    return agent


def _upgrade(old: Any, role: str | None, settings: dict[str, Any]) -> Any:
    """Replace a light agent by a CUPTI one that keeps its steps, sender and role."""
    from exporter.agent.settings import Settings

    if getattr(old, "mode", "") == "steps":  # a core.Agent started without CUPTI
        old.add_cupti()
        return old
    old.detach()
    cfg = Settings.from_env(role=role or old.settings.role, mode="cupti", **settings)
    return _new_agent(cfg, steps=old.steps, sender=old.sender)


def stop() -> None:
    """Flush, send what is left and disable collection; CUPTI stays attached until the process exits."""
    global _agent
    with _lock:
        agent, _agent = _agent, None
    if agent is not None:
        try:
            agent.stop()
        except Exception:
            pass


def current() -> Any:
    """Return the running agent (LightAgent or the CUPTI Agent), or None."""
    return _agent


def _after_fork_in_child() -> None:
    # The agent thread does not survive fork, and CUPTI state in the child belongs to the parent.
    global _agent, _lock
    _agent = None
    _lock = threading.Lock()  # another thread may have held it at the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
