"""The verdict for one GPU at one tick."""

from __future__ import annotations

from dataclasses import dataclass, field

VERDICTS: tuple[str, ...] = ("idle", "gpu", "host", "unknown")
REASONS: tuple[str, ...] = (
    "api_server_saturated",
    "cpu_quota_throttled",
    "admission_stalled",
    "cuda_graph_fallback",
    "step_overhead",
    "unknown",
    "no_busy_source",
    "no_engine_source",
)


@dataclass(frozen=True)
class Verdict:
    """GPU-bound, host-bound (with reasons), idle, or unknown, with the evidence used."""

    gpu: int
    verdict: str
    reasons: tuple[str, ...] = field(default=())
    busy_ratio: float | None = None
    busy_source: str | None = None
    evidence: tuple[tuple[str, float | str | None], ...] = field(default=())
