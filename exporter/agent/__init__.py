"""The in-process CUPTI agent: `start()` inside the process that drives the GPU, `stop()` at exit.

Ways in: `exporter.agent.start()`; the vLLM and SGLang plugin entry points
(`exporter.agent.plugins`); or `BOUNDWATCH_AGENT=1` with the `.pth` hook installed
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


def start(role: str | None = None, **settings: Any) -> str:
    """Start the agent once per process; return its state ('running', 'unavailable' or 'disabled')."""
    global _agent
    with _lock:
        if _agent is not None and _agent.state in ("running", "preempted", "unavailable"):
            if settings.get("cupti", True) and _agent.mode == "steps":
                return str(_agent.add_cupti())
            return str(_agent.state)
        try:
            from exporter.agent.core import Agent, Settings
            from exporter.agent.profiler_guard import install as install_profiler_guard
        except Exception as exc:  # numpy missing, broken install: stay out of the way
            return f"disabled: {type(exc).__name__}: {exc}"
        _agent = Agent(Settings.from_env(role=role, **settings))
        state = _agent.start()
        install_profiler_guard(_agent)
        atexit.register(stop)
        return state


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
    """Return the running Agent, or None."""
    return _agent


def _after_fork_in_child() -> None:
    # The agent thread does not survive fork, and CUPTI state in the child belongs to the parent.
    global _agent
    _agent = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
