"""Run a callback right after a named module finishes importing (or now, if it already has).

One finder on `sys.meta_path` serves every name; it asks the other finders for the spec and wraps
the loader's `exec_module`, so it never finds or loads anything itself. The finder stays in
`sys.meta_path`, so a forked child that imports the module later is patched too. Callbacks never
raise into the importer.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

Callback = Callable[[Any], None]

_waiting: dict[str, list[Callback]] = {}
_lock = threading.Lock()


def _run(callbacks: list[Callback], module: Any) -> None:
    for cb in callbacks:
        try:
            cb(module)
        except Exception:
            pass


def when_imported(name: str, callback: Callback) -> None:
    """Call callback(module) once `name` is imported: now if it is in sys.modules, else right after its import."""
    module = sys.modules.get(name)
    if module is not None:
        _run([callback], module)
        return
    with _lock:
        _waiting.setdefault(name, []).append(callback)
        if not any(isinstance(f, PostImportHook) for f in sys.meta_path):
            sys.meta_path.insert(0, PostImportHook())


def waiting() -> list[str]:
    """Return the module names still waited for."""
    with _lock:
        return sorted(_waiting)


class PostImportHook:
    """A meta-path finder that finds nothing itself: it wraps exec_module of modules waited for."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        """Return the spec the other finders give for a waited-for name, its loader wrapped; else None."""
        if name not in _waiting:
            return None
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, PostImportHook):
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            try:
                spec = find(name, path, target)
            except Exception:
                return None
            if spec is not None:
                return self._wrap(name, spec)
        return None

    @staticmethod
    def _wrap(name: str, spec: Any) -> Any:
        loader = spec.loader
        original = getattr(loader, "exec_module", None)
        if original is None:
            return spec

        def exec_module(module: Any) -> None:
            try:
                del loader.exec_module  # once: a loader shared by several modules is not wrapped twice
            except AttributeError:
                pass
            original(module)
            with _lock:
                callbacks = _waiting.pop(name, [])
            _run(callbacks, module)

        try:
            loader.exec_module = exec_module
        except (AttributeError, TypeError):  # a loader that refuses attributes: leave it be
            return spec
        return spec
