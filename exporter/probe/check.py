"""Read the sidecar's busy counters from its /metrics page (the end-to-end half of the self-test)."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

BUSY = "boundwatch_gpu_busy_seconds_total"
OBSERVED = "boundwatch_gpu_observed_seconds_total"
INFO = "boundwatch_gpu_info"


def fetch(url: str, timeout: float = 2.0) -> str:
    """Return the text of a /metrics page."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read().decode("utf-8", errors="replace")


def normalize_uuid(uuid: str) -> str:
    """Return a GPU UUID without the "GPU-" prefix, lower case (NVML and CUDA spell it differently)."""
    u = uuid.strip().lower()
    return u[4:] if u.startswith("gpu-") else u


def gpu_label_for_uuid(text: str, uuid: str) -> str | None:
    """Return the `gpu` label the sidecar gives the GPU with this UUID, from boundwatch_gpu_info."""
    want = normalize_uuid(uuid)
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            if sample.name == INFO and normalize_uuid(sample.labels.get("uuid", "")) == want:
                return sample.labels.get("gpu")
    return None


def busy_counters(text: str, gpu: str) -> dict[str, tuple[float, float]]:
    """Return {source: (busy seconds, observed seconds)} for one GPU from a /metrics page."""
    busy: dict[str, float] = {}
    observed: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            if sample.labels.get("gpu") != gpu:
                continue
            source = sample.labels.get("source", "")
            if sample.name == BUSY:
                busy[source] = float(sample.value)
            elif sample.name == OBSERVED:
                observed[source] = float(sample.value)
    return {s: (busy[s], observed[s]) for s in busy if s in observed}
