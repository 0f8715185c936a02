"""A host without an engine keeps the engine source up; a failing engine reads engine_up 0, figures dropped."""

import dataclasses

from exporter.config import Config, EngineConfig
from exporter.export import engine as export_engine
from exporter.export.families import render
from exporter.snapshot import Snapshot
from exporter.snapshot.engine import EngineReading
from exporter.sources.engine import EngineSource


async def test_no_engine_on_the_host_is_an_empty_reading_not_a_failure(tmp_path):
    (tmp_path / "proc").mkdir()
    cfg = dataclasses.replace(Config(), engine=EngineConfig(urls=()))
    src = EngineSource(cfg, proc_root=str(tmp_path / "proc"))
    try:
        assert await src.read() == ()
    finally:
        await src.aclose()


def test_engine_up_is_zero_and_its_figures_are_dropped_while_its_page_fails():
    ok = EngineReading(name="vllm:8000", kind="vllm", running=160.0, waiting=0.0)
    bad = EngineReading(name="vllm:8001", kind="vllm", running=3.0, error="TimeoutError")
    snap = Snapshot(seq=1, at=0.0, mono=0.0, interval=0.5, dt=0.5, engines=(ok, bad))
    fams = {f.name: f for f in render(export_engine.FAMILIES, snap)}
    up = {s.labels["engine"]: s.value for s in fams["boundwatch_engine_up"].samples}
    running = {s.labels["engine"]: s.value for s in fams["boundwatch_engine_requests_running"].samples}
    assert up == {"vllm:8000": 1.0, "vllm:8001": 0.0}
    assert running == {"vllm:8000": 160.0}
