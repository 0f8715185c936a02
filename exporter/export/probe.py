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

from collections.abc import Iterator, Mapping

from prometheus_client.metrics_core import Metric

from exporter import catalogue as c
from exporter.snapshot import Snapshot


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def render(snap: Snapshot) -> Iterator[Metric]:
    """Yield the probe gauges.

    boundwatch_probe_hbm_bandwidth_bytes_per_second{gpu="0"} 4.27e+12
    boundwatch_probe_duty_error_ratio{gpu="0",source="cupti"} 0.0003
    """
    bandwidth = c.gauge("boundwatch_probe_hbm_bandwidth_bytes_per_second")
    ratio = c.gauge("boundwatch_probe_hbm_bandwidth_ratio")
    duty = c.gauge("boundwatch_probe_duty_error_ratio")
    success = c.gauge("boundwatch_probe_success")
    last = c.gauge("boundwatch_probe_last_run_timestamp_seconds")
    for gpu, entry in sorted(snap.probe.items(), key=lambda kv: str(kv[0])):
        if not isinstance(entry, Mapping):
            continue
        label = [str(gpu)]
        for fam, key in (
            (bandwidth, "hbm_bandwidth_bytes_per_second"),
            (ratio, "hbm_bandwidth_ratio"),
            (last, "timestamp"),
        ):
            value = _num(entry.get(key))
            if value is not None:
                fam.add_metric(label, value)
        if isinstance(entry.get("success"), bool):
            success.add_metric(label, 1.0 if entry["success"] else 0.0)
        errors = entry.get("duty_errors")
        if isinstance(errors, Mapping):
            for source, err in sorted(errors.items()):
                value = _num(err)
                if value is not None:
                    duty.add_metric([str(gpu), str(source)], value)
    yield from (bandwidth, ratio, duty, success, last)
