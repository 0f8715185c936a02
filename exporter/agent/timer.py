"""A timer the agent's thread sleeps on with no timeout, which any thread pushes forward without waking it.

Linux's timerfd through ctypes (os.timerfd_* arrive in Python 3.13): the engine's thread, where it
drives the hook cycle (exporter.agent.switch), sets the expiry past the next swap (one syscall, no
GIL hand-over); the agent's thread, blocked in select() on the timer and a stop pipe, wakes only
when that expiry passes: the engine has stopped stepping. Where timerfd is missing, `WakeTimer.make()`
returns None and the agent's thread keeps its timed waits.
"""

from __future__ import annotations

import ctypes
import os
import select

CLOCK_MONOTONIC = 1  # time.monotonic_ns's clock on Linux
TFD_NONBLOCK = 0o4000
TFD_CLOEXEC = 0o2000000
TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class WakeTimer:
    """One timerfd (absolute CLOCK_MONOTONIC expiries) and a pipe that wakes the sleeper to stop."""

    def __init__(self, libc: ctypes.CDLL) -> None:
        self._settime = libc.timerfd_settime
        self._settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        fd = libc.timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        self.fd = int(fd)
        self._r, self._w = os.pipe()
        os.set_blocking(self._w, False)
        self.fired = 0  # wake-ups by the timer (for tests and benchmarks)

    @classmethod
    def make(cls) -> WakeTimer | None:
        """Return a timer, None where this platform has no timerfd."""
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if not hasattr(libc, "timerfd_create"):
                return None
            return cls(libc)
        except (OSError, AttributeError):
            return None

    def at(self, due_ns: int) -> None:
        """Expire at due_ns (time.monotonic_ns), never where due_ns <= 0; a new call replaces the last. Any thread."""
        spec = _Itimerspec()  # all zero: disarmed
        if due_ns > 0:
            spec.it_value.tv_sec, spec.it_value.tv_nsec = divmod(int(due_ns), 1_000_000_000)
        self._settime(self.fd, TFD_TIMER_ABSTIME, ctypes.byref(spec), None)

    def wait(self) -> bool:
        """Sleep until the expiry (True) or until `wake()` (False); no timeout, the GIL let go."""
        try:
            ready, _, _ = select.select([self.fd, self._r], [], [])
        except (OSError, ValueError):
            return False
        if self._r in ready:
            return False
        try:
            os.read(self.fd, 8)
        except (BlockingIOError, OSError):
            pass
        self.fired += 1
        return True

    def wake(self) -> None:
        """Wake the sleeper for good (the agent stops)."""
        try:
            os.write(self._w, b"x")
        except OSError:
            pass

    def close(self) -> None:
        for fd in (self.fd, self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass
