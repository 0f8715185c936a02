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

Who swaps. Each wake-up of the agent's thread takes the GIL from the engine's thread, and the engine's
thread then waits for the OS to wake it again: 130-145 us a wake-up on the H200's VM, even where the
engine lets go of the GIL in each op (bench/README.md, session 10). So once `drive_inline` is on, the
engine's own step drives the cycle: the highest-ranked site (an engine step, else a graph replay)
keeps a thin check while out (`thin`: one frame and a clock read; for torch's CUDAGraph.replay, whose
own frame is a shim over the C++ call, the check calls that and takes the shim's place: `direct`)
and a checked hook while in; the
first call at or past `due` swaps the hooks in or out right there (and, at a slice's end, runs the
agent's tick inline: tens of microseconds, no hand-over).

Which site drives is settled by who calls, not by who was added first: a process may hold driver
sites it never calls (a GPU worker forked from vLLM's engine core keeps EngineCore.step; a V1
runner's worker has imported the V2 runner too). Whenever the agent's thread had to swap or tick
for the engine (the driver missed its due by the margin), and while quiet, every other driver site
holds a claiming hook while the hooks are in: the first one called takes the drive over (one of a
higher or equal rank at once, any after a second miss) and the claiming hooks go again. A driver
that steps keeps its due, so in steady state nothing claims and no site pays for it. The slices are fixed in advance,
`[due, due + in)`: the call that finds a slice begun starts inside it and is counted, the one that
finds it ended is not, so the ratio estimator stays unbiased. The agent's thread sleeps on a timer
that each drive pushes past the next `due`: it wakes only when the engine has stopped stepping (then
no thread waits on the GIL). Waking, it puts the hooks in if they are out and leaves them in, ticking
once a period (every call counted, scale 1) until a driver's call slices again or the agent goes
quiet: a swap empties the engine's type caches, and nothing is gained by swapping hooks that nobody
calls (an engine that stops: 1 swap where the thread swapped in and out 5 times on the VM).

Where the tick's phases run. On a graph-captured decode the engine's thread launches the step's graph
and then waits for the GPU: while a tick is pending, the launch site (torch's CUDAGraph.replay) holds a
runner that calls the site's own function and then runs one phase, so the phases (~0.3 ms a tick with
every cache cold, 0.065-0.087% of the engine's time when they ran before the step on the H200) overlap
the graph instead of delaying it. A driver's call skips its phase while the runner ran one since; an
engine that launches no graph (eager) gets the phases from its step as before. The runner's next call
after the tick puts the site back (its own call: no call pays for a phase and that assignment both).

The agent's thread swaps (`set_in`); a hook that cannot be swapped but feeds the same counts (SGLang's
hook registry) keeps the hooks in for good (`hold`), so no count is ever scaled that was not sampled.
Hooks start in: until an agent drives the cycle, and again after it stops or the process forks.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import types
import weakref
from typing import Any, NamedTuple

MAX_SWITCHES = 64  # hook sites one process manages; past this the hooks stay in (held)
MAX_BOUND = 64  # instances whose attributes hold a bound hook (an engine core's step_fn)
# steps at most this far apart on average (driver calls while the hooks are in) make an engine "fast":
# it swaps within a few ms of each due, and once it stops, nothing is left for the agent's thread to
# do but the idle wake; a slower engine (a 70B model's decode, long prefill chunks) keeps the thread's
# rescue a margin past each due, since one step may outlast a whole slice
FAST_STEP_NS = 20_000_000
SWITCHED = "__boundwatch_switched__"  # set on a hook this module swaps
# Python 3.13 gives each class at most 1,000 type versions (CPython's MAX_VERSIONS_PER_CLASS), and every
# change of a class attribute uses one (of the class and of each subclass) when it is next used: past
# that, every attribute read and method call on the class's instances runs unspecialised for the life
# of the process (4.8x slower on bench/class_versions.py). A hook site swapped twice a tick spends it in
# minutes, so on 3.13+ the switch changes a class's attributes at most this many times, then holds the
# hooks in for good (the cost of hooks always in, about that of the sampled ones on a 1.4 ms decode
# step: bench/README.md); before 3.13 versions are not capped (0: no budget).
CLASS_CHANGES_MAX = 900 if sys.version_info >= (3, 13) else 0
HELD_FOR_VERSIONS = "each class's type versions are capped (Python 3.13+): hooks held in, not swapped again"


class Direct(NamedTuple):
    """A method that only defers to its base class's (`hooks.base_call`): for an instance of exactly
    `exact`, calling `base` with it does the same, one frame fewer.

    `held` is what `owner.name` held when `base` was taken from it: once it holds anything else (the
    base's method patched since), `ok` turns False for good and the callers go back to the method's
    own call. `still()` looks (a dict read); the switch does so at each swap and each agent tick.
    """

    exact: type
    base: Any
    owner: type
    name: str
    held: Any
    ok: list[bool]

    def still(self) -> bool:
        """Say whether the base's method is still the one taken (and stop the direct call if not)."""
        if self.ok[0] and vars(self.owner).get(self.name) is not self.held:
            self.ok[0] = False
        return self.ok[0]


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
        self.due = [0]  # when the engine's thread next swaps (monotonic ns; 0: it does not drive)
        self.driving = False  # drive_inline is on: the driver site checks `due`
        self._driver = -1  # index in _sites of the site that drives (the highest rank), -1: none
        self._rank = -1
        self._wrapped: tuple[Any, Any] = (None, None)  # the driver's (thin, checked) functions
        self._slice = (0, 0)  # (out ns, in ns) of a cycle
        self._on_out: Any = None  # the agent's tick, run inline where the engine's thread ends a slice
        self._rearm: Any = None  # sets the agent thread's timer (to the next due plus the margin)
        # while quiet: says at once, on the engine's thread, that the process does something again (one
        # datagram, built beforehand): the sidecar counts a quiet agent's silence as no replay, and the
        # agent's first tick after it comes a slice or more later (bench/README.md, session 32)
        self._on_resume: Any = None
        self._margin = 0  # how long past a due the engine has to swap before the agent's thread does
        # once the engine's thread drives: the agent's timer set this far past its last drive instead
        # of a margin past the next due (0: a margin past the due)
        self._idle_wake = 0
        self._calls = [0]  # the driver's calls with the hooks in (or polls) since _classify last ran
        self._calls_since = 0  # when they began to be counted
        self.fast = False  # the engine's steps come faster than FAST_STEP_NS (the idle wake applies)
        self.idle_armed = False  # the agent's timer stands at the idle wake, not a margin past a due
        # what the switch last set the agent's timer to, and whether as an idle wake: one far enough
        # ahead is left standing (each set is a syscall through ctypes, ~32 us on the H200's VM)
        self._armed = (0, False)
        self._pending: Any = None  # a tick the engine's thread runs in phases, one a call (an iterator)
        self._ticked_at = 0  # when the last tick began (on_out), for a tick overdue (`drive`)
        self._resume_due = 0  # the due to restore once the pending tick is done
        self._phase_lock = threading.Lock()  # one phase at a time (never held across calls)
        self._swapping = (
            False  # while driving: the hooks swap at each slice's edge (else held in: ticks only)
        )
        self.quiet = (
            False  # nothing happened for a while: hooks in, no cycle, the first driving call resumes it
        )
        self._polled = False  # a hook outside the switch calls poll() at each step (SGLang's run_batch)
        self._plan: Any = None  # ((sites, driving, driver, claiming), [(owner, name, in, out)]) for _set
        self._ranks: list[int] = []  # each site's rank (add's)
        self._direct: list[Direct | None] = []  # each site's direct call (add's), or None
        self._counters: list[list[int] | None] = []  # each site's counter (add's), or None
        self._claims: dict[int, Any] = {}  # a driver site's claiming hook, by index (made on first use)
        self._missed = 0  # the agent's thread swapped or ticked for the engine since it last drove (max 2)
        self._launch = -1  # index in _sites of the site whose original queues GPU work (a replay), -1: none
        self._runner: Any = None  # what the launch site holds while a tick is pending (launch, then a phase)
        self._runner_made: tuple[Any, Any] | None = None  # (the launch site's out function, its runner)
        # class attributes this switch set, by class (CLASS_CHANGES_MAX), and whether one reached it
        self.class_changes: dict[type, int] = {}
        self._versions_spent = False
        self._runner_ran = False  # the runner ran a phase since the driver's last call
        self._step_open = [False]  # the runner may run a phase (once per driver call: one a step)
        self.after_launch = 0  # the tick's phases run right after a launch so far (for describe())

    def add(
        self,
        owner: Any,
        name: str,
        original: Any,
        hook: Any,
        rank: int = 0,
        launches: bool = False,
        direct: Direct | None = None,
        counter: list[int] | None = None,
    ) -> None:
        """Manage owner.name (a class attribute or module global) that holds hook in place of original.

        rank: how well the site can drive the cycle (2: once an engine step, 1: a graph replay, 0: not).
        launches: the original returns once it has queued GPU work (a graph replay): the tick's phases
        run right after it, while the GPU runs what it queued (the first such site).
        direct: where original only defers to its base class's method (torch's `CUDAGraph.replay`,
        `hooks.base_call`): for an instance of exactly that class the driver's check calls the
        base's method instead, one frame fewer than the engine's own call (see `_driving_pair`).
        counter: with `direct`, the hook only adds 1 to counter[0] and makes that direct call, one
        frame as the engine's own: the site then holds its hook out as well as in (never swapped), and
        the driver's checks count the calls they make without it, so every call is counted (exact, not
        sampled: `exact`). Without `direct` it is ignored (the hook out would be a frame more).
        """
        with self._lock:
            if len(self._sites) >= MAX_SWITCHES:
                self._hold("too many hook sites")
                return
            self._sites.append((owner, name, original, hook))
            self._ranks.append(max(0, int(rank)))
            self._direct.append(direct)
            self._counters.append(counter)
            if launches and self._launch < 0:
                self._launch = len(self._sites) - 1
            try:
                setattr(hook, SWITCHED, True)
            except (AttributeError, TypeError):
                pass
            if rank > 0 and rank > self._rank:
                self._driver, self._rank = len(self._sites) - 1, rank
                self._wrapped = self._driving_pair(
                    original, hook, direct, self._counted(len(self._sites) - 1)
                )
                self._place_all()
            else:
                self._place(len(self._sites) - 1)

    def _driving_pair(
        self, original: Any, hook: Any, direct: Direct | None = None, counter: list[int] | None = None
    ) -> tuple[Any, Any]:
        """Return the driver site's functions: out, the engine's own behind a check; in, the hook behind one.

        With `direct` (add's) and original a method of `self` alone, the check calls the base's
        method itself for an instance of exactly that class (original for any other): the engine's
        own call is then one frame (torch's shim) the check takes the place of, so while the hooks
        are out the driver costs the engine the check's clock read alone, not a frame more. With
        `counter` (add's), a call the check makes without the hook adds 1 to counter[0] as the hook would.
        """
        due, clock, drive, calls = self.due, self._clock, self.drive, self._calls
        n = counter if counter is not None else [0]

        pair: tuple[Any, Any]
        if direct is not None and self_only(original):
            exact, base, ok = direct.exact, direct.base, direct.ok

            def thin_direct(self: Any) -> Any:
                if due[0] and clock() >= due[0] and drive():
                    return hook(self)
                n[0] += 1
                if type(self) is exact and ok[0]:
                    base(self)  # what original does for exactly this class: `super().replay()`
                    return None
                return original(self)

            def checked_direct(self: Any) -> Any:
                calls[0] += 1
                if due[0] and clock() >= due[0] and not drive():
                    n[0] += 1
                    if type(self) is exact and ok[0]:
                        base(self)
                        return None
                    return original(self)
                return hook(self)

            pair = (thin_direct, checked_direct)
        elif self_only(original):  # a step of `self` alone (EngineCore.step, a replay): no packing frame

            def thin_self(self: Any) -> Any:
                if due[0] and clock() >= due[0] and drive():
                    return hook(self)
                return original(self)

            def checked_self(self: Any) -> Any:
                calls[0] += 1
                if due[0] and clock() >= due[0] and not drive():
                    return original(self)
                return hook(self)

            pair = (thin_self, checked_self)
        else:

            def thin(*args: Any, **kwargs: Any) -> Any:
                if due[0] and clock() >= due[0] and drive():
                    return hook(*args, **kwargs)  # this call starts the slice: it is counted
                return original(*args, **kwargs)

            def checked(*args: Any, **kwargs: Any) -> Any:
                calls[0] += 1
                if due[0] and clock() >= due[0] and not drive():
                    return original(*args, **kwargs)  # this call starts after the slice: not counted
                return hook(*args, **kwargs)

            pair = (thin, checked)
        return (_dressed(pair[0], hook), _dressed(pair[1], hook))

    def _value(self, i: int, hooks_in: bool) -> Any:
        """Return what site i holds with the hooks in or out (its check while the engine drives)."""
        _, _, original, hook = self._sites[i]
        if self.driving:
            if i == self._driver:
                return self._wrapped[1] if hooks_in else self._wrapped[0]
            if hooks_in and self._missed and self._ranks[i] > 0:
                return self._claim_fn(i)
        return hook if hooks_in or self._counted(i) is not None else original

    def exact(self, counter: list[int]) -> bool:
        """Say whether every call of every site given `counter` (add's) is counted, hooks in or out.

        False where none was added (none patched, or past MAX_SWITCHES) or one can count only while
        its hook is in (no direct call): what the hooks count into `counter` is then a sample. No lock:
        the sites are only ever appended (on the engine's thread, in a tick's phase, this never waits).
        """
        mine = [i for i, c in enumerate(self._counters) if c is counter]
        return bool(mine) and all(self._counted(i) is counter for i in mine)

    def _counted(self, i: int) -> list[int] | None:
        """Return site i's counter where it counts every call (given one, with a direct call), else None."""
        return self._counters[i] if self._direct[i] is not None else None

    def _claim_fn(self, i: int) -> Any:
        """Return site i's claiming hook: it takes the drive over if it may, then runs as the driver's check."""
        fn = self._claims.get(i)
        if fn is None:
            hook, rank, claim = self._sites[i][3], self._ranks[i], self._claim

            def claiming(*args: Any, **kwargs: Any) -> Any:
                checked = claim(i, rank)
                if checked is None:
                    return hook(*args, **kwargs)
                return checked(*args, **kwargs)

            fn = self._claims[i] = _dressed(claiming, hook)
        return fn

    def _claim(self, i: int, rank: int) -> Any:
        """Make site i the driver if the one there missed its due (a lower rank: twice); its check, or None."""
        if self._missed < 2 and rank < self._rank:
            return None
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if not self.driving or i >= len(self._sites):
                return None
            if i != self._driver:
                if not self._missed or (self._missed < 2 and rank < self._rank):
                    return None
                _, _, original, hook = self._sites[i]
                self._driver, self._rank = i, rank
                self._wrapped = self._driving_pair(original, hook, self._direct[i], self._counted(i))
            self._missed = 0
            self._place_all()
            return self._wrapped[1]
        finally:
            self._lock.release()

    def _place_all(self) -> None:
        """Put what each site holds now in place (after the driver or the claiming state changed)."""
        for i in range(len(self._sites)):
            self._place(i)
        self._rebind()
        self._hold_if_spent()

    def _place(self, i: int) -> None:
        owner, name, _, _ = self._sites[i]
        self._put(owner, name, self._value(i, self.hooks_in))

    def _bound_value(self, original: Any, hook: Any, hooks_in: bool) -> Any:
        for i, site in enumerate(self._sites):
            if site[2] is original and (self.driving or self._counted(i) is not None):
                return self._value(i, hooks_in)
        return hook if hooks_in else original

    def adopt(self, obj: Any) -> None:
        """Manage the attributes of obj that hold a bound method of a managed function (vLLM's step_fn)."""
        try:
            attrs = list(vars(obj).items())
        except TypeError:
            return
        with self._lock:
            funcs = {id(f): (orig, hook) for _, _, orig, hook in self._sites for f in (orig, hook)}
            if self._driver >= 0:
                _, _, d_orig, d_hook = self._sites[self._driver]
                funcs.update({id(f): (d_orig, d_hook) for f in self._wrapped})
            for i, fn in self._claims.items():
                funcs[id(fn)] = (self._sites[i][2], self._sites[i][3])
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
                setattr(obj, name, types.MethodType(self._bound_value(pair[0], pair[1], self.hooks_in), obj))

    def hold(self, why: str) -> None:
        """Keep the hooks in for good: something counts into the same totals without being swapped."""
        with self._lock:
            self._hold(why)

    def _hold(self, why: str) -> None:
        self.held = self.held or why
        self.cycling = False
        self._set(True)
        if self.driving and self._swapping:  # the engine's step still drives the agent's tick, no swap
            self._swapping = False
            self._slice = (self._slice[0] + self._slice[1], 0)

    def undrive(self) -> None:
        """The engine's thread stops driving (the agent's thread swaps by itself again)."""
        with self._lock:
            self._undrive()

    def _undrive(self) -> None:
        """The engine's thread stops driving: every site holds its plain hook or original again."""
        self.quiet = False
        self._on_resume = None
        self._missed = 0
        self._armed = (0, False)
        if self.driving:
            self.driving = False
            self.due[0] = 0
            self._place_all()

    def drive_inline(
        self,
        out_ns: int,
        in_ns: int,
        margin_ns: int,
        on_out: Any,
        rearm: Any,
        quiet: bool = False,
        beat_ns: int = 0,
        idle_wake_ns: int = 0,
        on_resume: Any = None,
    ) -> bool:
        """Let the driver site swap the hooks (and call on_out() at each slice's end); False if none can.

        rearm(wake_ns) is called after each swap: the agent's thread sleeps to the next due plus
        margin_ns, so the engine, while it steps, always swaps first (an idle wake still at least half
        an idle wake ahead is left standing: `_rearm_for`). Where the hooks do not cycle
        (held, or in all the time) the driver only runs on_out() every out_ns + in_ns. quiet: the
        process does nothing the hooks see; keep them in with no cycle (nothing is swapped or
        ticked, the agent's thread sleeps) until a driving call resumes it (then even without a
        driver site yet: one added later, or a hook that polls, resumes it). beat_ns: while quiet,
        the agent's timer is set this far ahead (its quiet beat; 0: disarmed). idle_wake_ns: each
        drive on the engine's thread sets the agent's timer this far ahead rather than a margin past
        the next due (or leaves it where it stands at least half that far ahead), so the agent's
        thread takes no GIL for at least half that long after the engine stops
        stepping; a driving call that comes after a whole slice went by unseen catches up itself
        (`_catch_up`). 0: a margin past the due, the thread swapping for an engine that is late.
        on_resume: while quiet, called once on the engine's thread by the call that resumes the cycle
        (after the lock is let go; it must not block: the light agent sends one datagram built before).
        """
        with self._lock:
            if self._driver < 0 and not self._polled and not quiet:
                return False
            self._swapping = self.cycling
            out_ns, in_ns = int(out_ns), int(in_ns)
            self._slice = (out_ns, in_ns) if self._swapping else (out_ns + in_ns, 0)
            self._on_out, self._rearm = on_out, rearm
            self._margin = max(0, int(margin_ns))
            self._idle_wake = max(0, int(idle_wake_ns))
            self.driving, self.quiet = True, quiet
            self._on_resume = on_resume if quiet else None
            self._ticked_at = self._clock()
            # quiet: whichever driver site is called first resumes the cycle (the driver may never be)
            self._missed = 2 if quiet else 0
            if quiet:
                self._set(True)  # nothing calls them now: in, so what comes first is counted whole
                self.due[0] = 1  # the first driving call resumes the cycle
                wake = self._clock() + int(beat_ns) if beat_ns > 0 else 0
            else:
                self.due[0] = self._clock() + self._first_slice()
                wake = self.due[0] + self._margin
            self._armed = (wake, False)
            self._place_all()
        rearm(wake)
        return True

    def _first_slice(self) -> int:
        """Return how long from now the cycle's first slice lasts (in one with the hooks in, else out)."""
        return self._slice[1] if self._swapping and self.hooks_in else self._slice[0]

    def poll(self) -> None:
        """Drive the cycle from a hook the switch does not hold (SGLang's step): cheap unless due."""
        self._polled = True
        self._calls[0] += 1
        due = self.due[0]
        if due and self._clock() >= due:
            self.drive()

    def drive(self, by_thread: bool = False) -> bool:
        """Swap the hooks if a slice began or ended (at `due`); return whether they are in after.

        On the engine's thread (the driver site's check) the slice's edges are `due` itself, fixed in
        advance; the agent's thread, waking on its timer, swaps at its own wake-up time (as `set_in`).
        A slice's end hands on_out()'s tick to the engine's next calls, one phase each (a swap costs
        15-27 us, a phase 5-81 us on the H200: each call pays one part); the agent's thread runs the
        phases left all at once. Never blocks: a call that finds the lock taken
        leaves the work to the next one.
        """
        if not self._lock.acquire(blocking=False):
            return self.hooks_in
        pending = rearm = resumed = None
        try:
            now, due = self._clock(), self.due[0]
            if not self.driving or not due or now < due:
                return self.hooks_in
            missed, was_in = self._missed, self.hooks_in
            if self.quiet:  # the process does something again: the cycle starts from here
                if by_thread:
                    return self.hooks_in
                self.quiet = False
                self._missed = 0
                resumed, self._on_resume = self._on_resume, None
                self.due[0] = now + self._first_slice()
                wake, self.idle_armed = self._wake_at(now, by_thread)
                rearm = self._rearm_for(wake, now)
            elif self._pending is not None:  # a phase of the tick begun: the timer already stands
                if by_thread or not self._phase_after_launch():
                    pending = self._pending
            else:
                # the agent's thread does the engine's swap: the driver sites may claim the drive
                self._missed = min(2, missed + 1) if by_thread else 0
                if self._idle_wake and self._swapping and self._unseen(now, due):
                    ticks = self._catch_up(now, due)  # a whole slice went by with no call
                elif self._swapping and not (by_thread and was_in):
                    self._swap(now, due, by_thread)
                    ticks = not self.hooks_in  # the slice ended: its tick next
                else:
                    # hooks held; or the agent's thread found them in: the engine did not step through a
                    # driver site for a whole slice, so they stay in (each call counted, nothing swapped:
                    # a swap costs the engine's thread its type caches) until a driver's call swaps again
                    self._next_period(now, due, by_thread)
                    ticks = True
                # an engine whose work comes in bursts can call only while the hooks are out, each call
                # after a slice it missed: no slice then ends with a call, and no tick sends what the
                # hooks counted (every replay, where they count exactly) however long it steps. So a
                # call a period or more after the last tick ticks too.
                ticks = ticks or now - self._ticked_at >= self._slice[0] + self._slice[1]
                wake, self.idle_armed = self._wake_at(now, by_thread)
                if ticks and self._on_out is not None:
                    self._ticked_at = now
                    self._pending, self._resume_due = self._on_out(), self.due[0]
                    self.due[0] = 1  # the next call runs the first phase
                    pending = self._pending if by_thread else None
                    if not by_thread:
                        self._place_runner()  # or the launch this step makes: its phase hides behind the GPU
                rearm = self._rearm_for(wake, now)
            if bool(self._missed) != bool(missed) and self.hooks_in == was_in:
                self._place_all()  # (a swap placed them already, from the plan of the new state)
            hooks_in = self.hooks_in
        finally:
            self._lock.release()
        if resumed is not None:
            try:
                resumed()
            except Exception:
                pass
        if pending is not None:
            self._run_phases(pending, every=by_thread)
        if rearm is not None:
            try:
                rearm(wake)
            except Exception:
                pass
        return hooks_in

    def _rearm_for(self, wake: int, now: int) -> Any:
        """Return the agent's rearm to call with `wake`, None where its timer may stand (under the lock).

        An idle wake set earlier and still at least half an idle wake ahead stands: the agent's thread
        then wakes between half an idle wake and a whole one after the engine's last step, and a fast
        engine's drives set the timer about once every half idle wake instead of at every swap.
        """
        armed, idle = self._armed
        if self.idle_armed and idle and armed - now >= self._idle_wake // 2:
            return None
        self._armed = (wake, self.idle_armed)
        return self._rearm

    def _wake_at(self, now: int, by_thread: bool) -> tuple[int, bool]:
        """Return when the agent's thread should wake after this drive, and whether that is the idle wake."""
        if self._idle_wake and not by_thread and self.fast:
            return now + self._idle_wake, True  # the engine steps fast: its next call drives, however late
        return self.due[0] + self._margin, False

    def _unseen(self, now: int, due: int) -> bool:
        """Say whether the slice after `due` went by whole with no driving call (under the lock)."""
        out_ns, in_ns = self._slice
        return now >= due + (out_ns if self.hooks_in else in_ns)

    def _catch_up(self, now: int, due: int) -> bool:
        """Take up the cycle after a whole slice went by with no driving call; True if a tick is due.

        The engine stopped stepping, or one step outlasted a slice, and no thread swapped for it
        (the idle wake). Hooks in: they were in until now and counted what came, so they go out
        here and the tick follows, its scale over the time they were in (zero counts after a stop
        spread over that time, as when the agent's thread put them in a margin late). Hooks out: the
        slice they missed saw nothing, so the stretch since the last tick is left out of the next
        scale (else that tick would stand for it: after a minute's stop, ~1,000 times its slice).
        Either way the cycle starts again from now with the hooks out: this call is not counted.
        """
        tick = self.hooks_in
        if tick:
            self._classify(now, False)
            self._set(False, now)
        else:
            self._in_ns, self._scaled_at, self._since = 0, now, now
        self.due[0] = now + self._slice[0]
        return tick

    def _classify(self, now: int, by_thread: bool) -> None:
        """Say whether the engine steps fast (under FAST_STEP_NS a step) from its calls since the last time."""
        span = now - self._calls_since
        if by_thread:
            self.fast = False  # the engine left a swap to this thread: slow, or stopped
        elif span > 0:
            self.fast = self._calls[0] * FAST_STEP_NS >= span
        self._calls[0], self._calls_since = 0, now

    def _swap(self, now: int, due: int, by_thread: bool) -> None:
        out_ns, in_ns = self._slice
        # the engine swaps at `due` (its slices fixed in advance); the agent's thread, a margin late, at
        # its own wake-up, and sets the next due a margin early so that idle cycles keep their length
        at, early = (now, self._margin) if by_thread else (due, 0)
        if self.hooks_in:
            self._classify(now, by_thread)  # from the driver's calls in the slice
            self._set(False, at)
            self.due[0] = max(at + out_ns - early, now + 1)
        elif not by_thread and now >= due + in_ns:  # the whole slice went by unseen: the next one
            self.due[0] = now + out_ns
        else:
            self._set(True, at)
            self._calls[0], self._calls_since = 0, at
            self.due[0] = max(at + in_ns - early, now + 1)

    def _next_period(self, now: int, due: int, by_thread: bool) -> None:
        """The hooks in: the next tick's due one period on (from now where one went by unseen)."""
        period = self._slice[0] + self._slice[1]
        self._classify(now, by_thread)
        if by_thread:  # a margin late: set the next due as early, so that idle periods keep their length
            at, early = now, self._margin
        else:
            at, early = (now if now >= due + period else due), 0
        self.due[0] = max(at + period - early, now + 1)

    def _run_phases(self, pending: Any, every: bool, by_runner: bool = False) -> None:
        """Run the pending tick's next phase (every one where every=True); restore the due when done.

        by_runner: the launch site's runner calls; it puts the site back on its next call, so that no
        one call pays for the last phase and the class attribute's assignment (~20 us) together.
        """
        if not self._phase_lock.acquire(blocking=every):
            return
        done = False
        try:
            while not done:
                try:
                    done = next(pending, self) is self
                except Exception:
                    done = True  # never into the engine's step
                if not every:
                    break
        finally:
            self._phase_lock.release()
        if done:
            with self._lock:
                if self._pending is pending:
                    self._pending = None
                    if self.driving:
                        self.due[0] = self._resume_due
                if not by_runner:
                    self._remove_runner()
                else:
                    self._step_open[0] = True  # the runner's next call puts the site back

    def _place_runner(self) -> None:
        """While a tick is pending, let the launch site run its phases after the launch (under the lock).

        On a graph-captured decode the engine's thread, once the replay is queued, waits for the GPU:
        a phase run there costs the step nothing as long as the graph outlasts it. The driver's next
        calls skip their phase while the runner ran one since (`_phase_after_launch`); an engine that
        launches no graph (eager, or a graph-less step) gets its phases from the driver as before.
        """
        i = self._launch
        if i < 0 or self.hooks_in:
            return
        owner, name, _, _ = self._sites[i]
        out_fn = self._value(i, False)
        if getattr(owner, "__dict__", {}).get(name) is not out_fn:
            return  # the site holds something else (a bound copy, a hand-made hook): leave it
        made = self._runner_made
        if made is None or made[0] is not out_fn:  # made once per launch function (~20 us on the H200)
            made = self._runner_made = (out_fn, _launch_runner(out_fn, self._step_open, self._after_launch))
        self._runner = made[1]
        self._runner_ran = False
        self._step_open[0] = True  # this step's launch runs the first phase
        self._put(owner, name, self._runner)
        self._hold_if_spent()

    def _phase_after_launch(self) -> bool:
        """A driver's call while a tick is pending: True if the launch site runs the phase (under the lock)."""
        if self._runner is None:
            return False
        self._step_open[0] = True  # one phase in this step
        ran, self._runner_ran = self._runner_ran, False
        return ran

    def _after_launch(self) -> None:
        """The runner's part once the launch returned: the pending tick's next phase; never raises."""
        try:
            pending = self._pending
            if pending is None:
                if self._lock.acquire(blocking=False):
                    try:
                        self._remove_runner()
                    finally:
                        self._lock.release()
                return
            self._runner_ran = True
            self.after_launch += 1
            self._run_phases(pending, every=False, by_runner=True)
        except Exception:
            pass

    def _remove_runner(self) -> None:
        """Put back what the launch site holds now, if it still holds the runner (under the lock)."""
        runner, self._runner = self._runner, None
        if runner is None or self._launch < 0:
            return
        owner, name, _, _ = self._sites[self._launch]
        if getattr(owner, "__dict__", {}).get(name) is runner:
            self._put(owner, name, self._value(self._launch, self.hooks_in))
            self._hold_if_spent()

    def finish_pending(self) -> None:
        """Run what is left of a tick the engine's thread had begun (the agent stops or takes over)."""
        pending = self._pending
        if pending is not None:
            self._run_phases(pending, every=True)  # clears it

    def start_cycle(self) -> bool:
        """Let the agent's thread swap the hooks; False (hooks stay in) when something holds them."""
        with self._lock:
            self.cycling = not self.held
            return self.cycling

    def stop_cycle(self) -> None:
        """Put the hooks in for good (the agent stopped, or CUPTI times every step)."""
        with self._lock:
            self.cycling = False
            self._undrive()
            self._set(True)

    def set_in(self, hooks_in: bool) -> None:
        """Swap every managed hook in or out (the agent's thread); a no-op when not cycling."""
        with self._lock:
            if self.cycling or hooks_in:
                self._set(hooks_in)

    def _set(self, hooks_in: bool, at: int | None = None) -> None:
        now = self._clock() if at is None else at
        if hooks_in == self.hooks_in:
            return
        if self.hooks_in:
            self._in_ns += max(0, now - self._since)
        self._since = now
        self.hooks_in = hooks_in
        self.check_direct()
        # what each site holds in and out, worked out once per change of sites or drive: a swap on the
        # engine's thread is then one setattr a site (its caches are cold: every step there is a pause)
        plan = self._plan
        key = (len(self._sites), self.driving, self._driver, bool(self._missed))
        if plan is None or plan[0] != key:
            plan = self._plan = (
                key,
                [
                    (s[0], s[1], self._value(i, True), self._value(i, False))
                    for i, s in enumerate(self._sites)
                ],
            )
        for owner, name, value_in, value_out in plan[1]:
            self._put(owner, name, value_in if hooks_in else value_out)
        if self._bound:
            self._rebind()
        self._hold_if_spent()

    def check_direct(self) -> None:
        """End each site's direct call whose base was patched since (`Direct.still`: a dict read a site).

        At each swap, and at each of the agent's ticks (the hooks may be held in, with no swaps).
        """
        for direct in self._direct:
            if direct is not None:
                direct.still()

    def _put(self, owner: Any, name: str, value: Any) -> None:
        """Set owner.name to value (under the lock); a class's attribute only where it changes, and counted.

        Setting a class attribute, even to the value it holds, changes the class's type version
        (CLASS_CHANGES_MAX). Where a class reaches the budget, the change under way ends as it began
        and then the hooks go in and stay (`_hold_if_spent`).
        """
        if not isinstance(owner, type):
            setattr(owner, name, value)
            return
        if owner.__dict__.get(name) is value:
            return
        setattr(owner, name, value)
        if CLASS_CHANGES_MAX:
            n = self.class_changes[owner] = self.class_changes.get(owner, 0) + 1
            self._versions_spent = self._versions_spent or n >= CLASS_CHANGES_MAX

    def _hold_if_spent(self) -> None:
        """Hold the hooks in once a class reached CLASS_CHANGES_MAX (under the lock; after a whole change)."""
        if self._versions_spent and not self.held:
            self._hold(HELD_FOR_VERSIONS)

    def _rebind(self) -> None:
        live = []
        for ref, name, original, hook in self._bound:
            obj = ref()
            if obj is not None:
                setattr(obj, name, types.MethodType(self._bound_value(original, hook, self.hooks_in), obj))
                live.append((ref, name, original, hook))
        self._bound = live

    def scale(self, now_ns: int | None = None) -> float:
        """Return the span since the last call over the time the hooks were in during it (1.0 when always in).

        Where they were out all along while the engine drives (a tick on a call that came a period
        after the last tick, as the hooks go in), nothing was sampled: 1.0, and the span, up to two
        periods, is carried into the next call's, so that the next slice's counts stand for it too
        (else that stretch would count as none, and a slow engine whose calls come late would have its
        step rates cut by the out share). A longer one is dropped, as `_catch_up` drops a stop's.
        """
        with self._lock:
            now = self._clock() if now_ns is None else now_ns
            in_ns = self._in_ns + (now - self._since if self.hooks_in else 0)
            span = now - self._scaled_at
            if in_ns <= 0 and 0 < span < 2 * (self._slice[0] + self._slice[1]) and not self.hooks_in:
                return 1.0
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
        self._undrive()
        self._set(True)


def _launch_runner(out_fn: Any, step_open: list[bool], after: Any) -> Any:
    """Return the launch site's stand-in while a tick is pending: the site's own call, then one phase a step."""
    if self_only(out_fn):

        def launch_then_phase_self(self: Any) -> Any:
            result = out_fn(self)
            if step_open[0]:
                step_open[0] = False
                after()
            return result

        fn: Any = launch_then_phase_self
    else:

        def launch_then_phase(*args: Any, **kwargs: Any) -> Any:
            result = out_fn(*args, **kwargs)
            if step_open[0]:
                step_open[0] = False
                after()
            return result

        fn = launch_then_phase
    return _dressed(fn, out_fn)


def _dressed(fn: Any, like: Any) -> Any:
    """Give fn the name, qualified name, doc and __wrapped__ of `like`, and this module's mark; return it."""
    for attr in ("__name__", "__qualname__", "__doc__", "__wrapped__"):
        try:
            setattr(fn, attr, getattr(like, attr))
        except (AttributeError, TypeError):
            pass
    setattr(fn, SWITCHED, True)
    return fn


def self_only(fn: Any) -> bool:
    """Say whether fn is a plain function of one positional parameter (a method of `self` alone).

    Read from its code, never from a signature it may claim (`__signature__`, `__wrapped__`), so a
    wrapper that calls fn with `self` alone passes on every argument fn can take.

    A `(*args, **kwargs)` frame on a GPU step's path cost 0.2-4 us on the H200 (bench/README.md,
    session 5) where one of the same signature cost nothing measurable.
    """
    code = getattr(fn, "__code__", None)
    if code is None or not isinstance(fn, types.FunctionType):
        return False
    return (
        code.co_argcount == 1
        and code.co_kwonlyargcount == 0
        and not code.co_flags & 0x0C  # CO_VARARGS | CO_VARKEYWORDS
        and not code.co_posonlyargcount > 1
    )


SWITCH = Switch()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=SWITCH.after_fork)


class Carry:
    """Scale counts by a factor into integers, carrying each key's remainder to its next count."""

    MAX_KEYS = 1024

    def __init__(self) -> None:
        self._rest: dict[Any, float] = {}
        self._vectors: dict[Any, list[float]] = {}

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

    def vector(self, key: Any, counts: list[int], factor: float) -> list[int]:
        """Scale a list of counts, each with its own carry kept under one key (as many, in one pass)."""
        rest = self._vectors.get(key)
        if rest is None:
            if factor == 1.0:
                return counts
            rest = [0.0] * len(counts)
        xs = [n * factor + r for n, r in zip(counts, rest, strict=True)]
        out = [int(x) for x in xs]
        if key in self._vectors or len(self._vectors) < self.MAX_KEYS:
            self._vectors[key] = [x - o for x, o in zip(xs, out, strict=True)]
        return out
