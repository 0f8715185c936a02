"""What NVML says about each GPU at one tick."""

from __future__ import annotations

from dataclasses import dataclass, field

# Clock-event (throttle) reasons, by NVML bit. The label set is fixed, so cardinality stays bounded.
CLOCK_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)


@dataclass(frozen=True, slots=True)  # one per GPU per tick in history: no __dict__ each
class GpmRatios:
    """GPM metrics between two samples, each 0-1; None where the GPU did not report one."""

    graphics: float | None = None
    sm: float | None = None
    sm_occupancy: float | None = None
    tensor: float | None = None
    dram: float | None = None
    # graphics estimated from SM_UTIL (SM times the graphics / SM ratio of the last read), not read:
    # the NVML source reads it only where the verdict could turn on it (`sources.nvml.GraphicsGate`)
    graphics_estimated: bool = False


@dataclass(frozen=True, slots=True)  # one per GPU per tick in history: no __dict__ each
class GpuReading:
    """One GPU as NVML reported it at one tick; a field is None when NVML could not read it."""

    index: int
    uuid: str
    name: str
    driver: str
    pci_bus_id: str = ""
    power_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules: float | None = None
    sm_clock_hz: float | None = None
    sm_clock_max_hz: float | None = None
    clock_event_mask: int | None = None
    utilization: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    gpm: GpmRatios | None = None
    pids: tuple[int, ...] = field(default=())  # compute processes on this GPU (never a label)
    errors: tuple[str, ...] = field(default=())

    def clock_events(self) -> dict[str, bool]:
        """Return each known clock-event reason and whether it is active now."""
        if self.clock_event_mask is None:
            return {}
        return {name: bool(self.clock_event_mask & bit) for bit, name in CLOCK_EVENT_REASONS}
