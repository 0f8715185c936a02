"""Which busy figure is shown and which one the verdict uses, with the reason for each (pure).

Two questions, two answers, one place:
- `shown(snap)` — each GPU's `boundwatch_gpu_busy_ratio`: the best figure of the tick, CUPTI (exact
  union of kernel, memcpy/memset and graph intervals) where an agent's newest window is whole, else
  GPM GRAPHICS_UTIL, else NVML utilization.gpu. A CUPTI window that lost records gives way to GPM.
- `for_verdict(snap, gpu, prefer)` — the figure the thresholds are held against: with "fresh" (the
  default) GPM, else NVML, measured over this very tick like the engine's queue, since a CUPTI window
  closes only once older than the agent's flush lag (1-2 s late: a threshold on it would show a false
  "host" for the first second of every load); with "best", the shown figure.
`boundwatch_bound_busy_ratio{gpu,source}` exports the second, so the page says what the verdict used.
"""

from __future__ import annotations

from exporter.analysis import activity
from exporter.snapshot import Snapshot


def shown(snap: Snapshot) -> dict[int, tuple[float, str]]:
    """Return each GPU's busy ratio and its source: cupti, else gpm, else nvml."""
    busy: dict[int, tuple[float, str]] = {}
    for g in snap.gpus:
        if g.utilization is not None:
            busy[g.index] = (g.utilization, "nvml")
        if g.gpm is not None and g.gpm.graphics is not None:
            busy[g.index] = (g.gpm.graphics, "gpm")
    for gpu, ratio in activity.cupti_busy_ratio(snap).items():
        busy[gpu] = (ratio, "cupti")
    return busy


def for_verdict(snap: Snapshot, gpu: int, prefer: str = "fresh") -> tuple[float, str] | None:
    """Return the busy share the verdict uses for one tick, and its source (see the module's text)."""
    if prefer == "fresh":
        g = snap.gpu(gpu)
        if g is not None:
            if g.gpm is not None and g.gpm.graphics is not None:
                return g.gpm.graphics, "gpm"
            if g.utilization is not None:
                return g.utilization, "nvml"
    return snap.busy.get(gpu)
