"""Find the libcupti the process uses, talk to it, and decode raw activity buffers with numpy.

cupti-python loads the library (through cuda-pathfinder, which reuses a copy already in the
process, e.g. torch's) and gives names, enums and errors; the hot calls (buffer callbacks, flush,
timestamps, dropped counts) go through ctypes on the same library handle, so that no record is
ever turned into a Python object and flushes run without the GIL.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import struct
import time
from dataclasses import dataclass

import numpy as np

# CUpti_ActivityKind values (cupti_activity.h).
KIND_MEMCPY = 1
KIND_MEMSET = 2
KIND_KERNEL = 3
KIND_CONCURRENT_KERNEL = 10
KIND_GRAPH_TRACE = 51

# Record layouts CUDA 13.0's libcupti writes (cupti-python 13.0.1 dtypes: activity_kernel10_dtype,
# activity_memcpy6_dtype, activity_memset4_dtype, activity_graph_trace2_dtype). start/end/device
# offsets are the same in every layout since CUDA 11; the sizes are checked against
# cuptiActivityGetNextRecord on the first buffers (see RawDecoder.verify).
RECORD_SIZE = {KIND_CONCURRENT_KERNEL: 216, KIND_MEMCPY: 96, KIND_MEMSET: 88, KIND_GRAPH_TRACE: 56}
# kind -> (start, end, device_id, graph_id or -1, end_device_id or -1)
FIELDS = {
    KIND_CONCURRENT_KERNEL: (16, 24, 40, 156, -1),
    KIND_MEMCPY: (16, 24, 32, 72, -1),
    KIND_MEMSET: (16, 24, 32, 72, -1),
    KIND_GRAPH_TRACE: (8, 16, 24, -1, 48),
}
# agent kind codes (exporter.agent.windows): kernel, memcpy, memset, graph launch, kernel inside a graph
CODE = {KIND_CONCURRENT_KERNEL: 0, KIND_MEMCPY: 1, KIND_MEMSET: 2, KIND_GRAPH_TRACE: 3}
GRAPH_NODE_KERNEL = 4
CUPTI_SUCCESS = 0
CUPTI_ERROR_MAX_LIMIT_REACHED = 12

# CUpti_ActivityAttribute values that are uint8_t flags; the others are size_t (cupti_activity.h).
ATTRIBUTE_CTYPE: dict[str, type[ctypes.c_uint8] | type[ctypes.c_size_t]] = {
    "MEM_ALLOCATION_TYPE_HOST_PINNED": ctypes.c_uint8,
    "ZEROED_OUT_BUFFER": ctypes.c_uint8,
    "PER_THREAD_BUFFER": ctypes.c_uint8,
}
# the attributes an operator may set (BOUNDWATCH_AGENT_CUPTI_ATTRS) and agent-check reports
ATTRIBUTES = (
    "DEVICE_BUFFER_SIZE",
    "DEVICE_BUFFER_SIZE_CDP",
    "DEVICE_BUFFER_SIZE_DEVICE_GRAPHS",
    "DEVICE_BUFFER_POOL_LIMIT",
    "DEVICE_BUFFER_PRE_ALLOCATE_VALUE",
    "PROFILING_SEMAPHORE_POOL_SIZE",
    "PROFILING_SEMAPHORE_POOL_LIMIT",
    "PROFILING_SEMAPHORE_PRE_ALLOCATE_VALUE",
    "MEM_ALLOCATION_TYPE_HOST_PINNED",
    "ZEROED_OUT_BUFFER",
    "PER_THREAD_BUFFER",
)


def parse_attributes(spec: str) -> dict[str, int]:
    """Parse 'name=value,...' (CUPTI activity attribute names, with or without ATTR_; sizes may end in
    k/m/g for KiB/MiB/GiB) into {NAME: value}; raise ValueError naming what is wrong."""
    out: dict[str, int] = {}
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, raw = item.partition("=")
        key = name.strip().upper()
        key = key[5:] if key.startswith("ATTR_") else key
        if not sep or key not in ATTRIBUTES:
            raise ValueError(
                f"unknown CUPTI activity attribute {name.strip()!r} (known: {', '.join(ATTRIBUTES)})"
            )
        text = raw.strip().lower()
        scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(text[-1:], 1)
        try:
            value = int(text[:-1] if scale > 1 else text, 0) * scale
        except ValueError:
            raise ValueError(
                f"CUPTI activity attribute {key}: {raw.strip()!r} is not a whole number"
            ) from None
        if value < 0 or (ATTRIBUTE_CTYPE.get(key) is ctypes.c_uint8 and value > 1):
            raise ValueError(f"CUPTI activity attribute {key}: {value} is out of range")
        out[key] = value
    return out


BufferRequested = ctypes.CFUNCTYPE(
    None, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)
)
BufferCompleted = ctypes.CFUNCTYPE(
    None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t
)


def loaded_libcupti() -> list[str]:
    """Return the paths of every libcupti mapped into this process (more than one is trouble)."""
    paths: list[str] = []
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and "libcupti.so" in parts[5]:
                    path = parts[5].strip()
                    if path not in paths:
                        paths.append(path)
    except OSError:
        pass
    return paths


def pathfinder_libcupti() -> str | None:
    """Return the libcupti path cuda-pathfinder resolved for cupti-python (it reuses a loaded copy), or None."""
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        return str(load_nvidia_dynamic_lib("cupti").abs_path)
    except Exception:
        return None


def cupti_python_version() -> str:
    """Return the installed cupti-python version, or ''."""
    try:
        return importlib.metadata.version("cupti-python")
    except importlib.metadata.PackageNotFoundError:
        return ""


def api_version_text(v: int) -> str:
    """Return a CUPTI API version number (e.g. 130001) as 'major.minor'."""
    return f"{v // 10000}.{(v % 10000) // 100}" if v >= 10000 else str(v)


@dataclass
class Library:
    """The libcupti in this process, through ctypes."""

    path: str
    handle: ctypes.CDLL
    api_version: int

    @classmethod
    def open(cls) -> Library:
        """Return the library cupti-python loaded (call after a cupti-python call); raise OSError if none."""
        paths = loaded_libcupti()
        path = pathfinder_libcupti()
        if path is None or path not in paths:
            if not paths:
                raise OSError("no libcupti is mapped into this process")
            path = paths[0]
        handle = ctypes.CDLL(path)
        v = ctypes.c_uint32(0)
        handle.cuptiGetVersion(ctypes.byref(v))
        for name in ("cuptiActivityFlushAll", "cuptiActivityEnable", "cuptiActivityDisable", "cuptiFinalize"):
            getattr(handle, name).restype = ctypes.c_int
        handle.cuptiActivityFlushAll.argtypes = [ctypes.c_uint32]
        handle.cuptiActivityRegisterCallbacks.argtypes = [BufferRequested, BufferCompleted]
        handle.cuptiActivityRegisterCallbacks.restype = ctypes.c_int
        handle.cuptiActivityGetNextRecord.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.POINTER(ctypes.c_void_p),
        ]
        handle.cuptiActivityGetNextRecord.restype = ctypes.c_int
        handle.cuptiActivityGetNumDroppedRecords.argtypes = [
            ctypes.c_void_p,
            ctypes.c_uint32,
            ctypes.POINTER(ctypes.c_size_t),
        ]
        handle.cuptiActivityGetNumDroppedRecords.restype = ctypes.c_int
        handle.cuptiGetTimestamp.argtypes = [ctypes.POINTER(ctypes.c_uint64)]
        handle.cuptiGetTimestamp.restype = ctypes.c_int
        for name in ("cuptiActivitySetAttribute", "cuptiActivityGetAttribute"):
            fn = getattr(handle, name)
            fn.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p]
            fn.restype = ctypes.c_int
        return cls(path, handle, int(v.value))

    def attribute(self, attr: int, name: str) -> int | None:
        """Return an activity attribute's current value, or None when CUPTI refuses the query."""
        ctype = ATTRIBUTE_CTYPE.get(name, ctypes.c_size_t)
        value = ctype(0)
        size = ctypes.c_size_t(ctypes.sizeof(value))
        if (
            self.handle.cuptiActivityGetAttribute(attr, ctypes.byref(size), ctypes.byref(value))
            != CUPTI_SUCCESS
        ):
            return None
        return int(value.value)

    def set_attribute(self, attr: int, name: str, value: int) -> int:
        """Set an activity attribute; return the CUPTI status (0 on success)."""
        ctype = ATTRIBUTE_CTYPE.get(name, ctypes.c_size_t)
        v = ctype(value)
        size = ctypes.c_size_t(ctypes.sizeof(v))
        return int(self.handle.cuptiActivitySetAttribute(attr, ctypes.byref(size), ctypes.byref(v)))

    def timestamp(self) -> int:
        """Return CUPTI's current timestamp, ns (CLOCK_REALTIME)."""
        t = ctypes.c_uint64(0)
        self.handle.cuptiGetTimestamp(ctypes.byref(t))
        return int(t.value)

    def flush(self, forced: bool = False) -> int:
        """Hand back completed buffers (ctypes drops the GIL for the call); return the CUPTI status."""
        return int(self.handle.cuptiActivityFlushAll(1 if forced else 0))

    def dropped(self, ctx: int | None, stream: int) -> int:
        """Return the records CUPTI dropped for a context and stream since the last query."""
        n = ctypes.c_size_t(0)
        if self.handle.cuptiActivityGetNumDroppedRecords(ctx, stream, ctypes.byref(n)) != CUPTI_SUCCESS:
            return 0
        return int(n.value)

    def record_offsets(self, ptr: int, valid: int) -> list[int]:
        """Return the offsets of the records in a buffer, walked by CUPTI itself."""
        rec = ctypes.c_void_p(None)
        out: list[int] = []
        while True:
            status = self.handle.cuptiActivityGetNextRecord(ptr, valid, ctypes.byref(rec))
            if status != CUPTI_SUCCESS or rec.value is None:
                return out
            out.append(rec.value - ptr)


