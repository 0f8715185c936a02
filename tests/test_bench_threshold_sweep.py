"""bench/scenarios/threshold_sweep.py: a recording replayed with the narrow band's floor changed.

Session 40's H100 lab without an agent read eager decode at GPM 0.76-0.88 a tick (truth 0.73) with 23
requests waiting: on the default band it flipped between gpu and host (right in half its ticks); with the
band's floor and busy_high at 0.88 it reads host in at least 95% of its scored ticks (bench/README.md,
session 40).
"""

from pathlib import Path

from bench.scenarios.threshold_sweep import sweep, with_band
from exporter.config import Config

RECORDING = (
    Path(__file__).resolve().parent.parent / "bench" / "results" / "scenarios-h100-none-session40.jsonl.gz"
)


def test_with_band_raises_busy_high_only_where_lower():
    cfg = Config()
    assert with_band(cfg, 0.80).verdict.queued_busy_low == 0.80
    assert with_band(cfg, 0.80).verdict.busy_high == cfg.verdict.busy_high
    assert with_band(cfg, 0.88).verdict.busy_high == 0.88
    assert with_band(cfg, 0.88).verdict.busy_low == cfg.verdict.busy_low


def test_session40_eager_decode_on_the_band_edge():
    got = sweep(RECORDING, [0.83, 0.88])
    assert set(got["0.83"]) == {"eager_decode"}
    assert 0.3 <= got["0.83"]["eager_decode"] <= 0.7
    assert got["0.88"] == {}
