"""Ways into inference engines: vLLM and SGLang plugin entry points, and the BOUNDWATCH_AGENT autostart.

Each function is re-entrant, never raises, and does nothing where its target is absent or its
internals differ from what it expects (checked by attribute, not by version number). Patches are
applied when their module is imported (exporter.agent.importhook), in whichever process that is:
under `vllm serve` the plugin loads in the API server before `vllm.v1.engine.core` is imported, and
the EngineCore forked from it inherits the patched class (it does not load plugins again).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

from exporter.agent import hooks
from exporter.agent.importhook import when_imported
from exporter.agent.steps import MODE_EAGER, MODE_GRAPH, MODE_UNKNOWN
from exporter.agent.switch import SWITCH, SWITCHED, self_only

_patched: set[str] = set()
_steps_started: list[bool] = []
_cache: dict[int, tuple[Any, ...]] = {}  # id(engine or runner) -> what its config says (read once)
MAX_CACHE = 64
# The light agent's own thread hands an engine's steps to its tracker at each of its ticks (every
# flush_s, 0.5 s: the batch and the scheduler's counts are sampled then, as a page read each tick
# would), so the engine's thread only counts and times each step (two clock reads, three stores):
# work done between two steps delays the next launch, while the agent's thread runs as the
# engine's thread waits on the GPU with the GIL released. Measured on the H200
# (bench/light_step_parts.py): handing over on the engine's thread every 10 ms cost 9-17 us a step
# on 1.4-4.2 ms decode steps, the agent's thread doing it 6-7 us. The engine's thread still hands
# over once per STEP_SAMPLE_NS itself, a backstop should the agent's thread not run.
STEP_SAMPLE_NS = 2_000_000_000
# Every step is counted, one in TIME_EVERY is timed (and each step after one that took
# LONG_STEP_NS or more, where two clock reads are nothing): the hand-over scales the timed steps'
# mean wall time to all of them. On the H200 two clock reads on a GPU step's path cost 1.4 us of
# the wrapper's 1.8-4.7 us a step (bench/light_step_parts.py, session 5).
TIME_EVERY = 8
LONG_STEP_NS = 20_000_000
_wrappers: list[
    tuple[list[int], str, Any, Any, list[Any], Any]
] = []  # every wrap_step's counters (flush_pending)
_handover = threading.Lock()


def _enabled() -> bool:
    return os.environ.get("BOUNDWATCH_AGENT", "1").strip().lower() not in {"0", "off", "false", "no"}


def _start(role: str, **settings: Any) -> None:
    try:
        from exporter import agent

        agent.start(role=role, **settings)
    except Exception:
        pass


def _tracker() -> Any:
    """Return the running agent's StepTracker, or None."""
    a = sys.modules["exporter.agent"]._agent
    return None if a is None else a.steps


def _cached(obj: Any, read: Any) -> tuple[Any, ...]:
    key = id(obj)
    got = _cache.get(key)
    if got is None:
        try:
            got = read(obj)
        except Exception:
            got = ()
        if len(_cache) < MAX_CACHE:
            _cache[key] = got
    return got


