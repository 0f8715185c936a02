"""A stand-in for the NVML driver library (the outside party), with the pynvml call surface we use.

Values are those read on the H200 under a bf16 matmul (research/device-probe.md §A).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

NVML_CLOCK_SM = 1
NVML_GPM_METRICS_GET_VERSION = 1
NVML_GPM_METRIC_GRAPHICS_UTIL = 1
NVML_GPM_METRIC_SM_UTIL = 2
NVML_GPM_METRIC_SM_OCCUPANCY = 3
NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
NVML_GPM_METRIC_DRAM_BW_UTIL = 10


class NVMLError(Exception):
    """Base of the stand-in's errors."""


class NVMLError_NotSupported(NVMLError):
    """A field the GPU does not have."""


class NVMLError_LibraryNotFound(NVMLError):
    """No driver on this machine."""


class NVMLError_GpuIsLost(NVMLError):
    """The GPU fell off the bus."""


class _Metric(ctypes.Structure):
    _fields_ = [("metricId", ctypes.c_uint), ("nvmlReturn", ctypes.c_uint), ("value", ctypes.c_double)]


class c_nvmlGpmMetricsGet_t(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("numMetrics", ctypes.c_uint),
        ("sample1", ctypes.py_object),
        ("sample2", ctypes.py_object),
        ("metrics", _Metric * 16),
    ]


@dataclass
class FakeGpu:
    uuid: str = "GPU-8f3c0d5e-0000-0000-0000-000000000001"
    name: str = "NVIDIA H200"
    power_mw: int = 695_000
    limit_mw: int = 700_000
    sm_mhz: int = 1440
    max_sm_mhz: int = 1980
    reasons: int = 0x4  # SW power cap
    util: int = 100
    mem_used: int = 80 * 2**30
    mem_total: int = 143_771 * 2**20
    energy_mj: int = 123_456_789
    gpm: dict[int, float] = field(default_factory=lambda: {1: 98.7, 2: 95.2, 3: 14.1, 5: 92.4, 10: 17.1})
    pids: tuple[int, ...] = ()
    no_power: bool = False
    lost: bool = False


class FakeNvml:
    """Module-like object with the pynvml functions NvmlSource calls."""

    NVML_CLOCK_SM = NVML_CLOCK_SM
    NVML_GPM_METRICS_GET_VERSION = NVML_GPM_METRICS_GET_VERSION
    NVML_GPM_METRIC_GRAPHICS_UTIL = NVML_GPM_METRIC_GRAPHICS_UTIL
    NVML_GPM_METRIC_SM_UTIL = NVML_GPM_METRIC_SM_UTIL
    NVML_GPM_METRIC_SM_OCCUPANCY = NVML_GPM_METRIC_SM_OCCUPANCY
    NVML_GPM_METRIC_ANY_TENSOR_UTIL = NVML_GPM_METRIC_ANY_TENSOR_UTIL
    NVML_GPM_METRIC_DRAM_BW_UTIL = NVML_GPM_METRIC_DRAM_BW_UTIL
    c_nvmlGpmMetricsGet_t = c_nvmlGpmMetricsGet_t

    def __init__(
        self, gpus: list[FakeGpu] | None = None, driver_present: bool = True, gpm: bool = True
    ) -> None:
        self.gpus = gpus if gpus is not None else [FakeGpu()]
        self.driver_present = driver_present
        self.gpm_supported = gpm
        self.calls: dict[str, int] = {}
        self.samples_alive = 0
        self.shutdown = False

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def _gpu(self, handle: int) -> FakeGpu:
        gpu = self.gpus[handle]
        if gpu.lost:
            raise NVMLError_GpuIsLost("GPU is lost")
        return gpu

    def nvmlInit(self) -> None:
        self._count("init")
        if not self.driver_present:
            raise NVMLError_LibraryNotFound("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        self.shutdown = True

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.159.04"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self.gpus[h].uuid

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return self.gpus[h].name.encode()

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return SimpleNamespace(busId=f"00000000:{0x18 + h:02X}:00.0")

    def nvmlDeviceGetMaxClockInfo(self, h: int, kind: int) -> int:
        return self.gpus[h].max_sm_mhz

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        gpu = self._gpu(h)
        if gpu.no_power:
            raise NVMLError_NotSupported("Not Supported")
        return gpu.power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        self._count("power_limit")
        return self._gpu(h).limit_mw

    def nvmlDeviceGetClockInfo(self, h: int, kind: int) -> int:
        return self._gpu(h).sm_mhz

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return self._gpu(h).reasons

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=self._gpu(h).util, memory=0)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        g = self._gpu(h)
        return SimpleNamespace(used=g.mem_used, total=g.mem_total, free=g.mem_total - g.mem_used)

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=2**30) for pid in self._gpu(h).pids]

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        self._count("energy")
        return self._gpu(h).energy_mj

    def nvmlGpmQueryDeviceSupport(self, h: int) -> Any:
        return SimpleNamespace(isSupportedDevice=int(self.gpm_supported))

    def nvmlGpmSampleAlloc(self) -> dict[str, Any]:
        self.samples_alive += 1
        return {"taken": 0}

    def nvmlGpmSampleFree(self, sample: dict[str, Any]) -> None:
        self.samples_alive -= 1

    def nvmlGpmSampleGet(self, h: int, sample: dict[str, Any]) -> None:
        sample["taken"] += 1
        sample["gpu"] = h

    def nvmlGpmMetricsGet(self, req: c_nvmlGpmMetricsGet_t) -> c_nvmlGpmMetricsGet_t:
        gpu = self.gpus[req.sample2["gpu"]]
        for i in range(req.numMetrics):
            m = req.metrics[i]
            if m.metricId in gpu.gpm:
                m.value, m.nvmlReturn = gpu.gpm[m.metricId], 0
            else:
                m.nvmlReturn = 3  # NOT_SUPPORTED
        return req
