"""Step aside when torch.profiler takes CUPTI, and take it back when the profiler is done.

Kineto replaces the activity buffer callbacks without telling anyone (measured on the H200: our
callbacks got nothing until re-registered). Wrapping torch.autograd.profiler's module-level
_prepare_profiler / _disable_profiler tells the agent exactly when; the wrappers call the originals
with the same arguments and return their results, so the profiler behaves as before.
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import Any

_installed = False
_pending_agent: Any = None


def _has_cuda(activities: Any) -> bool:
    try:
        return any("CUDA" in str(a) for a in activities)
    except TypeError:
        return True


def _patch(mod: Any, agent: Any) -> bool:
    prep = getattr(mod, "_prepare_profiler", None)
    disable = getattr(mod, "_disable_profiler", None)
    if prep is None or disable is None or getattr(prep, "__boundwatch__", False):
        return False

    @functools.wraps(prep)
    def _prepare_profiler(*args: Any, **kwargs: Any) -> Any:
        acts = args[1] if len(args) > 1 else kwargs.get("activities", ())
        if _has_cuda(acts):
            try:
                agent.yield_cupti("torch.profiler")
            except Exception:
                pass
        return prep(*args, **kwargs)

    @functools.wraps(disable)
    def _disable_profiler(*args: Any, **kwargs: Any) -> Any:
        try:
            return disable(*args, **kwargs)
        finally:
            try:
                agent.reattach()
            except Exception:
                pass

    _prepare_profiler.__boundwatch__ = True  # type: ignore[attr-defined]
    _disable_profiler.__boundwatch__ = True  # type: ignore[attr-defined]
    mod._prepare_profiler = _prepare_profiler
    mod._disable_profiler = _disable_profiler
    return True


def install(agent: Any) -> None:
    """Patch torch.autograd.profiler now if imported, else as soon as it is (import hook)."""
    global _installed, _pending_agent
    mod = sys.modules.get("torch.autograd.profiler")
    if mod is not None:
        _installed = _patch(mod, agent) or _installed
        return
    _pending_agent = agent
    if not any(isinstance(f, _ProfilerFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _ProfilerFinder())


class _ProfilerFinder:
    """Meta-path hook: after torch.autograd.profiler executes, patch it; finds nothing itself."""

    _local = threading.local()

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torch.autograd.profiler" or getattr(self._local, "busy", False):
            return None
        import importlib.util

        self._local.busy = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._local.busy = False
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        original_exec = loader.exec_module  # type: ignore[union-attr]

        def exec_module(module: Any) -> None:
            original_exec(module)
            if _pending_agent is not None:
                try:
                    _patch(module, _pending_agent)
                except Exception:
                    pass

        loader.exec_module = exec_module  # type: ignore[method-assign,union-attr]
        return spec
