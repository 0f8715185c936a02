"""One immutable Snapshot per tick: every source's reading, the integrated counters, the verdicts.

Sources produce readings (the dataclasses in this package); `exporter.analysis.pipeline`
turns the readings of one tick plus the previous Snapshot into the next Snapshot; collectors
render the latest Snapshot at scrape time without doing I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from exporter.snapshot.agent import AgentReading
from exporter.snapshot.engine import EngineReading
from exporter.snapshot.gpu import GpuReading
from exporter.snapshot.host import HostReading
from exporter.snapshot.probe import ProbeSummary
from exporter.snapshot.totals import HistogramValue, Totals
from exporter.snapshot.verdict import Verdict


@dataclass(frozen=True)
class SourceStatus:
    """How the last read of one source went."""

    name: str
    up: bool
    errors_total: int = 0
    last_error: str = ""
    duration_seconds: float = 0.0
    late: bool = False  # the read outlasted the tick: its last reading was reused
    over_bound: int = 0  # what the source found beyond its bound and left unread (engines past discovery's)


@dataclass(frozen=True)
class Snapshot:
    """Everything boundwatch knows at one tick."""

    seq: int
    at: float  # unix time of the tick, s
    mono: float  # monotonic time of the tick, s
    interval: float  # configured tick, s
    dt: float  # monotonic time since the previous tick (0 on the first)
    gpus: tuple[GpuReading, ...] = field(default=())
    host: HostReading | None = None
    engines: tuple[EngineReading, ...] = field(default=())
    agent: AgentReading | None = None
    verdicts: tuple[Verdict, ...] = field(default=())
    busy: Mapping[int, tuple[float, str]] = field(default_factory=lambda: MappingProxyType({}))
    totals: Totals = field(default_factory=Totals)  # the newest Snapshot's only (see sampling)
    sources: tuple[SourceStatus, ...] = field(default=())
    probe: Mapping[str, ProbeSummary] = field(default_factory=lambda: MappingProxyType({}))  # by GPU label
    gpu_uuids: tuple[str, ...] = field(
        default=()
    )  # UUIDs outside NVML, first seen first (their index: see pipeline)

    def source(self, name: str) -> SourceStatus | None:
        """Return the status of a source by name."""
        for status in self.sources:
            if status.name == name:
                return status
        return None

    def gpu(self, index: int) -> GpuReading | None:
        """Return the NVML reading of one GPU (the first with that index)."""
        if len(self.gpus) < 8:
            for reading in self.gpus:
                if reading.index == index:
                    return reading
            return None
        by_index: dict[int, GpuReading] | None = self.__dict__.get("_gpu_by_index")
        if by_index is None:  # built once per Snapshot (fields are frozen): a look-up per GPU stays O(1)
            by_index = {}
            for reading in self.gpus:
                by_index.setdefault(reading.index, reading)
            object.__setattr__(self, "_gpu_by_index", by_index)
        return by_index.get(index)


__all__ = [
    "AgentReading",
    "EngineReading",
    "GpuReading",
    "HistogramValue",
    "HostReading",
    "ProbeSummary",
    "Snapshot",
    "SourceStatus",
    "Totals",
    "Verdict",
]
