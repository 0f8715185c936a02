"""bench/scenarios/gpm_ratios.py: GPM's SM activity against its graphics activity per lab scenario.

Session 40's H100 lab without an agent read eager decode at GRAPHICS_UTIL 0.77-0.86 (5th-95th
percentile of its scored ticks: on the narrow band's edge) while its SM activity per graphics-active
time stayed below GPU-bound decode's, by a few hundredths only (bench/README.md, session 41).
"""

from pathlib import Path

from bench.scenarios.gpm_ratios import ratios

RECORDING = (
    Path(__file__).resolve().parent.parent / "bench" / "results" / "scenarios-h100-none-session40.jsonl.gz"
)


def test_session40_eager_decode_reads_in_the_band_with_a_lower_sm_share():
    got = ratios(RECORDING)
    assert set(got) == {"gpu_bound_decode", "eager_decode", "fix_four_api_servers"}
    eager, gpu = got["eager_decode"], got["gpu_bound_decode"]
    assert eager["ticks"] >= 20 and gpu["ticks"] >= 20
    assert eager["graphics_p05_p95"][1] >= 0.83  # inside the band, where GRAPHICS_UTIL alone cannot tell
    assert gpu["graphics_p05_p95"][0] >= 0.9
    gap = gpu["sm_over_graphics_p05_p95"][0] - eager["sm_over_graphics_p05_p95"][1]
    assert 0.0 < gap < 0.1  # apart, but by a margin too thin (and too model-bound) to classify on
