"""Every lab recording replayed with the verdict's busy thresholds changed (pure replay, no GPU).

For each value given, `verdict.queued_busy_low` is set to it (and `verdict.busy_high` raised to it where
lower: the narrow band is taken within [busy_low, busy_high]); each recording is replayed through the
pipeline and scored against its own schedule. Printed per recording: the scenarios right in under 95% of
their scored ticks, or `ok`.

    python3 -m bench.scenarios.threshold_sweep 0.83,0.85,0.88 [recordings...] [--out FILE]

Without recordings: every `bench/results/scenarios-h[12]00-*.jsonl.gz`.
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
from exporter.analysis.verdict import replay
from exporter.config import Config
from exporter.snapshot.codec import read_lines

RESULTS = Path(__file__).resolve().parents[1] / "results"


def with_band(cfg: Config, low: float) -> Config:
    """Return cfg with the narrow band's floor at `low` (busy_high raised to it where lower)."""
    v = cfg.verdict
    return dataclasses.replace(
        cfg, verdict=dataclasses.replace(v, queued_busy_low=low, busy_high=max(low, v.busy_high))
    )


def sweep(recording: Path, lows: list[float]) -> dict[str, dict[str, float]]:
    """Return, per value, the scenarios of one recording right in under 95% of their scored ticks."""
    with gzip.open(recording, "rt") as fh:
        head, it = read_lines(fh)
        snaps = list(it)
    segments = [Segment(**s) for s in head["schedule"]]
    out: dict[str, dict[str, float]] = {}
    for low in lows:
        rows, _ = scored_replayed(replay(snaps, with_band(Config(), low)), segments)
        out[f"{low:g}"] = {
            r["scenario"]: r["right_share"]
            for r in rows
            if r.get("right_share") is not None and r["right_share"] < 0.95
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("values", help="the narrow band's floors to try, comma-separated (e.g. 0.83,0.85,0.88)")
    ap.add_argument("recordings", nargs="*", type=Path, help="lab recordings (scenarios-*.jsonl.gz)")
    ap.add_argument("--out", type=Path, help="write the result as JSON here too")
    args = ap.parse_args()
    lows = [float(v) for v in args.values.split(",")]
    files = args.recordings or sorted(RESULTS.glob("scenarios-h[12]00-*.jsonl.gz"))
    result: dict[str, Any] = {"values": lows, "recordings": {}}
    for f in files:
        got = sweep(f, lows)
        result["recordings"][f.name] = got
        print(f.name[:48].ljust(48), " | ".join(f"{k}: {v or 'ok'}" for k, v in got.items()))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
