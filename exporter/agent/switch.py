"""Sampled light hooks: the hooks on an engine step's path are in for a slice of each agent tick and out between.

A Python frame on a GPU step's path costs 0.7-3.3 us after a sync on the H200
(bench/light_step_parts.py): 0.05-0.23% of a 1.4 ms decode step for each hook. With the hooks in
for `hook_share` of the time (BOUNDWATCH_AGENT_HOOK_SHARE, default 1/8) the steps pay that 1 tick
in 8 and nothing between: while the hooks are out the engine runs its own functions (the class
attributes, module globals and bound methods that held a hook are swapped back), with no check
left on its path.

What the hooks count in a slice stands for the whole tick: the agent scales it by the tick's span
over the time the hooks were in (a ratio estimator: a step or a replay is counted when it starts
in a slice), integers with the remainders carried (`Carry`). Ratios (a step's wall time, tokens
per sequence, the share of steps in graphs) need no scale; the scheduler's running and waiting are
read at every tick and integrated over real time, never sampled.

The agent's thread swaps (`set_in`); a hook that cannot be swapped but feeds the same counts (SGLang's
hook registry) keeps the hooks in for good (`hold`), so no count is ever scaled that was not sampled.
Hooks start in: until an agent drives the cycle, and again after it stops or the process forks.
"""

from __future__ import annotations

import os
import threading
import time
import types
import weakref
from typing import Any

MAX_SWITCHES = 64  # hook sites one process manages; past this the hooks stay in (held)
MAX_BOUND = 64  # instances whose attributes hold a bound hook (an engine core's step_fn)
SWITCHED = "__boundwatch_switched__"  # set on a hook this module swaps


class Switch:
    """The hook sites of this process and whether they are in; the time they were in, for the scale."""

    def __init__(self, clock: Any = time.monotonic_ns) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._sites: list[tuple[Any, str, Any, Any]] = []  # (owner, attribute, original, hook)
        self._bound: list[
            tuple[Any, str, Any, Any]
        ] = []  # (weakref to an instance, attribute, original, hook)
        self.hooks_in = True
        self.cycling = False  # an agent's thread swaps the hooks in and out
        self.held = ""  # why the hooks stay in ('' when nothing holds them)
        self._since = clock()  # the hooks went in (while in), or the last scale
        self._in_ns = 0  # time in since the last scale
        self._scaled_at = self._since

    def add(self, owner: Any, name: str, original: Any, hook: Any) -> None:
        """Manage owner.name (a class attribute or module global) that holds hook in place of original."""
        with self._lock:
            if len(self._sites) >= MAX_SWITCHES:
                self._hold("too many hook sites")
                return
            self._sites.append((owner, name, original, hook))
            try:
                setattr(hook, SWITCHED, True)
            except (AttributeError, TypeError):
                pass
            setattr(owner, name, hook if self.hooks_in else original)

    def adopt(self, obj: Any) -> None:
        """Manage the attributes of obj that hold a bound method of a managed function (vLLM's step_fn)."""
        try:
            attrs = list(vars(obj).items())
        except TypeError:
            return
        with self._lock:
            funcs = {id(f): (orig, hook) for _, _, orig, hook in self._sites for f in (orig, hook)}
            for name, value in attrs:
                pair = funcs.get(id(getattr(value, "__func__", None)))
                if pair is None or getattr(value, "__self__", None) is not obj:
                    continue
                if any(ref() is obj and n == name for ref, n, _, _ in self._bound):
                    continue
                if len(self._bound) >= MAX_BOUND:
                    self._hold("too many bound hooks")
                    return
                try:
                    ref = weakref.ref(obj)
                except TypeError:
                    self._hold("an instance without weak references holds a hook")
                    return
                self._bound.append((ref, name, pair[0], pair[1]))
                setattr(obj, name, types.MethodType(pair[1] if self.hooks_in else pair[0], obj))

    def hold(self, why: str) -> None:
        """Keep the hooks in for good: something counts into the same totals without being swapped."""
        with self._lock:
            self._hold(why)

    def _hold(self, why: str) -> None:
        self.held = self.held or why
        self.cycling = False
        self._set(True)

    def start_cycle(self) -> bool:
        """Let the agent's thread swap the hooks; False (hooks stay in) when something holds them."""
        with self._lock:
            self.cycling = not self.held
            return self.cycling

    def stop_cycle(self) -> None:
        """Put the hooks in for good (the agent stopped, or CUPTI times every step)."""
        with self._lock:
            self.cycling = False
            self._set(True)

    def set_in(self, hooks_in: bool) -> None:
        """Swap every managed hook in or out (the agent's thread); a no-op when not cycling."""
        with self._lock:
            if self.cycling or hooks_in:
                self._set(hooks_in)

    def _set(self, hooks_in: bool) -> None:
        now = self._clock()
        if hooks_in == self.hooks_in:
            return
        if self.hooks_in:
            self._in_ns += now - self._since
        self._since = now
        self.hooks_in = hooks_in
        for owner, name, original, hook in self._sites:
            setattr(owner, name, hook if hooks_in else original)
        live = []
        for ref, name, original, hook in self._bound:
            obj = ref()
            if obj is not None:
                setattr(obj, name, types.MethodType(hook if hooks_in else original, obj))
                live.append((ref, name, original, hook))
        self._bound = live

    def scale(self, now_ns: int | None = None) -> float:
        """Return the span since the last call over the time the hooks were in during it (1.0 when always in)."""
        with self._lock:
            now = self._clock() if now_ns is None else now_ns
            in_ns = self._in_ns + (now - self._since if self.hooks_in else 0)
            span = now - self._scaled_at
            self._in_ns, self._scaled_at = 0, now
            if self.hooks_in:
                self._since = now
            if in_ns <= 0 or in_ns >= span:
                return 1.0
            return span / in_ns

    def after_fork(self) -> None:
        """In a forked child: no agent's thread swaps the hooks; put them in until one does."""
        self._lock = threading.Lock()
        self.cycling = False
        self._set(True)


SWITCH = Switch()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=SWITCH.after_fork)


class Carry:
    """Scale counts by a factor into integers, carrying each key's remainder to its next count."""

    MAX_KEYS = 1024

    def __init__(self) -> None:
        self._rest: dict[Any, float] = {}

    def __call__(self, key: Any, n: int, factor: float) -> int:
        if factor == 1.0 and key not in self._rest:
            return n
        x = n * factor + self._rest.get(key, 0.0)
        out = int(x)
        if key in self._rest or len(self._rest) < self.MAX_KEYS:
            self._rest[key] = x - out
        return out

    def many(self, key: Any, counts: tuple[int, ...] | list[int], factor: float) -> tuple[int, ...]:
        """Scale each of a tuple of counts (a histogram's buckets) with its own carry."""
        return tuple(self((*key, i), c, factor) for i, c in enumerate(counts))
