"""Render the last self-test probe of each GPU as `boundwatch_probe_*` gauges.

`Snapshot.probe` maps a GPU label (the NVML index as a string, as in every `gpu` label) to that GPU's
`ProbeSummary` (`exporter/snapshot/probe.py`); a figure that is None renders nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.metrics_core import Metric

from exporter import catalogue as c
from exporter.export.families import Family
from exporter.snapshot import Snapshot
from exporter.snapshot.probe import ProbeSummary


def _entries(snap: Snapshot) -> list[tuple[str, ProbeSummary]]:
    """Return each GPU's probe summary, by GPU label."""
    return sorted(((str(gpu), entry) for gpu, entry in snap.probe.items()), key=lambda kv: kv[0])


def _number(spec: c.MetricSpec, value_of: Callable[[ProbeSummary], float | None]) -> Family:
    """Return a family of one number of each probe summary, e.g. boundwatch_probe_hbm_bandwidth_bytes_per_second{gpu="0"} 4.27e+12."""

    def render(snap: Snapshot) -> Metric:
        fam = c.gauge(spec)
        for gpu, entry in _entries(snap):
            value = value_of(entry)
            if value is not None:
                fam.add_metric([gpu], value)
        return fam

    return Family(spec, render)


def success(snap: Snapshot) -> Metric:
    """Render whether each GPU's last probe passed (1) or failed (0)."""
    fam = c.gauge(c.PROBE_SUCCESS)
    for gpu, entry in _entries(snap):
        if entry.success is not None:
            fam.add_metric([gpu], 1.0 if entry.success else 0.0)
    return fam


def duty_errors(snap: Snapshot) -> Metric:
    """Render boundwatch_probe_duty_error_ratio{gpu="0",source="cupti"} 0.0003 per source."""
    fam = c.gauge(c.PROBE_DUTY_ERROR_RATIO)
    for gpu, entry in _entries(snap):
        for source, err in sorted(entry.duty_errors.items()):
            fam.add_metric([gpu, str(source)], err)
    return fam


FAMILIES: tuple[Family, ...] = (
    _number(c.PROBE_HBM_BANDWIDTH_BYTES_PER_SECOND, lambda e: e.hbm_bandwidth_bytes_per_second),
    _number(c.PROBE_HBM_BANDWIDTH_RATIO, lambda e: e.hbm_bandwidth_ratio),
    Family(c.PROBE_DUTY_ERROR_RATIO, duty_errors),
    Family(c.PROBE_SUCCESS, success),
    _number(c.PROBE_LAST_RUN_TIMESTAMP_SECONDS, lambda e: e.timestamp),
)
INTEGRATED: tuple[Family, ...] = ()
