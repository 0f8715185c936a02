"""An NVML stand-in for the lab's CPU path: GPU 0's busy share is the lab engine's "GPU" time.

The lab puts this folder first on the daemon's PYTHONPATH when it runs without a GPU
(`lab.py --device cpu`). It is tests/fakes/nvml_standin.py's FakeNvml, except that GPM GRAPHICS_UTIL
and utilization.gpu come from the cumulative busy seconds the CPU engine publishes in a small
shared file (LAB_NVML_STANDIN; engine.py `Truth`), measured between two samples as GPM is.
"""

from __future__ import annotations

import os
import struct
import time
from typing import Any

from tests.fakes import nvml_standin as _base
from tests.fakes.nvml_standin import (  # noqa: F401  (the names pynvml has)
    NVMLError,
    NVMLError_GpuIsLost,
    NVMLError_LibraryNotFound,
    NVMLError_NotSupported,
)

PATH = os.environ.get("LAB_NVML_STANDIN", "")


def _busy_total() -> float:
    """Return the engine's cumulative busy seconds (0 before it publishes)."""
    try:
        with open(PATH, "rb") as fh:
            raw = fh.read(16)
        return struct.unpack("dd", raw)[1] if len(raw) == 16 else 0.0
    except OSError:
        return 0.0


class _Lab(_base.FakeNvml):
    """FakeNvml whose busy share follows the lab engine."""

    def __init__(self) -> None:
        super().__init__([_base.FakeGpu(reasons=0, sm_mhz=1980, power_mw=150_000)])
        self._util_at = (time.time(), _busy_total())
        self._util = 0

    def nvmlGpmSampleGet(self, h: int, sample: dict[str, Any]) -> None:
        super().nvmlGpmSampleGet(h, sample)
        sample["at"], sample["busy"] = time.time(), _busy_total()

    def nvmlGpmMetricsGet(self, req: Any) -> Any:
        a, b = req.sample1, req.sample2
        span = b.get("at", 0.0) - a.get("at", 0.0)
        share = min(1.0, max(0.0, (b.get("busy", 0.0) - a.get("busy", 0.0)) / span)) if span > 0 else 0.0
        gpu = self.gpus[b["gpu"]]
        gpu.gpm = {1: share * 100, 2: share * 95, 3: share * 15, 5: share * 60, 10: share * 30}
        gpu.power_mw = int(120_000 + 500_000 * share)
        return super().nvmlGpmMetricsGet(req)

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        now, busy = time.time(), _busy_total()
        t0, b0 = self._util_at
        if now - t0 >= 0.2:
            self._util = round(100 * min(1.0, max(0.0, (busy - b0) / (now - t0))))
            self._util_at = (now, busy)
        self.gpus[h].util = self._util
        return super().nvmlDeviceGetUtilizationRates(h)


_fake = _Lab()


def __getattr__(name: str) -> Any:
    return getattr(_fake, name)
