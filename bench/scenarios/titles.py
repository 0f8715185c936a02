"""Set a process title the way setproctitle does (vLLM titles its processes `VLLM::APIServer_0`, `VLLM::EngineCore`)."""

from __future__ import annotations

import ctypes
import ctypes.util

PR_SET_NAME = 15


def set_title(title: str) -> bool:
    """Overwrite this process's argv area (what /proc/<pid>/cmdline shows) and its comm; say whether argv changed."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_NAME, ctypes.c_char_p(title.encode()[:15]), 0, 0, 0)
    except OSError:
        pass
    try:
        with open("/proc/self/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        # fields[0] is field 3 (state); arg_start and arg_end are fields 48 and 49
        start, end = int(fields[45]), int(fields[46])
        raw = title.encode()
        if end - start < len(raw) + 1:
            raw = raw[: end - start - 1]
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            mem.write(raw + b"\0" * (end - start - len(raw)))
        return True
    except (OSError, ValueError, IndexError):
        return False
