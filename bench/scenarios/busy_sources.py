"""A field-lab recording replayed as if the daemon had read its busy share another way (pure replay, no GPU).

GPM GRAPHICS_UTIL costs ~1.25 ms of CPU per GPU per tick on the H200 (`bench/nvml_calls.py`); with
`nvml.gpm_graphics = false` the verdict's busy share is the mean of NVML's utilization samples over
the tick instead. A recording made with both read (the lab's daemon on defaults) is replayed here
twice, as recorded and with every GPM graphics ratio removed (what that daemon would have seen), and
each variant scored against the recording's schedule; beside it, per scenario, how far each busy
figure was from the lab's truth (CUDA events around each step), tick by tick.

    python3 -m bench.scenarios.busy_sources bench/results/scenarios-h200-none-session15.jsonl.gz
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import statistics
from pathlib import Path
from typing import Any

from bench.scenarios.score import Segment, Tick, passed, score
from exporter.analysis.verdict import replay
from exporter.config import Config
from exporter.snapshot import Snapshot
from exporter.snapshot.codec import read_lines


def without_graphics(snap: Snapshot) -> Snapshot:
    """Return the Snapshot as a daemon with `nvml.gpm_graphics = false` would have taken it."""
    gpus = tuple(
        dataclasses.replace(g, gpm=dataclasses.replace(g.gpm, graphics=None)) if g.gpm is not None else g
        for g in snap.gpus
    )
    return dataclasses.replace(snap, gpus=gpus)


def scored(snaps: list[Snapshot], segments: list[Segment]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Return the replayed verdicts' rows per scenario and the pass summary."""
    return scored_replayed(replay(snaps, Config()), segments)


def scored_replayed(
    replayed: list[Snapshot], segments: list[Segment]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Return the rows per scenario and the pass summary of Snapshots whose verdicts are set (GPU 0's)."""
    ticks = [
        Tick(s.seq, s.at, v.verdict, tuple(v.reasons)) for s in replayed for v in s.verdicts if v.gpu == 0
    ]
    rows = score(ticks, segments)
    return rows, passed(rows)


def errors(snaps: list[Snapshot], truth: dict[int, float], segments: list[Segment]) -> list[dict[str, Any]]:
    """Return, per scenario, each busy figure's median and its median and largest distance from the truth."""
    out = []
    for seg in segments:
        pairs: dict[str, list[tuple[float, float]]] = {"gpm": [], "nvml": []}
        for s in snaps:
            g = s.gpu(0)
            if not (seg.start + 2.0 <= s.at < seg.end) or s.seq not in truth or g is None:
                continue
            if g.gpm is not None and g.gpm.graphics is not None:
                pairs["gpm"].append((g.gpm.graphics, truth[s.seq]))
            if g.utilization is not None:
                pairs["nvml"].append((g.utilization, truth[s.seq]))
        row: dict[str, Any] = {
            "scenario": seg.name,
            "truth": _med([t for _, t in pairs["nvml"] or pairs["gpm"]]),
        }
        for name, got in pairs.items():
            d = [abs(v - t) for v, t in got]
            row[name] = {
                "ticks": len(got),
                "median": _med([v for v, _ in got]),
                "abs_error_median": _med(d),
                "abs_error_max": round(max(d), 3) if d else None,
            }
        out.append(row)
    return out


def _med(vals: list[float]) -> float | None:
    return round(statistics.median(vals), 3) if vals else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "recording", type=Path, help="a lab recording, scenarios-*.jsonl.gz (its .json beside it)"
    )
    ap.add_argument("--out", type=Path, help="write the result as JSON here too")
    args = ap.parse_args()
    with gzip.open(args.recording, "rt") as fh:
        head, it = read_lines(fh)
        snaps = list(it)
    segments = [Segment(**s) for s in head["schedule"]]
    live = json.loads(args.recording.with_name(args.recording.name.replace(".jsonl.gz", ".json")).read_text())
    truth = {int(t[0]): float(t[2]) for t in live.get("truth_ticks", [])}
    result: dict[str, Any] = {"recording": args.recording.name, "variants": {}}
    for name, snaps_v in (("as_recorded", snaps), ("no_gpm_graphics", [without_graphics(s) for s in snaps])):
        rows, summary = scored(snaps_v, segments)
        result["variants"][name] = {
            "summary": summary,
            "rows": [
                {k: r[k] for k in ("scenario", "right_share", "switch_seconds", "said") if k in r}
                for r in rows
            ],
        }
    result["busy_against_truth"] = errors(snaps, truth, segments)
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
