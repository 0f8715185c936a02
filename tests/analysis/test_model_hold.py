"""An engine's served model name (boundwatch_engine_info's `model` label) holds while the same processes serve.

A page that changes its model_name each read must not make a new series each read; a real switch
(the engine restarted: new processes) is served at once, and the same processes' new name after it
has read the same for 30 s. Through the real pipeline (advance, and a recording's replay).
"""

from __future__ import annotations

from dataclasses import replace

from exporter.analysis import engine_page, pipeline
from exporter.config import Config
from exporter.export import engine as export_engine
from exporter.snapshot import Snapshot
from exporter.snapshot.codec import from_json, to_json
from exporter.snapshot.engine import EngineReading
from exporter.sources.engine_scrape import raw_from_page

HOLD = engine_page.MODEL_HOLD_SECONDS


def _reading(model: str | None, pids: tuple[int, ...] = (10, 11)) -> EngineReading:
    """Return one read of an engine's page naming `model` (None: the read failed)."""
    if model is None:
        return EngineReading(name="vllm:8000", kind="vllm", error="connection refused", pids=pids)
    text = f'vllm:num_requests_running{{engine="0",model_name="{model}"}} 2\n'
    return replace(raw_from_page(text, name="vllm:8000"), pids=pids)


def _run(reads: list[EngineReading]) -> list[Snapshot]:
    """Return the Snapshots `advance` makes of one read a 0.5 s tick."""
    cfg, hist = Config(), []
    for seq, e in enumerate(reads, start=1):
        raw = Snapshot(seq, 1000.0 + seq / 2, seq / 2, 0.5, 0.5 if seq > 1 else 0.0, engines=(e,))
        hist.append(pipeline.advance(hist, raw, cfg))
    return hist


def _models(hist: list[Snapshot]) -> list[str]:
    return [s.engines[0].model for s in hist]


def _held(snap: Snapshot) -> float:
    return sum(v for k, v in snap.totals.engine.page_refused.items() if k.reason == "model")


def _info_series(hist: list[Snapshot]) -> set[tuple[str, ...]]:
    """Return every boundwatch_engine_info label set the page showed over the run."""
    return {tuple(s.labels.values()) for snap in hist for s in export_engine.info(snap).samples}


def test_a_page_naming_another_model_each_read_makes_one_series():
    hist = _run([_reading(f"m{i}") for i in range(240)])  # 120 s, a new name every read
    assert set(_models(hist)) == {"m0"}
    assert _info_series(hist) == {("vllm:8000", "vllm", "m0")}
    assert _held(hist[-1]) == 239  # each read held is counted
    assert hist[-1].engines[0].model_pending == ("m239", hist[-1].mono)


def test_two_names_in_turn_never_serve_the_second():
    hist = _run([_reading("a" if i % 2 == 0 else "b") for i in range(200)])
    assert set(_models(hist)) == {"a"}
    assert _held(hist[-1]) == 100


def test_the_same_processes_new_name_is_served_once_it_has_read_the_same_for_the_hold():
    reads = [_reading("old")] * 10 + [_reading("new")] * 100
    hist = _run(reads)
    models = _models(hist)
    first_new = hist[10].mono
    switched = next(i for i, m in enumerate(models) if m == "new")
    assert hist[switched].mono - first_new == HOLD  # not a tick before the hold, not a tick after
    assert models[:switched] == ["old"] * switched and set(models[switched:]) == {"new"}
    assert _held(hist[-1]) == switched - 10
    assert hist[-1].engines[0].model_pending is None


def test_a_restarted_engine_is_served_its_new_name_at_once():
    hist = _run([_reading("old")] * 10 + [_reading("new", pids=(20, 21))] * 3)
    assert _models(hist) == ["old"] * 10 + ["new"] * 3
    assert _held(hist[-1]) == 0


def test_a_failed_read_keeps_the_name_and_a_name_first_read_late_is_served_at_once():
    hist = _run([_reading(None), _reading("m"), _reading(None), _reading(None), _reading("m")])
    assert _models(hist) == ["", "m", "m", "m", "m"]
    assert hist[2].engines[0].error  # still the failed read it was
    assert _info_series(hist) == {("vllm:8000", "vllm", ""), ("vllm:8000", "vllm", "m")}
    assert _held(hist[-1]) == 0


def test_a_recording_replays_to_the_same_names():
    hist = _run([_reading("old")] * 4 + [_reading(f"x{i % 3}") for i in range(20)] + [_reading("new")] * 70)
    rec = [from_json(to_json(s, totals=False)) for s in hist]
    again = pipeline.replay(rec, Config())
    assert _models(again) == _models(hist)
    assert [e.model_pending for s in again for e in s.engines] == [
        e.model_pending for s in hist for e in s.engines
    ]