# How the agent's thread hands the GIL to the application's: a real sleep, not sleep(0). After
# sleep(0) the running thread usually takes the GIL straight back and a waiting thread gets it only
# when it forces a switch (sys.getswitchinterval(), 5 ms); bench/agent_gil.py measured both.
YIELD_S = 50e-6


def walk(buf: bytes, pause_every: int = 512) -> np.ndarray | None:
    """Return the record offsets of a raw buffer from the known record sizes, or None on an unknown kind.

    A buffer of kernel records only is walked with numpy; a mixed one in Python, sleeping briefly
    (releasing the GIL) every `pause_every` records (~0.1 ms of work) so the application's thread
    never waits long for it.
    """
    n = len(buf)
    size = RECORD_SIZE[KIND_CONCURRENT_KERNEL]
    if n % size == 0 and n:
        kinds = np.frombuffer(buf, dtype="<u4")[:: size // 4]
        if bool((kinds == KIND_CONCURRENT_KERNEL).all()):
            return np.arange(0, n, size, dtype=np.int64)
    offsets: list[int] = []
    off = 0
    unpack = struct.Struct("<I").unpack_from
    sizes = RECORD_SIZE
    count = 0
    while off < n:
        s = sizes.get(unpack(buf, off)[0])
        if s is None:
            return None
        offsets.append(off)
        off += s
        count += 1
        if count == pause_every:
            count = 0
            time.sleep(YIELD_S)
    return np.asarray(offsets, dtype=np.int64) if off == n else None


@dataclass
class Decoded:
    """The records of one buffer as arrays."""

    dev: np.ndarray  # int32 CUDA device ordinal
    start: np.ndarray  # int64 ns
    end: np.ndarray  # int64 ns
    code: np.ndarray  # int8 kind code
    incomplete: int = 0  # records without both timestamps


def decode(buf: bytes, offsets: np.ndarray | list[int]) -> Decoded:
    """Return the start, end, device and kind of every record at the given offsets."""
    if len(buf) % 8:
        buf = buf + b"\0" * (8 - len(buf) % 8)
    u32 = np.frombuffer(buf, dtype="<u4")
    u64 = np.frombuffer(buf, dtype="<u8")
    offs = np.asarray(offsets, dtype=np.int64)
    kinds = u32[offs // 4]
    parts = []
    for kind, (so, eo, do, go, edo) in FIELDS.items():
        o = offs[kinds == kind]
        if o.size == 0:
            continue
        start = u64[(o + so) // 8].astype(np.int64)
        end = u64[(o + eo) // 8].astype(np.int64)
        dev = u32[(o + do) // 4].astype(np.int64)
        if edo >= 0:
            dev = np.where(dev == 0x7FFFFFFF, u32[(o + edo) // 4], dev)
        code = np.full(o.size, CODE[kind], dtype=np.int8)
        if kind == KIND_CONCURRENT_KERNEL and go >= 0:
            code[u32[(o + go) // 4] != 0] = GRAPH_NODE_KERNEL
        parts.append((dev, start, end, code))
    if not parts:
        e64 = np.zeros(0, dtype=np.int64)
        return Decoded(e64, e64, e64, np.zeros(0, dtype=np.int8))
    dev = np.concatenate([p[0] for p in parts])
    start = np.concatenate([p[1] for p in parts])
    end = np.concatenate([p[2] for p in parts])
    code = np.concatenate([p[3] for p in parts])
    ok = (start > 0) & (end >= start)
    incomplete = int(ok.size - ok.sum())
    if incomplete:
        dev, start, end, code = dev[ok], start[ok], end[ok], code[ok]
    return Decoded(dev, start, end, code, incomplete)


class BufferPool:
    """Fixed-size activity buffers from malloc, handed to CUPTI and taken back; bounded in number.

    malloc, not Python memory: if another CUPTI client (kineto) ever receives one of ours, it may
    free() it safely.
    """

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        self._libc = ctypes.CDLL(None)
        self._libc.malloc.restype = ctypes.c_void_p
        self._libc.malloc.argtypes = [ctypes.c_size_t]
        self._free: list[int] = []
        self.outstanding: set[int] = set()
        self.allocated = 0
        self.refused = 0

    def take(self) -> int:
        """Return a buffer address, or 0 when the pool is exhausted (CUPTI then drops and counts)."""
        if self._free:
            ptr = self._free.pop()
        elif self.allocated < self.limit:
            ptr = self._libc.malloc(self.size) or 0
            if not ptr:
                self.refused += 1
                return 0
            self.allocated += 1
        else:
            self.refused += 1
            return 0
        self.outstanding.add(ptr)
        return ptr

    def give(self, ptr: int) -> bool:
        """Take back one of our buffers; return False for a buffer that is not ours."""
        if ptr not in self.outstanding:
            return False
        self.outstanding.discard(ptr)
        self._free.append(ptr)
        return True

    def forget_outstanding(self) -> None:
        """Write off buffers another client may now own (after a takeover)."""
        self.allocated -= len(self.outstanding)
        self.outstanding.clear()


def env_int(name: str, default: int) -> int:
    """Return an integer environment variable, or the default when unset or malformed."""
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default
