"""Light hooks: count torch.cuda.CUDAGraph replays and captures in this process, with no CUPTI.

`install()` patches `torch.cuda.CUDAGraph` now if torch is imported, else right after `import torch`
(exporter.agent.importhook), so captures are seen from import time. A replay costs one list-item
increment on top of torch's own call: no lock, no allocation beyond the int. Where torch's `replay`
is its 2.x shim (`super().replay()`, `base_call`), the hooks call the C++ replay themselves for a
CUDAGraph, so the frame they add takes the place of torch's: the replay hook then stays in, every
replay is counted (`replays_exact`), and only the driver's check swaps (exporter.agent.switch).
Elsewhere the replay hook is in only for a slice of each agent tick and the count is a sample the
agent scales. A sample misses work that comes in bursts in step with the agent's ticks (a request
at a time, API servers throttled in a cgroup's 100 ms periods) and would read an engine that
replays its graphs as one that decodes eager (bench/README.md, session 30). The device is learnt on
the capturing thread (torch.cuda.current_device(), CUDA is initialised there by definition); this
module never initialises CUDA itself.
"""

from __future__ import annotations
import __future__

import ctypes
import gc
import sys
import time
import types
from dataclasses import dataclass
from typing import Any

from exporter.agent.importhook import when_imported
from exporter.agent.switch import SWITCH, Carry, Direct, self_only

MARK = "__boundwatch_hooks__"

# replays, completed captures, capture_begin calls; written on the application's threads
_counts: list[int] = [0, 0, 0]
_dev: list[int] = [-1]  # CUDA ordinal learnt at capture time
_installed: dict[str, Any] = {"asked": False, "patched": False, "before_cuda": False, "at_ns": 0}
_direct_replays: set[type] = set()  # the graph classes patched here whose replay calls the C++ replay itself


def cuda_initialized() -> bool:
    """Return whether CUDA was already initialised in this process (as far as torch can tell)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:
        return True  # unknown: assume late, the safe side for GRAPH_TRACE


def gpu_uuid(ordinal: int) -> str:
    """Return 'GPU-…' for a CUDA device ordinal of this process, through libcuda; '' if unknown."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        dev = ctypes.c_int(0)
        if cuda.cuDeviceGet(ctypes.byref(dev), ordinal) != 0:
            return ""
        raw = (ctypes.c_ubyte * 16)()
        fn = getattr(cuda, "cuDeviceGetUuid_v2", None) or cuda.cuDeviceGetUuid
        if fn(raw, dev) != 0:
            return ""
        h = bytes(raw).hex()
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    except (OSError, AttributeError):
        return ""


def _learn_device() -> None:
    torch = sys.modules.get("torch")
    if torch is None or _dev[0] >= 0:
        return
    try:
        if torch.cuda.is_initialized():
            _dev[0] = int(torch.cuda.current_device())
    except Exception:
        pass


class _ShimBase:
    def replay(self) -> None:
        """The base's method (for the shims below to defer to)."""


class _Shim(_ShimBase):
    def replay(self) -> None:
        """A method that only defers to its base's: torch's `CUDAGraph.replay` (2.x) reads so."""
        super().replay()


class _ShimNoDoc(_ShimBase):
    def replay(self) -> None:
        super().replay()


# What a method compiled as `def replay(self): super().replay()` is, in this interpreter, with or
# without a docstring (which moves None's place among the constants the code loads).
_SHIMS = (_Shim.replay.__code__, _ShimNoDoc.replay.__code__)
# a module's `from __future__` imports mark its code objects' flags; they change nothing a shim does
_FUTURE_FLAGS = sum(getattr(__future__, f).compiler_flag for f in __future__.all_feature_names)
_BASE_KINDS = (types.FunctionType, types.BuiltinFunctionType, types.MethodDescriptorType)


def base_call(cls: Any, name: str) -> Direct | None:
    """Return the base's method (a `Direct`) where cls.name only defers to it (`super().name()`), else None.

    torch's `CUDAGraph.replay` is a Python shim over the C++ `_CUDAGraph.replay`: one frame, a
    `super()` and a bound method on every replay. For an instance of exactly cls, calling the
    base's method itself does the same, one frame fewer (`Switch.add`'s `direct`). Only a method
    whose code is that of the shim compiled here (argument names, names read, constants and
    bytecode), defined in cls itself (its `__class__` cell), no defaults, whose next definition
    up cls's MRO is a plain function, a builtin or a C method (pybind's instancemethod wraps a
    builtin); anything else (a torch whose replay does more, a subclass's override) gets None.
    Never raises: it runs in the engine's process, as the hooks go in.
    """
    try:
        return _base_call(cls, name)
    except Exception:
        return None


