"""vLLM's spec-decode acceptance: the ratio of its counters' deltas over the last 10 s of Snapshots."""

from __future__ import annotations

import dataclasses

import pytest

from exporter.analysis import pipeline
from exporter.analysis.engine import SPEC_WINDOW_SECONDS, with_acceptance
from exporter.config import Config
from exporter.sampling import compact
from exporter.snapshot import Snapshot, SourceStatus
from exporter.snapshot.engine import EngineReading


def tick(seq: int, accepted: float, drafted: float, late: bool = False, **kw: object) -> Snapshot:
    """Return a raw tick at 0.5 s per seq whose vLLM page read these counters."""
    e = EngineReading(
        "vllm:8000", "vllm", spec_accepted_tokens_total=accepted, spec_draft_tokens_total=drafted, **kw
    )  # type: ignore[arg-type]
    return Snapshot(
        seq=seq,
        at=1.7e9 + seq / 2,
        mono=seq / 2,
        interval=0.5,
        dt=0.5,
        engines=(e,),
        sources=(SourceStatus("engine", True, late=late),),
    )


def run(ticks: list[Snapshot]) -> list[Snapshot]:
    out: list[Snapshot] = []
    for t in ticks:
        out.append(with_acceptance(out, t))
    return out


def acceptance(s: Snapshot) -> float | None:
    return s.engines[0].spec_acceptance


def test_the_window_starts_at_the_newest_reading_at_least_10_s_old() -> None:
    # 90% accepted for 20 s, then 25% of the last 200 drafted tokens
    ticks = [tick(i, 900 * i / 40, 1000 * i / 40) for i in range(1, 41)] + [tick(41, 950, 1200)]
    out = run(ticks)
    assert acceptance(out[0]) is None  # one reading: no window yet
    assert acceptance(out[1]) == pytest.approx(0.9)
    start = ticks[41 - 1 - int(SPEC_WINDOW_SECONDS / 0.5)].engines[0]  # 10 s before the last tick
    expected = (950 - start.spec_accepted_tokens_total) / (1200 - start.spec_draft_tokens_total)  # type: ignore[operator]
    assert acceptance(out[-1]) == pytest.approx(expected)


def test_a_carried_page_or_a_late_read_keeps_the_last_acceptance_and_adds_no_reading() -> None:
    out = run(
        [tick(1, 0, 0), tick(2, 50, 100), tick(3, 50, 100, page_read=False), tick(4, 50, 100, late=True)]
    )
    assert [acceptance(s) for s in out] == [None, 0.5, 0.5, 0.5]


def test_compacted_snapshots_still_serve_the_window() -> None:
    out = run([tick(i, 10 * i, 20 * i) for i in range(1, 25)])
    old = [compact(s) for s in out[:-1]]
    assert with_acceptance(old, tick(25, 250, 1000)).engines[0].spec_acceptance == pytest.approx(
        (250 - 10 * 5) / (1000 - 20 * 5)  # seq 5, at 2.5 s: 10 s before 12.5 s
    )


def test_an_engine_given_ratio_is_kept_and_a_failed_read_has_none() -> None:
    sglang = EngineReading("sglang:30000", "sglang", spec_acceptance=0.62)
    snap = dataclasses.replace(
        tick(1, 0, 0), engines=(sglang, EngineReading("vllm:8000", "vllm", error="HTTP 500"))
    )
    assert with_acceptance([], snap) is snap


def test_replay_recomputes_the_acceptance_from_the_recorded_counters() -> None:
    live: list[Snapshot] = []
    for t in [tick(1, 0, 0), tick(2, 30, 100), tick(3, 80, 200)]:
        live.append(pipeline.advance(live, t, Config()))
    recorded = [
        dataclasses.replace(s, engines=(dataclasses.replace(s.engines[0], spec_acceptance=None),))
        for s in live
    ]
    assert [acceptance(s) for s in pipeline.replay(recorded, Config())] == [None, 0.3, 0.4]