def _int_or(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def _mode_of(cg_mode: Any) -> int:
    """Return MODE_GRAPH / MODE_EAGER for a vLLM CUDAGraphMode (NONE is eager), MODE_UNKNOWN otherwise."""
    if cg_mode is None:
        return MODE_UNKNOWN
    name = getattr(cg_mode, "name", None)
    if not isinstance(name, str):
        name = str(cg_mode).rsplit(".", 1)[-1]
    if name == "NONE":
        return MODE_EAGER
    return (
        MODE_GRAPH
        if name in ("FULL", "PIECEWISE", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
        else MODE_UNKNOWN
    )


# --- vLLM ---------------------------------------------------------------------------------


def vllm_plugin() -> None:
    """Entry point `vllm.general_plugins`: patch workers, EngineCore and the model runners where they load.

    vLLM loads general plugins in its API servers, EngineCore and every GPU worker. The agent
    starts where init_device runs (a real GPU worker) and where an engine core steps; the graph
    hooks go in at once, so every capture in a worker is seen.
    """
    if not _enabled():
        return
    try:
        hooks.install()
        for name in ("vllm.v1.worker.worker_base", "vllm.worker.worker_base"):  # 0.11+, 0.10.x
            when_imported(name, _patch_vllm_worker)
        when_imported("vllm.v1.engine.core", _patch_vllm_engine_core)
        when_imported("vllm.v1.worker.gpu.model_runner", _patch_vllm_runner_v2)
        when_imported("vllm.v1.worker.gpu_model_runner", _patch_vllm_runner_v1)
    except Exception:
        pass


def _patch_vllm_worker(worker_base: Any) -> None:
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


def vllm_counts(core: Any) -> tuple[int, int, int, int]:
    """Return an EngineCore's (running, waiting, batch limit, DP rank); -1 / 0 for what it lacks."""
    running = waiting = -1
    counts = getattr(getattr(core, "scheduler", None), "get_request_counts", None)
    if counts is not None:
        got = counts()
        if type(got) is tuple and len(got) == 2:
            running, waiting = got
            if type(running) is not int or running < 0:
                running = -1
            if type(waiting) is not int or waiting < 0:
                waiting = -1
    limit, dp = _cache.get(id(core)) or _cached(core, _vllm_limits) or (0, -1)
    return running, waiting, limit, dp


def _vllm_limits(core: Any) -> tuple[int, int]:
    cfg = getattr(core, "vllm_config", None)
    sched_cfg = getattr(cfg, "scheduler_config", None) or getattr(
        getattr(core, "scheduler", None), "scheduler_config", None
    )
    limit = _int_or(getattr(sched_cfg, "max_num_seqs", None), 0)
    active = _int_or(getattr(sched_cfg, "max_num_active_seqs", None), 0)
    if active and (not limit or active < limit):
        limit = active  # the tighter cap, where 0.33's max_num_active_seqs is set
    dp = _int_or(getattr(getattr(cfg, "parallel_config", None), "data_parallel_rank", None), -1)
    return limit, dp


def wrap_step(
    step: Any,
    engine: str,
    batch_of: Any,
    counts_of: Any = None,
    clock: Any = time.time_ns,
    sample_ns: int = 0,
    prepare: Any = None,
    time_every: int = TIME_EVERY,
) -> Any:
    """Return step wrapped to count each call that ran the model, with the same arguments and result.

    batch_of(core, n) returns the scheduled tokens and sequences of the n steps being handed over;
    prepare(core), where given, runs before the first step and at every hand-over (vLLM's patches
    its scheduler class there, not in a frame of its own around every step).

    Every model step is counted on the engine's thread; one call in time_every is timed (two clock
    reads), and so is each call after a step of LONG_STEP_NS or more or one that ran no model.
    The light agent's thread hands the steps since over to the tracker at each tick, with the
    batch and the scheduler's counts of that moment (`flush_pending`), their wall time the timed
    steps' mean times their number, never more than the time since the last hand-over; the
    engine's thread does so itself only at its first step and then at most once per
    STEP_SAMPLE_NS (or sample_ns, where set), or after every step, each timed, where CUPTI
    attaches GPU time to each (per_step). A hand-over that falls between a step's count and its
    wall time gives that wall time to the next hand-over. A step that takes only self (vLLM's
    EngineCore.step) gets a wrapper of that signature: on the H200 each frame on a GPU step's
    path costs microseconds (bench/light_step_parts.py).
    """
    acc = [0] * _ACC
    acc[_OWN] = max(0, int(sample_ns))
    acc[_STRIDE] = max(0, int(time_every) - 1)
    core_ref: list[Any] = [None]
    if len(_wrappers) < MAX_CACHE:
        _wrappers.append((acc, engine, batch_of, counts_of, core_ref, prepare))

    def first(core: Any) -> None:
        tracker = _tracker()  # until the first hand-over: mode counts made inside the step are this engine's
        if tracker is not None:
            tracker.engine_here = True
        if getattr(wrapped, SWITCHED, False):  # its attributes holding this hook bound (step_fn) swap too
            SWITCH.adopt(core)
        else:
            SWITCH.hold("a step hook installed by hand")  # counted always: no count may be scaled
        if prepare is not None:
            try:
                prepare(core)
            except Exception:
                pass

    def handover(core: Any) -> None:
        try:
            _record_step(core, engine, batch_of, counts_of, acc, core_ref, prepare=prepare)
        except Exception:
            pass

    wrapped = _timed(step, acc, clock, first, handover)
    functools.update_wrapper(wrapped, step)
    wrapped.__boundwatch__ = True  # type: ignore[attr-defined]
    return wrapped


def hook_step(
    cls: Any, name: str, engine: str, batch_of: Any, counts_of: Any = None, prepare: Any = None
) -> bool:
    """Install wrap_step over cls.name through the switch (sampled: in for a slice of each agent tick).

    Returns False where cls has no such function of its own or it is hooked already.
    """
    fn = cls.__dict__.get(name)
    if fn is None or getattr(fn, "__boundwatch__", False):
        return False
    SWITCH.add(cls, name, fn, wrap_step(fn, engine, batch_of, counts_of, prepare=prepare), rank=2)
    return True


# wrap_step's counters, one list per wrapper (read and written under the GIL, by slot):
# steps counted, wall ns of the timed ones, the last hand-over's end, steps and wall handed over,
# the backstop period, the newest timed step's end, this wrapper's own period (0: STEP_SAMPLE_NS),
# calls left before the next timed one, steps timed, timed steps handed over, calls left after a
# timed one (time_every - 1), the last hand-over's mean wall ns a step
_ACC = 13
_N, _WALL, _HANDED_AT, _N_HANDED, _WALL_HANDED, _PERIOD, _LAST_T1, _OWN = range(8)
_SKIP, _TIMED, _TIMED_HANDED, _STRIDE, _MEAN = range(8, 13)


def _timed(step: Any, acc: list[int], clock: Any, first: Any, handover: Any) -> Any:
    """Return the per-step wrapper of wrap_step: count each model step, time one in TIME_EVERY, hand over when due."""
    # The two bodies below are the same but for the call's signature (a frame costs; see above).
    if self_only(step):

        def wrapped(self: Any) -> Any:
            if acc[8]:  # _SKIP: counted, not timed
                acc[8] -= 1
                result = step(self)
                if not (isinstance(result, tuple) and len(result) == 2 and result[1] is False):
                    acc[0] += 1
                return result
            if not acc[2]:
                first(self)
            t0 = clock()
            result = step(self)
            t1 = clock()
            if isinstance(result, tuple) and len(result) == 2 and result[1] is False:
                return result  # no model step ran (EngineCore.step's model_executed): time the next
            acc[1] += t1 - t0
            acc[9] += 1
            acc[0] += 1
            acc[6] = t1
            if t1 - t0 < LONG_STEP_NS:
                acc[8] = acc[11]
            if t1 - acc[2] >= acc[5]:
                handover(self)
            return result
    else:

        def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
            if acc[8]:
                acc[8] -= 1
                result = step(self, *args, **kwargs)
                if not (isinstance(result, tuple) and len(result) == 2 and result[1] is False):
                    acc[0] += 1
                return result
            if not acc[2]:
                first(self)
            t0 = clock()
            result = step(self, *args, **kwargs)
            t1 = clock()
            if isinstance(result, tuple) and len(result) == 2 and result[1] is False:
                return result
            acc[1] += t1 - t0
            acc[9] += 1
            acc[0] += 1
            acc[6] = t1
            if t1 - t0 < LONG_STEP_NS:
                acc[8] = acc[11]
            if t1 - acc[2] >= acc[5]:
                handover(self)
            return result

    return wrapped


def _record_step(
    core: Any,
    engine: str,
    batch_of: Any,
    counts_of: Any,
    acc: list[int],
    core_ref: list[Any],
    tracker: Any = None,
    prepare: Any = None,
    now_ns: int = 0,
) -> None:
    """Hand the steps counted since the last hand-over to the tracker, with the newest batch and counts.

    now_ns: when the agent's thread hands over (steps counted after the newest timed one ran
    before it, and the counts are read then); 0 on the engine's thread, whose newest step is the
    timed one that just ended. The steps are placed to end at the later of the two.
    """
    tracker = tracker or _tracker()
    if tracker is None and not _steps_started:
        _steps_started.append(True)  # once: only a process that really steps gets an agent
        _start(f"{engine}_engine", mode="light")
        tracker = _tracker()
    if tracker is None:
        return
    tracker.engine_here = True
    with _handover:  # the engine's thread, or the agent's flushing an idle engine's last steps
        # read at once: the engine's thread may step meanwhile
        steps, walls, timed, t1 = acc[_N], acc[_WALL], acc[_TIMED], acc[_LAST_T1]
        n, wall, n_timed = steps - acc[_N_HANDED], walls - acc[_WALL_HANDED], timed - acc[_TIMED_HANDED]
        if n <= 0:
            return
        since = acc[_HANDED_AT]
        end = max(t1, now_ns)  # the counts below are read now: the left rule integrates to here
        if n_timed > 0:
            acc[_MEAN] = wall // n_timed
        estimate = max(wall, acc[_MEAN] * n)  # the untimed steps at the timed ones' mean
        if since:
            estimate = min(estimate, max(wall, end - since))
        acc[_HANDED_AT], acc[_N_HANDED], acc[_WALL_HANDED], acc[_TIMED_HANDED] = end, steps, walls, timed
        acc[_PERIOD] = 0 if tracker.per_step else (acc[_OWN] or STEP_SAMPLE_NS)
        if tracker.per_step or SWITCH.cycling:  # CUPTI times each step; a slice's steps are few: time all
            acc[_STRIDE] = acc[_SKIP] = 0
        if core_ref[0] is None:
            try:
                core_ref[0] = weakref.ref(core)
            except TypeError:
                core_ref[0] = lambda: None
        if prepare is not None:
            try:
                prepare(core)
            except Exception:
                pass
        tokens, seqs = batch_of(core, n)
        counts = counts_of(core) if counts_of is not None else ()
        tracker.record(engine, end - estimate, end, tokens, seqs, *counts, n=n)


def flush_pending(tracker: Any, idle_ns: int, now_ns: int | None = None) -> None:
    """Hand over to tracker the steps counted since the last hand-over whose newest ended idle_ns ago or more (agent's thread)."""
    for _ in flush_phases(tracker, idle_ns, now_ns):
        pass


def flush_phases(tracker: Any, idle_ns: int, now_ns: int | None = None) -> Iterator[None]:
    """flush_pending one engine at a time: a pause after each engine that had steps to hand over."""
    now = time.time_ns() if now_ns is None else now_ns
    for acc, engine, batch_of, counts_of, core_ref, prepare in list(_wrappers):
        if acc[_N] > acc[_N_HANDED] and now - acc[_LAST_T1] >= idle_ns and core_ref[0] is not None:
            core = core_ref[0]()
            if core is not None:
                try:
                    _record_step(core, engine, batch_of, counts_of, acc, core_ref, tracker, prepare, now)
                except Exception:
                    pass
                yield


def _patch_vllm_engine_core(core_mod: Any) -> None:
    engine_core = getattr(core_mod, "EngineCore", None)
    if engine_core is None or "vllm_engine" in _patched:
        return
    # scheduled tokens and sequences: totals written by the engine's thread (the schedule wrapper),
    # and what the hand-overs took so far (under _handover, on either thread): no update is lost
    last = [0, 0]
    taken = [0, 0]

    def batch_of(core: Any, n: int) -> tuple[int, int]:
        tokens, seqs = last[0], last[1]
        got = (tokens - taken[0], seqs - taken[1])
        taken[0], taken[1] = tokens, seqs
        return got

    seen: set[type] = set()

    def patch_scheduler(core: Any) -> None:
        sched_cls = type(getattr(core, "scheduler", None))
        if sched_cls not in seen:  # once per scheduler class
            if len(seen) < MAX_CACHE:
                seen.add(sched_cls)
            _patch_schedule(sched_cls, last)

    patched_any = False
    for name in ("step", "step_with_batch_queue"):
        patched_any |= hook_step(engine_core, name, "vllm", batch_of, vllm_counts, prepare=patch_scheduler)
    if patched_any:
        _adopt_after_init(engine_core)
        _patched.add("vllm_engine")  # the light agent starts at the first step (EngineCore only)


def _adopt_after_init(cls: Any) -> None:
    """Wrap cls.__init__ so that each instance's attributes bound to a managed hook (step_fn) swap with it."""
    init = cls.__dict__.get("__init__")
    if init is None or getattr(init, "__boundwatch__", False):
        return

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        try:
            SWITCH.adopt(self)
        except Exception:
            pass

    __init__.__boundwatch__ = True  # type: ignore[attr-defined]
    cls.__init__ = __init__


def _patch_schedule(sched_cls: Any, last: list[int]) -> None:
    schedule = getattr(sched_cls, "schedule", None)
    if sched_cls is None or schedule is None or getattr(schedule, "__boundwatch__", False):
        return

    @functools.wraps(schedule)
    def schedule_wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        output = schedule(self, *args, **kwargs)
        try:  # read in place (no helper's frame on every step); any other shape counts nothing
            tokens = output.total_num_scheduled_tokens
            per_req = output.num_scheduled_tokens
            if tokens.__class__ is int and per_req.__class__ is dict:
                last[0] += tokens  # totals, only ever added to here; a hand-over takes the difference
                last[1] += len(per_req)
        except Exception:
            pass
        return output

    schedule_wrapped.__boundwatch__ = True  # type: ignore[attr-defined]
    SWITCH.add(sched_cls, "schedule", schedule, schedule_wrapped)


def _vllm_runner_place(runner: Any) -> tuple[bool, int]:
    """Return (whether this runner speaks for its step: TP rank 0, first PP stage; its DP rank)."""
    ps = sys.modules.get("vllm.distributed.parallel_state")
    first = True
    for group, attr, want in (("get_tp_group", "rank_in_group", 0), ("get_pp_group", "is_first_rank", True)):
        try:
            value = getattr(getattr(ps, group)(), attr)
            first = first and value == want
        except Exception:
            pass
    dp = getattr(runner, "dp_rank", None)
    if not isinstance(dp, int):
        cfg = getattr(getattr(runner, "vllm_config", None), "parallel_config", None) or getattr(
            runner, "parallel_config", None
        )
        dp = getattr(cfg, "data_parallel_rank", None)
    return first, _int_or(dp, -1)


def _count_runner_mode(runner: Any, mode: int) -> None:
    if mode == MODE_UNKNOWN:
        return
    first, dp = _cached(runner, _vllm_runner_place) or (True, -1)
    tracker = _tracker()
    if first and tracker is not None:
        tracker.count_mode("vllm", dp, mode == MODE_GRAPH)


def _wrap_execute(cls: Any, slot: list[Any], skip_dummy: bool) -> None:
    execute = cls.__dict__.get("execute_model")
    if execute is None or getattr(execute, "__boundwatch__", False):
        return

    @functools.wraps(execute)
    def execute_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        slot[0] = None
        result = execute(self, *args, **kwargs)
        try:
            mode = slot[0]
            dummy = kwargs.get("dummy_run", args[2] if len(args) > 2 else False) if skip_dummy else False
            if mode is not None and dummy is not True:
                _count_runner_mode(self, _mode_of(mode))
        except Exception:
            pass
        return result

    execute_model.__boundwatch__ = True  # type: ignore[attr-defined]
    # once a model step: where no engine core steps in this process (a GPU worker of TP > 1), it drives
    # the hook cycle in eager mode too, where no graph replay would
    SWITCH.add(cls, "execute_model", execute, execute_model, rank=2)


def _patch_vllm_runner_v2(mod: Any) -> None:
    """V2 runner (0.33's default): dispatch_cg_and_sync_dp returns (descriptor with cg_mode, DP state)."""
    cls = getattr(mod, "GPUModelRunner", None)
    dispatch = getattr(mod, "dispatch_cg_and_sync_dp", None)
    if cls is None or dispatch is None or getattr(dispatch, "__boundwatch__", False):
        return
    slot: list[Any] = [None]

    @functools.wraps(dispatch)
    def dispatch_seen(*args: Any, **kwargs: Any) -> Any:
        result = dispatch(*args, **kwargs)
        try:
            slot[0] = getattr(result[0], "cg_mode", None)
        except Exception:
            pass
        return result

    dispatch_seen.__boundwatch__ = True  # type: ignore[attr-defined]
    SWITCH.add(mod, "dispatch_cg_and_sync_dp", dispatch, dispatch_seen)  # the runner's own global
    _wrap_execute(cls, slot, skip_dummy=True)
    _patched.add("vllm_runner_v2")


def _patch_vllm_runner_v1(mod: Any) -> None:
    """V1 runner: _determine_batch_execution_and_padding returns (CUDAGraphMode, descriptor, ...)."""
    cls = getattr(mod, "GPUModelRunner", None)
    determine = getattr(cls, "_determine_batch_execution_and_padding", None)
    if cls is None or determine is None or getattr(determine, "__boundwatch__", False):
        return
    slot: list[Any] = [None]

    @functools.wraps(determine)
    def determine_seen(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = determine(self, *args, **kwargs)
        try:
            slot[0] = result[0]
        except Exception:
            pass
        return result

    determine_seen.__boundwatch__ = True  # type: ignore[attr-defined]
    SWITCH.add(cls, "_determine_batch_execution_and_padding", determine, determine_seen)
    _wrap_execute(cls, slot, skip_dummy=False)  # dummy runs call the dispatch outside execute_model
    _patched.add("vllm_runner_v1")


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_steps_started.clear)  # a forked engine core starts its own agent


# --- SGLang -------------------------------------------------------------------------------

SGLANG_SCHEDULER = "sglang.srt.managers.scheduler"
SGLANG_RUNNER = "sglang.srt.model_executor.model_runner"


def sglang_plugin() -> None:
    """Entry point `sglang.srt.plugins`: in the scheduler process (SGLang's GPU worker) start the agent
    and hook the scheduler's run_batch and the model runner's forward (HookRegistry where it exists)."""
    if not _enabled():
        return
    frame = sys._getframe(1)
    while frame is not None:  # loaded from run_scheduler_process: the scheduler, SGLang's GPU worker
        if frame.f_code.co_name == "run_scheduler_process":
            try:
                hooks.install()
                _hook_sglang()
            except Exception:
                pass
            _start("sglang_scheduler")
            return
        frame = frame.f_back  # type: ignore[assignment]


def _hook_sglang() -> None:
    if "sglang" in _patched:
        return
    _patched.add("sglang")
    SWITCH.hold("sglang hooks")  # SGLang's hook registry installs them: they cannot be swapped out
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType  # type: ignore[import-not-found]
    except Exception:
        HookRegistry = None  # older SGLang: patch the classes where they load
    if HookRegistry is not None:
        HookRegistry.register(f"{SGLANG_SCHEDULER}.Scheduler.run_batch", sglang_run_batch, HookType.AROUND)
        HookRegistry.register(f"{SGLANG_RUNNER}.ModelRunner._forward_raw", sglang_forward_raw, HookType.AFTER)
        return
    when_imported(
        SGLANG_SCHEDULER, lambda m: _wrap_around(getattr(m, "Scheduler", None), "run_batch", sglang_run_batch)
    )
    when_imported(
        SGLANG_RUNNER,
        lambda m: _wrap_after(getattr(m, "ModelRunner", None), "_forward_raw", sglang_forward_raw),
    )


def _wrap_around(cls: Any, name: str, hook: Any) -> None:
    fn = getattr(cls, name, None)
    if fn is None or getattr(fn, "__boundwatch__", False):
        return

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return hook(fn, *args, **kwargs)

    wrapper.__boundwatch__ = True  # type: ignore[attr-defined]
    setattr(cls, name, wrapper)


def _wrap_after(cls: Any, name: str, hook: Any) -> None:
    fn = getattr(cls, name, None)
    if fn is None or getattr(fn, "__boundwatch__", False):
        return

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = fn(*args, **kwargs)
        hook(result, *args, **kwargs)
        return result

    wrapper.__boundwatch__ = True  # type: ignore[attr-defined]
    setattr(cls, name, wrapper)


def _sglang_place(obj: Any) -> tuple[bool, int]:
    """Return (whether this rank speaks for its steps: attention-TP, pipeline and context rank 0, as
    SGLang's own scheduler decides; its DP rank, the attention-DP rank where DP is not set)."""
    mod = sys.modules.get(SGLANG_SCHEDULER)
    parallel = None
    try:
        parallel = mod.get_parallel()  # type: ignore[union-attr]
    except Exception:
        pass

    def field(*names: str) -> Any:
        for source in (parallel, obj):  # the published parallel context first, then the scheduler's own
            for name in names:
                try:  # SGLang's context raises other errors than AttributeError for unpublished fields
                    value = getattr(source, name)
                except Exception:
                    continue
                if value is not None:
                    return value
        return None

    speaks = all(
        field(*names) in (0, None) for names in (("attn_tp_rank", "tp_rank"), ("pp_rank",), ("attn_cp_rank",))
    )
    return speaks, _int_or(field("dp_rank", "attn_dp_rank"), 0)


def sglang_run_batch(original: Any, self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND hook on Scheduler.run_batch: time the batch and read the scheduler's counts."""
    t0 = time.time_ns()
    result = original(self, batch, *args, **kwargs)
    t1 = time.time_ns()
    try:
        first, dp = _cached(self, _sglang_place) or (True, 0)
        tracker = _tracker()
        if first and tracker is not None:
            tracker.engine_here = True
            reqs = getattr(batch, "reqs", None) or ()
            seqs = len(reqs)
            mode = getattr(batch, "forward_mode", None)
            decode = bool(getattr(mode, "is_decode", lambda: False)())
            tokens = seqs if decode else _int_or(getattr(batch, "extend_num_tokens", None), seqs)
            running_batch = getattr(self, "running_batch", None)
            running = len(getattr(running_batch, "reqs", None) or ())
            if batch is not running_batch:
                running += seqs  # a prefill batch joins the running batch after it runs
            waiting = len(getattr(self, "waiting_queue", None) or ())
            limit = _int_or(getattr(self, "max_running_requests", None), 0)
            tracker.record("sglang", t0, t1, tokens, seqs, running, waiting, limit, dp)
        SWITCH.poll()  # the hooks are held in: the step drives the agent's tick (exporter.agent.switch)
    except Exception:
        pass
    return result


def sglang_forward_raw(result: Any, self: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER hook on ModelRunner._forward_raw: count the forward's graph mode (ModelRunnerOutput.can_run_graph)."""
    try:
        can = getattr(result, "can_run_graph", None)
        if not isinstance(can, bool) or getattr(self, "is_draft_worker", False):
            return
        first, dp = _cached(self, _sglang_place) or (True, 0)
        tracker = _tracker()
        if first and tracker is not None:
            tracker.count_mode("sglang", dp, can)
    except Exception:
        pass


# --- any Python process --------------------------------------------------------------------


def autostart() -> None:
    """Called by boundwatch_agent.pth: start the agent when BOUNDWATCH_AGENT is set, else do nothing.

    BOUNDWATCH_AGENT=1 (light) or =cupti starts it once torch is imported (before any CUDA work:
    the graph hooks see every capture, and GRAPH_TRACE stays possible), =now at interpreter
    start-up. Spawned children inherit the variable and run site again, so activation never
    depends on __main__.
    """
    value = os.environ.get("BOUNDWATCH_AGENT", "").strip().lower()
    if value in {"", "0", "off", "false", "no"}:
        return
    role = os.environ.get("BOUNDWATCH_AGENT_ROLE", "generic")
    hooks.install()
    if value == "now":
        _start(role)
        return
    when_imported("torch", lambda _torch: _start(role))


PTH_NAME = "boundwatch_agent.pth"
PTH_LINE = (
    "import os, sys; exec('try:\\n from exporter.agent.plugins import autostart\\n autostart()\\n"
    "except Exception:\\n pass') if os.environ.get('BOUNDWATCH_AGENT') else None\n"
)