def _base_call(cls: Any, name: str) -> Direct | None:
    if not isinstance(cls, type):
        return None
    fn = vars(cls).get(name)
    if not isinstance(fn, types.FunctionType) or fn.__defaults__ or fn.__kwdefaults__:
        return None
    if not any(_same_shim(fn.__code__, c, name) for c in _SHIMS):
        return None
    cells = fn.__closure__ or ()
    if len(cells) != 1 or cells[0].cell_contents is not cls:
        return None
    for owner in cls.__mro__[1:]:
        raw = vars(owner).get(name)
        if raw is None:
            continue
        if isinstance(raw, _BASE_KINDS) or type(raw).__name__ == "instancemethod":
            base = raw.__get__(None, owner)
            return Direct(cls, base, owner, name, raw, [True]) if callable(base) else None
        return None
    return None


def _same_shim(code: Any, shim: Any, name: str) -> bool:
    """Say whether code is shim's (`def replay(self): super().replay()`) for a method called name."""
    names = tuple(name if n == "replay" else n for n in shim.co_names)
    return (
        code.co_code == shim.co_code
        and code.co_names == names
        and code.co_varnames == shim.co_varnames
        and code.co_freevars == shim.co_freevars
        and code.co_argcount == shim.co_argcount
        and code.co_posonlyargcount == shim.co_posonlyargcount
        and code.co_kwonlyargcount == shim.co_kwonlyargcount
        and code.co_flags & ~_FUTURE_FLAGS == shim.co_flags & ~_FUTURE_FLAGS
        and code.co_consts[1:] == shim.co_consts[1:]
        and (code.co_consts[:1] == shim.co_consts[:1] or _is_doc(code.co_consts[:1]))
    )


def _is_doc(first: tuple[Any, ...]) -> bool:
    """Say whether a code object's first constant (a 0- or 1-tuple) is a docstring."""
    return len(first) == 1 and isinstance(first[0], str)


def patch_graph_class(cls: Any) -> bool:
    """Wrap replay, capture_begin and capture_end of a CUDAGraph class to count them; False if not possible."""
    if cls is None or cls.__dict__.get(MARK, False):
        return False
    replay = getattr(cls, "replay", None)
    begin = getattr(cls, "capture_begin", None)
    end = getattr(cls, "capture_end", None)
    if replay is None or begin is None or end is None:
        return False
    counts = _counts
    direct = base_call(cls, "replay")

    if direct is not None:  # torch's shim: the C++ replay itself for a CUDAGraph, a frame fewer
        exact, base, ok = direct.exact, direct.base, direct.ok
        _direct_replays.add(cls)

        def replay_counted(self: Any) -> Any:
            counts[0] += 1
            if type(self) is exact and ok[0]:
                base(self)
                return None
            return replay(self)
    elif self_only(replay):

        def replay_counted(self: Any) -> Any:  # type: ignore[misc]
            counts[0] += 1
            return replay(self)
    else:

        def replay_counted(self: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
            counts[0] += 1
            return replay(self, *args, **kwargs)

    def capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
        counts[2] += 1
        _learn_device()
        return begin(self, *args, **kwargs)

    def capture_end(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = end(self, *args, **kwargs)
        counts[1] += 1
        return result

    for name, new, old in (
        ("replay", replay_counted, replay),
        ("capture_begin", capture_begin, begin),
        ("capture_end", capture_end, end),
    ):
        new.__name__, new.__qualname__, new.__doc__ = old.__name__, old.__qualname__, old.__doc__
        new.__wrapped__ = old  # type: ignore[attr-defined]
        if name == "replay":  # on every step's path: in for a slice of each tick (exporter.agent.switch)
            # a replay can drive the cycle (no step hook: a torch engine), and it queues the graph:
            # a pending tick's phases run right after it, while the GPU runs the graph
            SWITCH.add(cls, name, old, new, rank=1, launches=True, direct=direct, counter=counts)
        else:  # captures: off the steps' path, always counted (graphs_so_far)
            setattr(cls, name, new)
    setattr(cls, MARK, True)
    return True


def _patch_torch(torch: Any) -> None:
    cls = getattr(getattr(torch, "cuda", None), "CUDAGraph", None)
    if patch_graph_class(cls) or (cls is not None and cls.__dict__.get(MARK, False)):
        if not _installed["patched"]:
            _installed.update(patched=True, before_cuda=not cuda_initialized(), at_ns=time.time_ns())


def install() -> None:
    """Patch torch.cuda.CUDAGraph now, or right after torch is imported; safe to call again."""
    if _installed["asked"]:
        if not _installed["patched"] and "torch" in sys.modules:
            _patch_torch(sys.modules["torch"])
        return
    _installed["asked"] = True
    when_imported("torch", _patch_torch)


def installed() -> bool:
    """Return whether CUDAGraph is patched in this process."""
    return bool(_installed["patched"])


def replay_direct(cls: Any = None) -> bool:
    """Say whether cls's replay (None: any graph class's), as patched here, calls the base's C++ replay itself.

    That is `base_call`'s finding (torch's shim skipped), made on the class as it was before the
    patch: once patched, its replay is the hook, which `base_call` no longer reads as a shim.
    """
    return bool(_direct_replays) if cls is None else cls in _direct_replays


def replays_exact() -> bool:
    """Say whether every replay is counted (the hooks patched a shim, in and out), not a sample of them."""
    return SWITCH.exact(_counts)


def graphs_so_far() -> str:
    """Return 'none' when the hooks saw every capture and there was none, 'some' after one, else 'unknown'."""
    if _counts[2] or _counts[1]:
        return "some"
    if _installed["patched"] and _installed["before_cuda"]:
        return "none"
    return "unknown"


# Modules that capture CUDA graphs outside torch.cuda.CUDAGraph: a heap scan cannot see their graphs.
OTHER_GRAPH_MAKERS = ("cupy", "jax", "tensorrt", "tensorrt_llm", "numba")


def live_graphs() -> int | None:
    """Return how many torch.cuda.CUDAGraph objects are alive in this process (a heap scan), None when unknowable.

    For a start after CUDA initialised when the hooks came too late to see every capture: a graph
    that no object holds any more cannot be replayed. Unknowable where another library that makes
    CUDA graphs of its own is loaded. One pass over the collector's objects (milliseconds to tens of
    milliseconds in a large process): for the deep mode's start only, never on a hot path.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return 0
    cls = getattr(getattr(torch, "cuda", None), "CUDAGraph", None)
    if cls is None or any(m in sys.modules for m in OTHER_GRAPH_MAKERS):
        return None
    base = getattr(getattr(torch, "_C", None), "_CUDAGraph", None) or cls
    try:
        return sum(1 for o in gc.get_objects() if isinstance(o, base))
    except Exception:
        return None


def device() -> int:
    """Return this process's CUDA ordinal: learnt at capture, else 0 on a one-device process; -1 if unknown."""
    if _dev[0] >= 0:
        return _dev[0]
    torch = sys.modules.get("torch")
    if torch is None:
        return -1
    try:
        # never initialise CUDA: only once torch has, and only where the answer is unambiguous
        if torch.cuda.is_initialized() and torch.cuda.device_count() == 1:
            return 0
    except Exception:
        pass
    return -1


@dataclass
class GraphWindow:
    """Replays and captures between two reads, on the wall clock."""

    t0: int
    t1: int
    replays: int
    captures: int  # cumulative, completed


class GraphReader:
    """Turn the cumulative counters into per-window deltas (one reader per agent; agent thread only)."""

    def __init__(self, now_ns: int | None = None) -> None:
        self._last_replays = _counts[0]
        self._last_ns = now_ns if now_ns is not None else time.time_ns()
        self._uuid: dict[int, str] = {}
        self._uuid_tries = 0
        self._carry = Carry()
        self._replays = 0  # scaled replays counted since the last take

    def count(self, scale: float = 1.0) -> None:
        """Add the replays counted since the last call, times scale (1 where every replay is counted), to the window."""
        replays = _counts[0]
        if scale != 1.0 and replays_exact():
            scale = 1.0
        self._replays += self._carry(("replays",), max(0, replays - self._last_replays), scale)
        self._last_replays = replays

    def take(self, now_ns: int | None = None, scale: float = 1.0) -> GraphWindow | None:
        """Return the window since the last take, or None while the hooks are not installed.

        scale: what the replays counted since stand for (exporter.agent.switch: the tick's span
        over the time the replay hook was in).
        """
        now = now_ns if now_ns is not None else time.time_ns()
        if not _installed["patched"]:
            self._last_ns = now
            self._last_replays, self._replays = _counts[0], 0
            return None
        self.count(scale)
        win = GraphWindow(self._last_ns, now, self._replays, _counts[1])
        self._last_ns, self._replays = now, 0
        return win

    def uuid(self, ordinal: int) -> str:
        """Return the GPU UUID of an ordinal (looked up once, through libcuda)."""
        if ordinal < 0:
            return ""
        if ordinal not in self._uuid:
            if not cuda_initialized() or self._uuid_tries >= 3:  # libcuda refused three times: stop asking
                return ""
            self._uuid_tries += 1
            found = gpu_uuid(ordinal)
            if not found:
                return ""
            self._uuid[ordinal] = found
        return self._uuid[ordinal]


def counts() -> tuple[int, int, int]:
    """Return (replays, captures completed, captures begun) so far in this process."""
    return _counts[0], _counts[1], _counts[2]
