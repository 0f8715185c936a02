"""Every catalogue name has one renderer; each family renders in its own guard; names are constants."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import structlog
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import exporter.export
from exporter import catalogue as c
from exporter.commands.demo import World, demo_config, demo_sources
from exporter.config import Config
from exporter.export import collectors, families
from exporter.sampling import Sampler
from exporter.snapshot import Snapshot

ROOT = Path(exporter.export.__file__).resolve().parent.parent


def declared() -> dict[str, list[str]]:
    """Return, per catalogue name, the export modules that declare they render it."""
    found: dict[str, list[str]] = {}
    for info in pkgutil.iter_modules(exporter.export.__path__):
        module = importlib.import_module(f"exporter.export.{info.name}")
        specs = [f.spec for f in (*getattr(module, "FAMILIES", ()), *getattr(module, "INTEGRATED", ()))]
        specs += list(getattr(module, "SELF_FAMILIES", ()))
        for spec in specs:
            assert spec is c.BY_NAME.get(spec.name), (
                f"{info.name} renders {spec.name}, not the catalogue's entry"
            )
            found.setdefault(spec.name, []).append(info.name)
    return found


def test_every_catalogue_entry_is_rendered_by_exactly_one_export_module() -> None:
    found = declared()
    assert {name: mods for name, mods in found.items() if len(mods) != 1} == {}
    assert sorted(set(c.BY_NAME) - set(found)) == []


def test_the_collector_renders_every_area_family_once() -> None:
    names = [f.spec.name for f in collectors.PAGE]
    assert len(names) == len(set(names))
    assert set(names) == {
        f.spec.name for area in collectors.AREAS for f in (*area.FAMILIES, *area.INTEGRATED)
    }


async def _demo_snapshot() -> Snapshot:
    t = [1000.0]
    cfg = demo_config(Config())
    world = World(gpus=2, order=("host",), clock=lambda: t[0])
    sampler = Sampler(cfg, demo_sources(world, cfg), clock=lambda: t[0])
    snap = None
    for _ in range(8):
        snap = await sampler.tick()
        t[0] += cfg.tick_seconds
    assert snap is not None
    return snap


async def test_every_family_renders_under_its_own_catalogue_name() -> None:
    snap = await _demo_snapshot()
    with_samples = set()
    for family in collectors.PAGE:
        metric = family.render(snap)
        assert metric.name == c.family(family.spec).name, family.spec.name
        assert metric.type == family.spec.kind
        if metric.samples:
            with_samples.add(family.spec.name)
    # The demo drives every area but the probe: their families carry samples.
    assert {
        "boundwatch_gpu_busy_seconds_total",
        "boundwatch_engine_steps_total",
        "boundwatch_bound",
    } <= with_samples
    assert {"boundwatch_host_bound_seconds_total", "boundwatch_gpu_idle_gap_seconds"} <= with_samples


def _page(collector: collectors.SnapshotCollector) -> dict[str, dict[tuple, float]]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    return {
        fam.name: {tuple(sorted(s.labels.items())): s.value for s in fam.samples}
        for fam in text_string_to_metric_families(text)
    }


async def test_a_family_that_fails_is_counted_logged_once_and_the_others_still_render() -> None:
    snap = await _demo_snapshot()
    broken = {"on": True}

    def power(s: Snapshot):
        if broken["on"]:
            raise KeyError("boundwatch_gpu_pwoer_watts")
        return c.gauge(c.GPU_POWER_WATTS)

    fams = tuple(
        families.Family(f.spec, power) if f.spec is c.GPU_POWER_WATTS else f for f in collectors.PAGE
    )
    collector = collectors.SnapshotCollector(lambda: snap, 0.5, 5.0, clock=lambda: snap.mono, families=fams)
    with structlog.testing.capture_logs() as logs:
        first = _page(collector)
        second = _page(collector)
        broken["on"] = False
        third = _page(collector)
    assert "boundwatch_gpu_power_watts" not in first
    assert first["boundwatch_render_errors"] == {(("family", "boundwatch_gpu_power_watts"),): 1.0}
    assert second["boundwatch_render_errors"] == {(("family", "boundwatch_gpu_power_watts"),): 2.0}
    assert third["boundwatch_render_errors"] == {(("family", "boundwatch_gpu_power_watts"),): 2.0}
    for page in (first, second):  # every other family is still served
        assert (
            page["boundwatch_gpu_busy_seconds"] and page["boundwatch_bound"] and page["boundwatch_gpu_info"]
        )
    events = [(e["event"], e.get("family")) for e in logs if e["event"].startswith("render_")]
    assert events == [
        ("render_failed", "boundwatch_gpu_power_watts"),
        ("render_recovered", "boundwatch_gpu_power_watts"),
    ]


async def test_no_render_errors_family_while_nothing_failed() -> None:
    snap = await _demo_snapshot()
    page = _page(collectors.SnapshotCollector(lambda: snap, 0.5, 5.0, clock=lambda: snap.mono))
    assert "boundwatch_render_errors" not in page and "boundwatch_bound" in page


def _literals(path: Path) -> list[tuple[int, str]]:
    """Return the string constants of a module that are not docstrings."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_analysis_and_export_name_metrics_only_through_catalogue_constants() -> None:
    found = []
    for folder in ("analysis", "export"):
        for path in sorted((ROOT / "exporter" / folder).glob("*.py")):
            found += [(path.name, n, s) for n, s in _literals(path) if s.startswith("boundwatch_")]
    assert found == []


def test_the_check_sees_a_metric_name_written_as_a_string(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('"""Doc about boundwatch_bound."""\nNAME = "boundwatch_host_bound_seconds_total"\n')
    assert _literals(module) == [(2, "boundwatch_host_bound_seconds_total")]
