"""Field-lab recordings replayed as if the daemon read GPM GRAPHICS_UTIL only where the verdict needs it (pure replay, no GPU).

GRAPHICS_UTIL is the verdict's busy share on the H200 and its one dear NVML read: ~2-2.5 ms of CPU per
busy GPU per tick (bench/README.md, "NVML calls per tick on the H200"), about 0.4-0.5% of a core per
GPU. The four other GPM metrics come from the same pair of samples for ~1 us each; SM_UTIL follows
the same activity at a ratio that moves slowly. Reading GRAPHICS_UTIL every K ticks with the others
estimated as SM_UTIL times the last ratio failed in session 17 (eager decode, whose busy sits inside
the verdict's hysteresis band). The policy replayed here reads it whenever the verdict could turn on
it, and estimates it only where it cannot:

- read when the last read is K ticks old, when SM_UTIL moved more than D since it, or when the
  estimate lies within M of a busy share the last verdict could turn on (`Verdict.edges`: `busy_low`,
  `busy_high`; the eager ones where the graphs read eager; `idle_busy` without an engine);
- otherwise the tick's GRAPHICS_UTIL is the estimate, min(1, SM_UTIL x graphics / SM at the last read);
- a tick with no SM active reads 0 and is not counted as a read (NVML's cheap metrics show it).

The decision is the daemon's own (`exporter.sources.nvml.GraphicsGate`), so this replay is what the
source does with the recorded figures.

Each recording is replayed as recorded and with the policy, tick by tick (the policy sees the verdict
the replay gave the tick before, as the daemon's NVML source would see the last Snapshot), and scored
against its schedule; what the policy saves is the share of GPU-0 ticks whose GRAPHICS_UTIL it did
not read.

    python3 -m bench.scenarios.graphics_reads bench/results/scenarios-h200-*.jsonl.gz --out R.json
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
from pathlib import Path
from typing import Any

from bench.scenarios.busy_sources import scored_replayed
from bench.scenarios.score import Segment
from exporter.analysis.verdict import _reach, classify_tick
from exporter.config import Config
from exporter.snapshot import Snapshot
from exporter.snapshot.codec import read_lines
from exporter.sources.nvml import GraphicsGate


@dataclasses.dataclass(frozen=True)
class Policy:
    every: int = GraphicsGate.every  # K: read at least every this many ticks
    sm_moved: float = GraphicsGate.sm_moved  # D: read when SM_UTIL moved more than this since the last read
    margin: float = GraphicsGate.margin  # M: read when the estimate is this near a threshold that applies


def _edges(snap: Snapshot | None) -> tuple[float, ...] | None:
    """Return the busy shares GPU 0's last verdict could turn on (`Verdict.edges`), as `NvmlSource.follow` keeps them."""
    v = next((v for v in snap.verdicts if v.gpu == 0), None) if snap is not None else None
    return v.edges if v is not None and v.edges else None


def replay_with(
    snaps: list[Snapshot], cfg: Config, policy: Policy | None
) -> tuple[list[Snapshot], list[tuple[float, bool]]]:
    """Return the replayed Snapshots and, for each GPU-0 tick with GRAPHICS_UTIL recorded, (its time, whether the policy read it).

    The daemon's own gate (`sources.nvml.GraphicsGate`) decides, tick by tick, on the SM_UTIL
    recorded and the edges of the verdict the replay gave the tick before. A tick with no SM
    active reads 0 and carries no ratio, as the source does.
    """
    keep = max(2, int(_reach(cfg.verdict) / cfg.tick_seconds) + 4)
    out: list[Snapshot] = []
    gate = GraphicsGate(policy.every, policy.sm_moved, policy.margin) if policy is not None else None
    seen: list[tuple[float, bool]] = []
    for i, snap in enumerate(snaps):
        g = snap.gpu(0)
        gpm = g.gpm if g is not None else None
        if gate is not None and gpm is not None and gpm.graphics is not None and gpm.sm is not None:
            est = None if gpm.sm <= 0 else gate.estimate(i, gpm.sm, _edges(out[-1] if out else None))
            seen.append((snap.at, est is None and gpm.sm > 0))
            if est is None:
                gate.read(i, gpm.sm, gpm.graphics)
            else:
                gpus = tuple(
                    dataclasses.replace(
                        x, gpm=dataclasses.replace(gpm, graphics=est, graphics_estimated=True)
                    )
                    if x.index == 0
                    else x
                    for x in snap.gpus
                )
                snap = dataclasses.replace(snap, gpus=gpus)
        out.append(classify_tick(out[-keep:], dataclasses.replace(snap, verdicts=()), cfg))
    return out, seen


def study(path: Path, policy: Policy, cfg: Config | None = None) -> dict[str, Any]:
    with gzip.open(path, "rt") as fh:
        head, it = read_lines(fh)
        snaps = list(it)
    segments = [Segment(**s) for s in head["schedule"]]
    cfg = cfg or Config()
    result: dict[str, Any] = {"recording": path.name}
    for name, pol in (("as_recorded", None), ("policy", policy)):
        replayed, seen = replay_with(snaps, cfg, pol)
        rows, summary = scored_replayed(replayed, segments)
        result[name] = {
            "summary": summary,
            "rows": [{k: r.get(k) for k in ("scenario", "right_share", "switch_seconds")} for r in rows],
        }
        if pol is not None:
            result[name]["graphics_ticks"], result[name]["graphics_reads"] = (
                len(seen),
                sum(r for _, r in seen),
            )
            result[name]["reads_by_scenario"] = {
                seg.name: [
                    sum(r for at, r in seen if seg.start <= at < seg.end),
                    sum(1 for at, _ in seen if seg.start <= at < seg.end),
                ]
                for seg in segments
            }
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("recordings", type=Path, nargs="+", help="lab recordings, scenarios-*.jsonl.gz")
    ap.add_argument("--every", type=int, default=Policy.every)
    ap.add_argument("--sm-moved", type=float, default=Policy.sm_moved)
    ap.add_argument("--margin", type=float, default=Policy.margin)
    ap.add_argument("--out", type=Path, help="write the results as JSON here too")
    args = ap.parse_args()
    policy = Policy(args.every, args.sm_moved, args.margin)
    results = []
    for path in args.recordings:
        r = study(path, policy)
        results.append(r)
        rows = {x["scenario"]: x for x in r["as_recorded"]["rows"]}
        worse = [
            f"{x['scenario']}: {rows[x['scenario']]['right_share']}->{x['right_share']}"
            f" switch {rows[x['scenario']]['switch_seconds']}->{x['switch_seconds']}"
            for x in r["policy"]["rows"]
            if x != rows[x["scenario"]]
        ]
        ticks, reads = r["policy"]["graphics_ticks"], r["policy"]["graphics_reads"]
        print(
            f"{path.name}: read {reads}/{ticks} ({reads / ticks if ticks else 0:.2f}); changed: {worse or 'none'}"
        )
    if args.out:
        args.out.write_text(json.dumps({"policy": dataclasses.asdict(policy), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
