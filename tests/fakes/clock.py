"""A clock for the tests to inject where the code reads time: it stands still until a test moves it."""

from __future__ import annotations

WALL_NS = 1_764_400_000 * 1_000_000_000  # the wall clock at the start unless a test gives one (Nov 2025)


class Clock:
    """A monotonic clock that reads `t` until a test moves it (`clock.t += 0.5`): `clock()` returns `t`.

    `t` is seconds for the code that reads `time.monotonic`; a test of code that reads `time.monotonic_ns`
    gives an int in ns (`Clock(1_000 * MS)`) and moves it by ints. `wall()` (seconds) and `wall_ns()` are
    a wall clock that moves with it, `wall_ns` ns at the starting `t`, for code that takes both clocks.
    """

    def __init__(self, t: float = 1000.0, wall_ns: int = WALL_NS) -> None:
        self.t = t
        self._t0, self._wall0_ns = t, wall_ns

    def __call__(self) -> float:
        return self.t

    def wall_ns(self) -> int:
        return self._wall0_ns + round((self.t - self._t0) * 1e9)

    def wall(self) -> float:
        return self._wall0_ns / 1e9 + (self.t - self._t0)
