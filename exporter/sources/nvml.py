"""NVML: power, clocks, clock-event reasons, utilization, memory and GPM per GPU.

Every call runs in the reader's own thread with a timeout (`BlockingReader`). Identity and
maximum clocks are read once; the enforced power limit every `STATIC_EVERY_SECONDS` and at
once when the clock-event reasons change (NVML has no event for a new limit). Energy is read
every `energy_every_seconds` only: one read cost 2.4 ms (p99 24 ms) on the H200, against 1-2 us
for power, clocks and utilization. GPM needs two samples more than 100 ms apart, so each tick's
GPM ratios cover the time since the last tick; its request structure is built once per GPU.
With `gpm_every_ticks` N > 1, GPM is read every Nth tick (its ratios then cover the N ticks since
the last read) and the ticks in between carry the last ratios, so the busy share the verdict reads
(GPM GRAPHICS_UTIL) is never missing, only up to N - 1 ticks old: `nvmlGpmMetricsGet` costs 2-2.5 ms
of CPU per GPU on the H200 on each tick's new pair of samples (1.2 ms on a pair read again), nearly all
of it GRAPHICS_UTIL and most of a tick's NVML time. So GRAPHICS_UTIL is asked for only where the
cheap metrics show an SM active in the window (else it reads 0: an idle GPU costs ~0.1 ms a tick),
and `gpm_graphics` off leaves it out altogether. With `graphics_estimate` on (the default), a busy GPU
reads it only where the verdict could turn on it
(`GraphicsGate`): between reads it is estimated from the cheap SM_UTIL, and the reading says so
(`GpmRatios.graphics_estimated`).
The `nvml` module is injectable: tests give it a stand-in for the driver.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, TypeVar

from exporter.config import NvmlConfig
from exporter.snapshot import Snapshot
from exporter.snapshot.gpu import GpmRatios, GpuReading
from exporter.sources.base import BlockingReader, SourceDown, SourceUnavailable

T = TypeVar("T")

GPM_METRICS: tuple[tuple[str, str], ...] = (
    ("graphics", "NVML_GPM_METRIC_GRAPHICS_UTIL"),
    ("sm", "NVML_GPM_METRIC_SM_UTIL"),
    ("sm_occupancy", "NVML_GPM_METRIC_SM_OCCUPANCY"),
    ("tensor", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),
    ("dram", "NVML_GPM_METRIC_DRAM_BW_UTIL"),
)
# the metrics of each GPM request a device builds (GRAPHICS_UTIL costs ~2 ms, the others ~1 us each)
GPM_REQUESTS: dict[str, tuple[str, ...]] = {
    "all": tuple(name for name, _ in GPM_METRICS),
    "lean": tuple(name for name, _ in GPM_METRICS if name != "graphics"),
    "graphics": ("graphics",),
}
INIT_RETRY_SECONDS = 30.0
STATIC_EVERY_SECONDS = (
    10.0  # the enforced power limit is read again this often (and on a new clock-event mask)
)
_NOT_SUPPORTED = 3  # NVML_ERROR_NOT_SUPPORTED


@dataclass
class GraphicsGate:
    """When a busy GPU's GPM GRAPHICS_UTIL is read, and what stands in for it between reads.

    GRAPHICS_UTIL is the verdict's busy share and costs ~2 ms of CPU per busy GPU per tick on the
    H200; SM_UTIL comes from the same pair of samples for ~1 us and follows the same activity at a
    ratio that moves slowly. So it is read when its last read is `every` reads old, when SM_UTIL
    moved more than `sm_moved` since then, or when the estimate (SM_UTIL times the graphics / SM
    ratio of the last read, at most 1) moved more than `sm_moved` from the figure read (a large
    ratio, as near idle, magnifies a small move of SM_UTIL) or lies within `margin` of a busy share
    the verdict could be held against (`Verdict.edges`; none known: read). Elsewhere the estimate stands in: a verdict
    could turn on it only were it more than `margin` off (its error over the H200 recordings: median
    0.004, p90 0.03, largest 0.16-0.19). Replayed over the H200 lab's 42 recordings (`bench/scenarios/
    graphics_reads.py`): read on 35-46% of their GPU ticks (a GPU-bound one about 1 in 8), no score
    or switch changed; reading every other tick without the margin (session 17) kept a verdict
    wrong for 6 s in eager decode, whose busy share sits inside the band.
    """

    every: int = 8
    sm_moved: float = 0.05
    margin: float = 0.10
    read_at: int | None = None  # the count of GPM reads at the last GRAPHICS_UTIL read
    sm: float = 0.0  # SM_UTIL then
    ratio: float = 1.0  # GRAPHICS_UTIL / SM_UTIL then
    graphics: float = 0.0  # GRAPHICS_UTIL then

    def estimate(self, at: int, sm: float, edges: tuple[float, ...] | None) -> float | None:
        """Return GRAPHICS_UTIL estimated for the `at`-th read, or None where it must be read."""
        if self.read_at is None or at - self.read_at >= self.every or abs(sm - self.sm) > self.sm_moved:
            return None
        if edges is None:
            return None
        est = min(1.0, sm * self.ratio)
        if abs(est - self.graphics) > self.sm_moved:
            return None
        margin = self.margin
        for edge in edges:
            if -margin <= est - edge <= margin:
                return None
        return est

    def read(self, at: int, sm: float, graphics: float) -> None:
        """Note GRAPHICS_UTIL as read at the `at`-th read, beside SM_UTIL (an idle read: nothing to carry)."""
        if sm <= 0:
            self.read_at = None
            return
        self.read_at, self.sm, self.ratio, self.graphics = at, sm, graphics / sm, graphics


def _load_pynvml() -> ModuleType:
    import pynvml

    return pynvml


@dataclass
class _Device:
    index: int
    handle: Any
    uuid: str
    name: str
    pci_bus_id: str
    sm_clock_max_hz: float | None
    gpm_sample: Any = None  # the previous GPM sample, when the GPU supports GPM
    gpm_spare: Any = None
    # the nvmlGpmMetricsGet requests by GPM_REQUESTS' key, metric ids set once, each with its metrics' names
    gpm_requests: dict[str, tuple[Any, tuple[str, ...]]] = field(default_factory=dict)
    gpm_idle: bool = False  # no SM active in the last GPM window: GRAPHICS_UTIL waits for one
    gpm_last: GpmRatios | None = None  # the last GPM read's ratios, carried while no read is due
    gpm_due_in: int = 0  # ticks before the next GPM read (0: this tick)
    gpm_reads: int = 0  # GPM reads so far (the gate's clock)
    gate: GraphicsGate = field(default_factory=GraphicsGate)
    energy_joules: float | None = None
    energy_read_at: float = 0.0
    limit_mw: float | None = None
    limit_read_at: float | None = None
    reasons: int | None = None
    errors: set[str] = field(default_factory=set)


class NvmlSource:
    """Read every GPU through NVML each tick."""

    name = "nvml"
    reads_in_thread = True  # its calls run in its reader's thread: the Sampler may start a tick's read ahead

    def __init__(
        self,
        cfg: NvmlConfig,
        nvml: ModuleType | None = None,
        clock: Callable[[], float] = time.monotonic,
        also_edges: tuple[float, ...] = (),
    ) -> None:
        """also_edges: busy shares something besides the verdict reads each tick (the scheduled
        self-test's idle bar, `probe.idle_busy_max`): GRAPHICS_UTIL is read, not estimated, near them too."""
        self._cfg = cfg
        self._nvml = nvml
        self._clock = clock
        self._reader = BlockingReader(self.name, cfg.timeout_seconds)
        self._devices: list[_Device] | None = None
        self._driver = ""
        self._init_failed_at: float | None = None
        self._init_error = ""
        self._init_exc: type[SourceUnavailable] = SourceDown
        # each GPU's busy shares its verdict could turn on, from the newest Snapshot (`follow`)
        self._edges: dict[int, tuple[float, ...]] = {}
        self._also = tuple(sorted(set(also_edges)))

    async def read(self) -> tuple[GpuReading, ...]:
        """Return this tick's reading of every GPU."""
        return await self._reader.run(self.read_blocking)

    def start_read(self) -> asyncio.Future[tuple[GpuReading, ...]]:
        """Start this tick's read in the reader's thread and return its future (the Sampler's way)."""
        return self._reader.submit(self.read_blocking)

    def read_blocking(self) -> tuple[GpuReading, ...]:
        """Read every GPU now, in the calling thread."""
        devices = self._ensure_init()
        return tuple(self._read_device(dev) for dev in devices)

    def follow(self, snap: Snapshot) -> None:
        """Note each GPU's busy shares its verdict could be held against next tick (`Verdict.edges`), and also_edges."""
        also = self._also
        self._edges = {
            v.gpu: tuple(sorted({*also, *v.edges})) if also else v.edges for v in snap.verdicts if v.edges
        }

    def close(self) -> None:
        """Free GPM samples, shut NVML down and stop the reader thread."""
        nvml = self._nvml
        if self._devices is not None and nvml is not None:
            for dev in self._devices:
                for sample in (dev.gpm_sample, dev.gpm_spare):
                    if sample is not None:
                        _call(nvml.nvmlGpmSampleFree, sample)
            self._quiet(nvml.nvmlShutdown)
            self._devices = None
        self._reader.close()

    # --- set-up --------------------------------------------------------------------------
    def _ensure_init(self) -> list[_Device]:
        if self._devices is not None:
            return self._devices
        now = self._clock()
        if self._init_failed_at is not None and now - self._init_failed_at < INIT_RETRY_SECONDS:
            raise self._init_exc(self._init_error)  # each tick NVML stays down is a failed read
        try:
            nvml = self._nvml or _load_pynvml()
            self._nvml = nvml
            nvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ImportError...
            self._init_failed_at = now
            self._init_error = f"NVML unavailable: {_describe(exc)}"
            # No driver or library on this host is a state (a GPU-less box), not a failure to count;
            # any other refusal (no permission, an unknown error) is counted every tick it lasts.
            self._init_exc = SourceUnavailable if _absent(exc) else SourceDown
            raise self._init_exc(self._init_error) from exc
        self._init_failed_at = None
        self._driver = _text(self._quiet(nvml.nvmlSystemGetDriverVersion)) or ""
        count = nvml.nvmlDeviceGetCount()
        devices = []
        for index in range(count):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            max_mhz = _call(nvml.nvmlDeviceGetMaxClockInfo, handle, nvml.NVML_CLOCK_SM)
            pci = _call(nvml.nvmlDeviceGetPciInfo, handle)
            dev = _Device(
                index=index,
                handle=handle,
                uuid=_text(_call(nvml.nvmlDeviceGetUUID, handle)) or f"GPU-{index}",
                name=_text(_call(nvml.nvmlDeviceGetName, handle)) or "unknown",
                pci_bus_id=_text(getattr(pci, "busId", "")) or "",
                sm_clock_max_hz=float(max_mhz) * 1e6 if max_mhz else None,
            )
            if self._cfg.gpm and self._gpm_supported(handle):
                dev.gpm_sample = _call(self._gpm_take, handle, None)
            devices.append(dev)
        self._devices = devices
        return devices

    def _gpm_supported(self, handle: Any) -> bool:
        nvml = self._nvml
        assert nvml is not None
        if not hasattr(nvml, "nvmlGpmQueryDeviceSupport"):
            return False
        support = self._quiet(lambda: nvml.nvmlGpmQueryDeviceSupport(handle))
        return bool(getattr(support, "isSupportedDevice", 0))

    def _gpm_take(self, handle: Any, sample: Any) -> Any:
        nvml = self._nvml
        assert nvml is not None
        if sample is None:
            sample = nvml.nvmlGpmSampleAlloc()
        nvml.nvmlGpmSampleGet(handle, sample)
        return sample

    # --- per tick ------------------------------------------------------------------------
    def _read_device(self, dev: _Device) -> GpuReading:
        nvml = self._nvml
        assert nvml is not None
        errors: list[str] = []
        h = dev.handle

        def get(label: str, fn: Callable[[], T]) -> T | None:
            try:
                return fn()
            except Exception as exc:
                if not _not_supported(exc):
                    errors.append(f"{label}: {_describe(exc)}")
                return None

        power_mw = get("power", lambda: nvml.nvmlDeviceGetPowerUsage(h))
        sm_mhz = get("sm_clock", lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))
        reasons = get("clock_events", lambda: _clock_event_reasons(nvml, h))
        util = get("utilization", lambda: nvml.nvmlDeviceGetUtilizationRates(h))
        mem = get("memory", lambda: nvml.nvmlDeviceGetMemoryInfo(h))
        now = self._clock()
        if (
            dev.limit_read_at is None
            or now - dev.limit_read_at >= STATIC_EVERY_SECONDS
            or reasons != dev.reasons
        ):
            dev.limit_mw = get("power_limit", lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(h))
            dev.limit_read_at = now
        dev.reasons = reasons
        limit_mw = dev.limit_mw
        if dev.energy_joules is None or now - dev.energy_read_at >= self._cfg.energy_every_seconds:
            energy_mj = get("energy", lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(h))
            if energy_mj is not None:
                dev.energy_joules = float(energy_mj) / 1e3
                dev.energy_read_at = now
        gpm = self._gpm(dev, get) if dev.gpm_sample is not None else None
        procs = get("processes", lambda: nvml.nvmlDeviceGetComputeRunningProcesses(h))
        return GpuReading(
            index=dev.index,
            uuid=dev.uuid,
            name=dev.name,
            driver=self._driver,
            pci_bus_id=dev.pci_bus_id,
            power_watts=float(power_mw) / 1e3 if power_mw is not None else None,
            power_limit_watts=float(limit_mw) / 1e3 if limit_mw is not None else None,
            energy_joules=dev.energy_joules,
            sm_clock_hz=float(sm_mhz) * 1e6 if sm_mhz is not None else None,
            sm_clock_max_hz=dev.sm_clock_max_hz,
            clock_event_mask=int(reasons) if reasons is not None else None,
            utilization=float(util.gpu) / 100.0 if util is not None else None,
            memory_used_bytes=int(mem.used) if mem is not None else None,
            memory_total_bytes=int(mem.total) if mem is not None else None,
            gpm=gpm,
            pids=tuple(sorted({int(p.pid) for p in procs or ()})),
            errors=tuple(errors),
        )

    def _gpm(
        self, dev: _Device, get: Callable[[str, Callable[[], GpmRatios | None]], Any]
    ) -> GpmRatios | None:
        """Return this tick's GPM ratios: read when due (every `gpm_every_ticks`), else the last ones."""
        if dev.gpm_due_in > 0:
            dev.gpm_due_in -= 1
            return dev.gpm_last
        dev.gpm_due_in = self._cfg.gpm_every_ticks - 1
        dev.gpm_last = get("gpm", lambda: self._gpm_ratios(dev))
        return dev.gpm_last

    def _gpm_ratios(self, dev: _Device) -> GpmRatios | None:
        """Return the GPM ratios over the time since the last read (a new sample, paired with the last).

        GRAPHICS_UTIL is the whole cost of `nvmlGpmMetricsGet` (2-2.5 ms of CPU per GPU on the H200
        against ~1 us for each other metric), so it is asked for only where the cheap metrics show an
        SM active in the window: where none was, no kernel ran and it reads 0 (on 1,372 such ticks of
        the H200 lab, out of 6,371, GRAPHICS_UTIL read at most 0.00007). Where one was, the gate
        (`GraphicsGate`, with `graphics_estimate`) says whether the verdict could turn on it; where
        not, it is estimated from SM_UTIL. Without the gate, a GPU active in the last window gets
        every metric in one call; an idle one the cheap ones, then GRAPHICS_UTIL only if an SM ran
        after all: an idle GPU costs ~0.1 ms, a busy one what it did.
        """
        current = self._gpm_take(dev.handle, dev.gpm_spare)
        previous = dev.gpm_sample
        dev.gpm_sample, dev.gpm_spare = current, previous
        dev.gpm_reads += 1
        if not self._cfg.gpm_graphics:
            return _ratios(self._gpm_get(dev, "lean", previous, current))
        if not dev.gpm_idle and not self._cfg.graphics_estimate:  # an SM ran in the last window: one call
            values = self._gpm_get(dev, "all", previous, current)
        else:
            values = self._gpm_get(dev, "lean", previous, current)
            if not _idle(values):
                estimated = self._graphics_estimate(dev, values.get("sm"))
                if estimated is not None:
                    dev.gpm_idle = False
                    values["graphics"] = estimated
                    return _ratios(values, estimated=True)
                values.update(self._gpm_get(dev, "graphics", previous, current))
        dev.gpm_idle = _idle(values)
        if dev.gpm_idle:
            values["graphics"] = 0.0
        self._graphics_read(dev, values)
        return _ratios(values)

    def _graphics_estimate(self, dev: _Device, sm: float | None) -> float | None:
        """Return this read's GRAPHICS_UTIL estimated by the gate, or None to read it."""
        if not self._cfg.graphics_estimate or sm is None:
            return None
        return dev.gate.estimate(dev.gpm_reads, sm, self._edges.get(dev.index))

    @staticmethod
    def _graphics_read(dev: _Device, values: dict[str, float | None]) -> None:
        sm, graphics = values.get("sm"), values.get("graphics")
        if sm is not None and graphics is not None:
            dev.gate.read(dev.gpm_reads, sm, graphics)
        else:
            dev.gate.read_at = None  # no ratio to carry: the next read reads it

    def _gpm_get(self, dev: _Device, which: str, previous: Any, current: Any) -> dict[str, float | None]:
        """Run one of the device's GPM requests (`GPM_REQUESTS`) on a pair of samples; a metric not written is None."""
        nvml = self._nvml
        assert nvml is not None
        built = dev.gpm_requests.get(which)
        if built is None:
            wanted = GPM_REQUESTS[which]
            ids = [
                (name, getattr(nvml, const))
                for name, const in GPM_METRICS
                if name in wanted and hasattr(nvml, const)
            ]
            req = nvml.c_nvmlGpmMetricsGet_t()
            req.version = nvml.NVML_GPM_METRICS_GET_VERSION
            req.numMetrics = len(ids)
            for i, (_, metric_id) in enumerate(ids):
                req.metrics[i].metricId = metric_id
            built = dev.gpm_requests[which] = (req, tuple(name for name, _ in ids))
        req, names = built
        if not names:
            return {}
        metrics = req.metrics
        for i in range(len(names)):  # a metric the driver leaves unwritten reads as not supported
            metrics[i].nvmlReturn = _NOT_SUPPORTED
        req.sample1 = previous
        req.sample2 = current
        nvml.nvmlGpmMetricsGet(req)
        return {
            name: _ratio(metrics[i].value) if metrics[i].nvmlReturn == 0 else None
            for i, name in enumerate(names)
        }

    @staticmethod
    def _quiet(fn: Callable[[], T]) -> T | None:
        try:
            return fn()
        except Exception:
            return None


def _call(fn: Callable[..., T], *args: Any) -> T | None:
    """Call an NVML function, returning None when it fails (an optional field)."""
    try:
        return fn(*args)
    except Exception:
        return None


def _ratios(values: dict[str, float | None], estimated: bool = False) -> GpmRatios:
    """Return GPM's ratios from one read's metrics by name (`GPM_METRICS`), the graphics one estimated or not."""
    get = values.get
    return GpmRatios(get("graphics"), get("sm"), get("sm_occupancy"), get("tensor"), get("dram"), estimated)


def _idle(values: dict[str, float | None]) -> bool:
    """Say whether GPM's SM_UTIL shows no SM active in the window (unknown: not idle)."""
    sm = values.get("sm")
    return sm is not None and sm <= 0.0


def _clock_event_reasons(nvml: ModuleType, handle: Any) -> int:
    fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if fn is None:  # older nvidia-ml-py: the deprecated name
        fn = nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    return int(fn(handle))


def _ratio(percent: float) -> float:
    return min(max(float(percent) / 100.0, 0.0), 1.0)


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def _absent(exc: BaseException) -> bool:
    """Say whether NVML failed because this host has no NVIDIA driver or library at all."""
    name = type(exc).__name__
    return isinstance(exc, ImportError) or any(k in name for k in ("LibraryNotFound", "DriverNotLoaded"))


def _not_supported(exc: Exception) -> bool:
    return "NotSupported" in type(exc).__name__ or "Not Supported" in str(exc)


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
