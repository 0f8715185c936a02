"""The verdict families as Prometheus text."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.analysis import verdict as v
from exporter.config import Config, RooflineConfig
from exporter.export import verdict as export
from exporter.export.families import render
from tests.fakes.verdict_scenes import SEED, Scene, series


class _One:
    def __init__(self, snap) -> None:
        self.snap = snap

    def collect(self):
        yield from render((*export.FAMILIES, *export.INTEGRATED), self.snap)


def samples(snap) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    reg = CollectorRegistry()
    reg.register(_One(snap))
    text = generate_latest(reg).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_seed000_renders_host_one_hot_and_its_reasons() -> None:
    cfg = Config(roofline=RooflineConfig(weight_bytes_per_step=165e9, hbm_bandwidth_bytes_per_second=8e12))
    snap = v.replay(series(Scene(**SEED, api_cpu=0.99, step_ms=72, step_gpu_ms=19), 3.0), cfg)[-1]
    got = samples(snap)
    bound = {dict(k[1])["verdict"]: val for k, val in got.items() if k[0] == "boundwatch_bound"}
    assert bound == {"idle": 0.0, "gpu": 0.0, "host": 1.0, "unknown": 0.0}
    reasons = {dict(k[1])["reason"]: val for k, val in got.items() if k[0] == "boundwatch_bound_reason"}
    assert len(reasons) == 10  # every reason, scheduler_stalled and no_gpu_mapping included
    assert {r for r, val in reasons.items() if val} == {
        "api_server_saturated",
        "admission_stalled",
        "step_overhead",
    }
    assert got[("boundwatch_roofline_step_floor_seconds", (("gpu", "0"),))] == 165e9 / 8e12
    ratio = got[("boundwatch_roofline_achieved_ratio", (("gpu", "0"),))]
    assert 0.28 < ratio < 0.29


def test_no_roofline_without_weight_bytes() -> None:
    snap = v.replay(series(Scene(busy=0.97), 2.0), Config())[-1]
    got = samples(snap)
    assert not [k for k in got if k[0].startswith("boundwatch_roofline")]
    assert got[("boundwatch_bound", (("gpu", "0"), ("verdict", "gpu")))] == 1.0


def test_an_empty_queue_beside_a_saturated_api_server_renders_host_not_idle() -> None:
    # Issue 9's lab: busy 0.45, the engine's queue empty, one API server's main thread at a full core.
    scene = Scene(busy=0.45, busy_source="gpm", running=0, waiting=0, api_cpu=1.0, graph_share=None)
    got = samples(v.replay(series(scene, 3.0), Config())[-1])
    assert got[("boundwatch_bound", (("gpu", "0"), ("verdict", "host")))] == 1.0
    assert got[("boundwatch_bound", (("gpu", "0"), ("verdict", "idle")))] == 0.0
    assert got[("boundwatch_bound_reason", (("gpu", "0"), ("reason", "api_server_saturated")))] == 1.0


def test_the_light_agents_graph_step_share_is_exported_low_in_eager_decode_and_high_in_graphs() -> None:
    # The H200 lab with the light agent (session 17): its decode ran in CUDA graphs, then eager
    import gzip
    import json
    from pathlib import Path

    from exporter.snapshot.codec import read_lines

    results = Path(__file__).resolve().parents[2] / "bench" / "results"
    with gzip.open(results / "scenarios-h200-light-session17.jsonl.gz", "rt") as fh:
        head, snaps = read_lines(fh)
        snaps = list(snaps)
    key = ("boundwatch_bound_graph_step_ratio", (("gpu", "0"),))
    by_scene: dict[str, list[float]] = {}
    for snap in v.replay(snaps, Config()):
        seg = next((s for s in head["schedule"] if s["start"] + 2 <= snap.at < s["end"]), None)
        if seg is not None and seg["name"] in ("gpu_bound_decode", "eager_decode"):
            by_scene.setdefault(seg["name"], []).append(samples(snap).get(key, -1.0))
    graphs, eager = by_scene["gpu_bound_decode"], by_scene["eager_decode"]
    assert len(graphs) > 20 and len(eager) > 20, json.dumps(by_scene)[:500]
    assert min(graphs) > 0.9 and max(eager) < 0.1, (graphs, eager)  # every scored tick has the gauge
