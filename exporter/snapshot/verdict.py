"""The verdict for one GPU at one tick."""

from __future__ import annotations

from dataclasses import dataclass, field

VERDICTS: tuple[str, ...] = ("idle", "gpu", "host", "unknown")
# Host-bound reasons in the order they are reported: root causes before the symptoms they cause.
HOST_REASONS: tuple[str, ...] = (
    "cpu_quota_throttled",
    "api_server_saturated",
    "cuda_graph_fallback",
    "admission_stalled",
    "scheduler_stalled",
    "step_overhead",
    "unknown",
)
REASONS: tuple[str, ...] = (
    "api_server_saturated",
    "cpu_quota_throttled",
    "admission_stalled",
    "scheduler_stalled",
    "cuda_graph_fallback",
    "step_overhead",
    "unknown",
    "no_busy_source",
    "no_engine_source",
    "no_gpu_mapping",
)

Evidence = tuple[tuple[str, float | str | None], ...]


@dataclass(frozen=True, slots=True)  # one per GPU per tick in history: no __dict__ each
class Verdict:
    """GPU-bound, host-bound (with reasons), idle, or unknown, with the evidence used.

    `raw` is this tick's classification before the hold and `streak` how many ticks in a row the
    raw verdict has disagreed with the reported one, so the next tick can apply the hold from this
    Verdict alone. `offered` says whether work was offered to the GPU's engines this tick (in their
    queue, in flight, or held before them by a saturated or throttled API server), so the host-bound
    seconds can count GPU idle time while work waits anywhere, not only while requests run.
    `edges` are the busy shares the verdict could be held against next tick (`verdict.busy_edges`):
    the NVML source reads its dearest busy figure where its estimate lies near one.
    """

    gpu: int
    verdict: str
    reasons: tuple[str, ...] = field(default=())
    busy_ratio: float | None = None
    busy_source: str | None = None
    evidence: Evidence = field(default=())
    raw: str = ""
    streak: int = 0
    offered: bool = False
    edges: tuple[float, ...] = field(default=())

    def without_evidence(self) -> Verdict:
        """Return this verdict without its evidence or edges (what a compact history record keeps).

        Built field by field: `dataclasses.replace` costs twice as much, once per GPU per tick.
        """
        if not self.evidence and not self.edges:
            return self
        return Verdict(
            self.gpu,
            self.verdict,
            self.reasons,
            self.busy_ratio,
            self.busy_source,
            (),
            self.raw,
            self.streak,
            self.offered,
        )

    def get(self, key: str) -> float | str | None:
        """Return one evidence value, or None."""
        for k, v in self.evidence:
            if k == key:
                return v
        return None
