"""GPM's SM activity against its graphics activity, per lab scenario, over the recordings (no GPU).

A question from issue 9: without an agent, eager decode (CUDA graphs stopped at run time) can read
GPM GRAPHICS_UTIL inside the verdict's narrow band while its kernels' union is well below it. Does
another GPM figure in the recordings tell it from GPU-bound decode with a queue? Printed per
recording and scenario, for the scored ticks (after each scenario's first 2 s, as `score`): the 5th
to 95th percentile of GRAPHICS_UTIL and of SM_UTIL / GRAPHICS_UTIL; then, per scenario over every
recording, the range of those percentiles, and the margin between eager decode's highest ratio
(95th percentile) and GPU-bound decode's lowest (5th percentile).

    python3 -m bench.scenarios.gpm_ratios [recordings...] [--out FILE]

Without recordings: every `bench/results/scenarios-h[12]00-*.jsonl.gz`.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path
from typing import Any

from bench.scenarios.score import SETTLE_SECONDS, Segment
from exporter.snapshot.codec import read_lines

RESULTS = Path(__file__).resolve().parents[1] / "results"
SCENARIOS = ("gpu_bound_decode", "eager_decode", "fix_four_api_servers")


def _pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[round(q * (len(v) - 1))]


def ratios(recording: Path) -> dict[str, dict[str, Any]]:
    """Return, per scenario of one recording, its scored ticks' GRAPHICS_UTIL and SM / GRAPHICS percentiles."""
    with gzip.open(recording, "rt") as fh:
        head, it = read_lines(fh)
        segments = [Segment(**s) for s in head["schedule"]]
        found: dict[str, tuple[list[float], list[float]]] = {}
        for snap in it:
            seg = next((s for s in segments if s.start + SETTLE_SECONDS <= snap.at < s.end), None)
            if seg is None or seg.name not in SCENARIOS or not snap.gpus:
                continue
            gpm = snap.gpus[0].gpm
            if gpm is None or not gpm.graphics or gpm.sm is None:
                continue
            graphics, ratio = found.setdefault(seg.name, ([], []))
            graphics.append(gpm.graphics)
            ratio.append(gpm.sm / gpm.graphics)
    return {
        name: {
            "ticks": len(g),
            "graphics_p05_p95": [round(_pct(g, 0.05), 3), round(_pct(g, 0.95), 3)],
            "sm_over_graphics_p05_p95": [round(_pct(r, 0.05), 3), round(_pct(r, 0.95), 3)],
        }
        for name, (g, r) in found.items()
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("recordings", nargs="*", type=Path, help="lab recordings (scenarios-*.jsonl.gz)")
    ap.add_argument("--out", type=Path, help="write the result as JSON here too")
    args = ap.parse_args()
    recordings = args.recordings or sorted(RESULTS.glob("scenarios-h[12]00-*.jsonl.gz"))
    per = {p.name: ratios(p) for p in recordings}
    for name, rows in per.items():
        for scenario, row in sorted(rows.items()):
            g, r = row["graphics_p05_p95"], row["sm_over_graphics_p05_p95"]
            print(
                f"{name:48s} {scenario:22s} {row['ticks']:3d} graphics {g[0]:.3f}-{g[1]:.3f}  sm/graphics {r[0]:.3f}-{r[1]:.3f}"
            )
    summary: dict[str, Any] = {}
    for scenario in SCENARIOS:
        rows = [rows[scenario] for rows in per.values() if scenario in rows]
        if rows:
            summary[scenario] = {
                "recordings": len(rows),
                "sm_over_graphics_lowest_p05": min(r["sm_over_graphics_p05_p95"][0] for r in rows),
                "sm_over_graphics_highest_p95": max(r["sm_over_graphics_p05_p95"][1] for r in rows),
            }
    if "eager_decode" in summary and "gpu_bound_decode" in summary:
        summary["margin_gpu_bound_low_minus_eager_high"] = round(
            summary["gpu_bound_decode"]["sm_over_graphics_lowest_p05"]
            - summary["eager_decode"]["sm_over_graphics_highest_p95"],
            3,
        )
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.write_text(json.dumps({"per_recording": per, "summary": summary}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
