"""Score the lab: per scenario, the share of ticks with the right verdict and reason, and switch latencies (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from exporter.config import VerdictConfig

SETTLE_SECONDS = 2.0  # each scenario's first seconds are not scored (the switch into it)


@dataclass(frozen=True)
class Segment:
    """One scenario as it ran: expected verdict and reason, wall-clock start and end."""

    name: str
    verdict: str
    reason: str | None
    start: float
    end: float


@dataclass(frozen=True)
class Tick:
    """One tick's verdict for the GPU under test (at: the tick's wall-clock time)."""

    seq: int
    at: float
    verdict: str
    reasons: tuple[str, ...]


def right(t: Tick, seg: Segment) -> bool:
    """Say whether a tick has the segment's verdict and, for host, its reason."""
    return t.verdict == seg.verdict and (seg.reason is None or seg.reason in t.reasons)


def score(
    ticks: Sequence[Tick], segments: Sequence[Segment], settle: float = SETTLE_SECONDS
) -> list[dict[str, Any]]:
    """Return one row per segment: ticks after `settle`, share right, share primary-reason right, latencies."""
    rows = []
    prev: Segment | None = None
    for seg in segments:
        inside = [t for t in ticks if seg.start <= t.at < seg.end]
        scored = [t for t in inside if t.at >= seg.start + settle]
        ok = [t for t in scored if right(t, seg)]
        primary = [
            t
            for t in scored
            if t.verdict == seg.verdict and (seg.reason is None or t.reasons[:1] == (seg.reason,))
        ]
        verdict_ok = [t for t in scored if t.verdict == seg.verdict]
        first = next((t for t in inside if t.verdict == seg.verdict), None)
        first_right = next((t for t in inside if right(t, seg)), None)
        wrong = sorted({(t.verdict, *t.reasons) for t in scored if not right(t, seg)})
        rows.append(
            {
                "scenario": seg.name,
                "expected": seg.verdict + (f" ({seg.reason})" if seg.reason else ""),
                "seconds": round(seg.end - seg.start, 2),
                "ticks_scored": len(scored),
                "right_share": round(len(ok) / len(scored), 4) if scored else None,
                "verdict_share": round(len(verdict_ok) / len(scored), 4) if scored else None,
                "primary_reason_share": round(len(primary) / len(scored), 4) if scored else None,
                "verdict_changed": prev is not None and prev.verdict != seg.verdict,
                "switch_seconds": round(first.at - seg.start, 3) if first is not None else None,
                "right_after_seconds": round(first_right.at - seg.start, 3)
                if first_right is not None
                else None,
                "wrong": [list(w) for w in wrong[:6]],
            }
        )
        prev = seg
    return rows


# A `gpu` label assumes the machine gives the scenario a GPU-bound truth: the GPU busy at the
# verdict's `busy_high`. A small machine (the 2-core VM's four tokenising API servers beside the
# engine) can make host-bound what the label calls GPU-bound; the score stands, and the row says
# the label's premise failed there, with the API servers' demand where it explains why.
PREMISE_BUSY = VerdictConfig().busy_high
PREMISE_API_DEMAND = VerdictConfig().api_server_saturated


def premise(verdict: str, truth: dict[str, Any]) -> str | None:
    """Return why a scenario's label did not hold in its measured truth (None: it held, or is not checked).

    Only `gpu` labels are checked: the truth's busy median (`truth["busy"]`) under PREMISE_BUSY
    fails it; an API server's main-thread demand (CPU plus run-queue wait, cores) at
    PREMISE_API_DEMAND or more is named beside it (alone it does not fail it: the H100's fix ran
    one server at 0.91 with the GPU 0.96 busy).
    """
    if verdict != "gpu" or truth.get("busy") is None or truth["busy"] >= PREMISE_BUSY:
        return None
    why = [f"GPU busy {truth['busy']:.2f} < {PREMISE_BUSY}"]
    demand = [d for d in truth.get("api_main_demand") or () if d is not None]
    if demand and max(demand) >= PREMISE_API_DEMAND:
        why.append(f"an API server's main thread demands {max(demand):.2f} cores")
    return "; ".join(why)


def passed(rows: Sequence[dict[str, Any]], share: float = 0.95, switch: float = 1.5) -> dict[str, Any]:
    """Return the pass/fail of the lab's two requirements."""
    shares = [r for r in rows if r["right_share"] is not None]
    switches = [r for r in rows if r["verdict_changed"]]
    share_ok = bool(shares) and all(r["right_share"] >= share for r in shares)
    switch_ok = all(r["switch_seconds"] is not None and r["switch_seconds"] <= switch for r in switches)
    return {
        "right_share_at_least": share,
        "every_scenario_right": share_ok,
        "switch_within_seconds": switch,
        "every_switch_in_time": switch_ok,
        "worst_right_share": min((r["right_share"] for r in shares), default=None),
        "worst_switch_seconds": max((r["switch_seconds"] or 1e9 for r in switches), default=None),
    }
