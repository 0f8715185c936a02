"""The plan checks itself: every module's imports follow the data flow sources -> snapshot -> analysis -> export.

Rules (docs/architecture.md, STYLE.md 1 and 13):
- `exporter/snapshot/` and `exporter/wire.py` import only the standard library (and the snapshot package);
- `exporter/analysis/` is pure: no source, export, agent, daemon or catalogue module, and no I/O or
  Prometheus library;
- the agent, inside someone's inference process, imports of the sidecar only the wire and the interval
  maths, and no Prometheus, HTTP, NVML or logging library;
- sources never import export, commands, the daemon or the sampler;
- sub-commands never import the command line (`exporter.cli` hands them what they need).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "exporter"

IO_LIBRARIES = {
    "aiohttp",
    "asyncio",
    "http",
    "prometheus_client",
    "pynvml",
    "requests",
    "socket",
    "structlog",
    "subprocess",
    "urllib",
    "logging",
}


def imports_of(source: str, module: str) -> set[str]:
    """Return the absolute names a module's source imports (relative imports resolved against module)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")[: -node.level]
                base = ".".join([*parts, base]) if base else ".".join(parts)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from exporter import wire`
    return found


def _under(name: str, prefixes: set[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def violations(module: str, names: set[str]) -> list[str]:
    """Return the imports of one module that break the layering rules."""
    bad: list[str] = []
    own = {n for n in names if n == "exporter" or n.startswith("exporter.")}
    if module.startswith("exporter.snapshot") or module == "exporter.wire":
        bad += [n for n in own if not _under(n, {"exporter.snapshot"}) and n != "exporter"]
        bad += [n for n in names if _under(n, IO_LIBRARIES - {"socket"}) and module != "exporter.wire"]
    if module.startswith("exporter.analysis"):
        forbidden = {
            "exporter.sources",
            "exporter.export",
            "exporter.agent",
            "exporter.daemon",
            "exporter.sampling",
            "exporter.catalogue",
            "exporter.commands",
            "exporter.probe",
        }
        bad += [n for n in own if _under(n, forbidden)]
        bad += [n for n in names if _under(n, IO_LIBRARIES)]
    if module.startswith("exporter.agent"):
        allowed = {"exporter.agent", "exporter.wire", "exporter.analysis.intervals"}
        bad += [n for n in own if n != "exporter" and not _under(n, allowed)]
        bad += [n for n in names if _under(n, IO_LIBRARIES - {"socket"})]
    if module.startswith("exporter.commands"):
        bad += [n for n in own if _under(n, {"exporter.cli"})]
    if module.startswith("exporter.sources"):
        forbidden = {"exporter.export", "exporter.commands", "exporter.daemon", "exporter.sampling"}
        bad += [n for n in own if _under(n, forbidden)]
    return sorted(set(bad))


def modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        name = ".".join(rel.parts)
        out.append((name.removesuffix(".__init__"), path))
    return out


@pytest.mark.parametrize(("module", "path"), modules(), ids=[m for m, _ in modules()])
def test_module_imports_follow_the_layers(module: str, path: Path) -> None:
    assert violations(module, imports_of(path.read_text(), module)) == []


def test_the_check_catches_an_analysis_module_that_imports_aiohttp_or_a_source() -> None:
    src = "from aiohttp import web\nfrom exporter.sources import engine\nfrom . import verdict\n"
    names = imports_of(src, "exporter.analysis.pipeline")
    assert violations("exporter.analysis.pipeline", names) == [
        "aiohttp",
        "aiohttp.web",
        "exporter.sources",
        "exporter.sources.engine",
    ]


def test_the_check_catches_the_agent_pulling_in_the_sidecar() -> None:
    src = "from exporter import catalogue\nimport prometheus_client\nfrom exporter import wire\n"
    names = imports_of(src, "exporter.agent.core")
    assert violations("exporter.agent.core", names) == ["exporter.catalogue", "prometheus_client"]


def test_the_check_catches_a_sub_command_importing_the_command_line() -> None:
    src = "from exporter.cli import add_config_flags\nfrom exporter.commands import ConfigFlags\n"
    names = imports_of(src, "exporter.commands.diagnose")
    assert violations("exporter.commands.diagnose", names) == [
        "exporter.cli",
        "exporter.cli.add_config_flags",
    ]
