"""The self-test probe's last result of one GPU, as the daemon keeps it in `Snapshot.probe`.

`Snapshot.probe` maps a GPU label (the NVML index as a string, as in every `gpu` label) to that GPU's
`ProbeSummary`; `exporter.probe.logic.summarize(result)` builds one from the probe's JSON result.
Recordings and /api/snapshot pages carry it as `{"0": {"status": "pass", ...}}`, the layout the
daemon has always written, so old recordings decode into these types unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

PROBE_STATUSES = ("pass", "fail", "error")  # error: the probe could not run


@dataclass(frozen=True)
class ProbeSummary:
    """One GPU's last probe: whether it passed, when, the HBM bandwidth and the busy sources' errors."""

    status: str = "error"  # one of PROBE_STATUSES
    success: bool | None = None  # None when the probe could not run
    timestamp: float | None = None  # unix time the probe finished, s
    hbm_bandwidth_bytes_per_second: float | None = None  # copy bandwidth, bytes read + written per second
    hbm_bandwidth_ratio: float | None = None  # that over the device's nominal figure
    # {source: reported - in-kernel busy fraction}, the worst phase per source (cupti, gpm, nvml)
    duty_errors: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    message: str = ""  # one line for people


NO_PROBE: Mapping[str, ProbeSummary] = MappingProxyType({})
