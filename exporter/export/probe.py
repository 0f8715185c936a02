"""Render the last self-test probe of each GPU as `boundwatch_probe_*` gauges.

`Snapshot.probe` maps a GPU label (the NVML index as a string, as in every `gpu` label) to the
summary of that GPU's last probe, as `exporter.probe.logic.summarize(result)` builds it:

    status                          "pass" | "fail" | "error" (error: the probe could not run)
    success                         True / False, None when the probe could not run
    timestamp                       unix time the probe finished, s (None if unknown)
    hbm_bandwidth_bytes_per_second  copy bandwidth, bytes read + written per second (None if skipped)
    hbm_bandwidth_ratio             that over the device's nominal figure (None if the device is unknown)
    duty_errors                     {source: reported - in-kernel busy fraction}, the worst phase per
                                    source (cupti, gpm, nvml; empty without duty phases)
    message                         one line for people

Entries that are not mappings, and keys that are absent or None, render nothing.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.metrics_core import Metric

from exporter import catalogue as c
from exporter.export.families import Family
from exporter.snapshot import Snapshot


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _entries(snap: Snapshot) -> list[tuple[str, Mapping[str, object]]]:
    """Return each GPU's probe summary that is a mapping, by GPU label."""
    found = sorted(snap.probe.items(), key=lambda kv: str(kv[0]))
    return [(str(gpu), entry) for gpu, entry in found if isinstance(entry, Mapping)]


def _number(spec: c.MetricSpec, key: str) -> Family:
    """Return a family of one number of each probe summary, e.g. boundwatch_probe_hbm_bandwidth_bytes_per_second{gpu="0"} 4.27e+12."""

    def render(snap: Snapshot) -> Metric:
        fam = c.gauge(spec)
        for gpu, entry in _entries(snap):
            value = _num(entry.get(key))
            if value is not None:
                fam.add_metric([gpu], value)
        return fam

    return Family(spec, render)


def success(snap: Snapshot) -> Metric:
    """Render whether each GPU's last probe passed (1) or failed (0)."""
    fam = c.gauge(c.PROBE_SUCCESS)
    for gpu, entry in _entries(snap):
        if isinstance(entry.get("success"), bool):
            fam.add_metric([gpu], 1.0 if entry["success"] else 0.0)
    return fam


def duty_errors(snap: Snapshot) -> Metric:
    """Render boundwatch_probe_duty_error_ratio{gpu="0",source="cupti"} 0.0003 per source."""
    fam = c.gauge(c.PROBE_DUTY_ERROR_RATIO)
    for gpu, entry in _entries(snap):
        errors = entry.get("duty_errors")
        if isinstance(errors, Mapping):
            for source, err in sorted(errors.items()):
                value = _num(err)
                if value is not None:
                    fam.add_metric([gpu, str(source)], value)
    return fam


FAMILIES: tuple[Family, ...] = (
    _number(c.PROBE_HBM_BANDWIDTH_BYTES_PER_SECOND, "hbm_bandwidth_bytes_per_second"),
    _number(c.PROBE_HBM_BANDWIDTH_RATIO, "hbm_bandwidth_ratio"),
    Family(c.PROBE_DUTY_ERROR_RATIO, duty_errors),
    Family(c.PROBE_SUCCESS, success),
    _number(c.PROBE_LAST_RUN_TIMESTAMP_SECONDS, "timestamp"),
)
INTEGRATED: tuple[Family, ...] = ()
