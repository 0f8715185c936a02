"""The plan checks itself: every module's imports follow the data flow sources -> snapshot -> analysis -> export.

Rules (docs/architecture.md, STYLE.md 1 and 13):
- `exporter/snapshot/` and `exporter/wire.py` import only the standard library (and the snapshot package);
- `exporter/analysis/` is pure: no source, export, agent, daemon or catalogue module, and no I/O or
  Prometheus library;
- the agent, inside someone's inference process, imports of the sidecar only the wire and the interval
  maths, and no Prometheus, HTTP, NVML or logging library;
- sources never import analysis, export, the web side, commands, the daemon or the sampler (what
  sources and analysis both need, such as the engine page's names, sits in `exporter/snapshot/`);
- export (`exporter/export/`) renders metric families from memory: of the sidecar it imports only the
  Snapshot, analysis and the catalogue, and no HTTP, socket, NVML or subprocess library (aiohttp none);
- the web side (`exporter/serve/`) is the only one that serves HTTP (aiohttp's server, `http.server`,
  `socketserver`, `wsgiref`), and it never imports sources, commands, the daemon or the agent;
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


# What rendering may not touch: sockets, HTTP (client or server), NVML, subprocesses.
EXPORT_FORBIDDEN_LIBRARIES = (IO_LIBRARIES - {"prometheus_client", "structlog", "logging"}) | {"ssl"}
# HTTP serving: aiohttp's server side and the standard library's servers (aiohttp's client is a source's).
SERVING = {"aiohttp.web", "http.server", "socketserver", "wsgiref"}


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
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "aiohttp" and node.attr.startswith("web"):
                found.add(f"aiohttp.{node.attr}")  # `import aiohttp` then `aiohttp.web.AppRunner`
    return found


def _under(name: str, prefixes: set[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _serving(name: str) -> bool:
    return _under(name, SERVING) or name.startswith("aiohttp.web_")


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
            "exporter.serve",
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
        forbidden = {
            "exporter.analysis",
            "exporter.export",
            "exporter.serve",
            "exporter.commands",
            "exporter.daemon",
            "exporter.sampling",
        }
        bad += [n for n in own if _under(n, forbidden)]
    if module.startswith("exporter.export"):
        allowed = {"exporter.export", "exporter.snapshot", "exporter.analysis", "exporter.catalogue"}
        bad += [n for n in own if n not in {"exporter", "exporter.__version__"} and not _under(n, allowed)]
        bad += [n for n in names if _under(n, EXPORT_FORBIDDEN_LIBRARIES)]
    if _under(module, {"exporter.serve"}):
        forbidden = {
            "exporter.sources",
            "exporter.commands",
            "exporter.cli",
            "exporter.daemon",
            "exporter.agent",
        }
        bad += [n for n in own if _under(n, forbidden)]
    else:
        bad += [n for n in names if _serving(n)]
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


def test_the_check_catches_a_source_that_imports_analysis() -> None:
    src = "from exporter.analysis import engine_page\nfrom exporter.snapshot.engine_names import WANTED\n"
    names = imports_of(src, "exporter.sources.engine_scrape")
    assert violations("exporter.sources.engine_scrape", names) == [
        "exporter.analysis",
        "exporter.analysis.engine_page",
    ]


def test_the_check_catches_a_sub_command_importing_the_command_line() -> None:
    src = "from exporter.cli import add_config_flags\nfrom exporter.commands import ConfigFlags\n"
    names = imports_of(src, "exporter.commands.diagnose")
    assert violations("exporter.commands.diagnose", names) == [
        "exporter.cli",
        "exporter.cli.add_config_flags",
    ]


def test_the_check_catches_export_importing_aiohttp_or_the_web_side() -> None:
    src = "from aiohttp import web\nimport socket\nfrom exporter.serve import listener\nfrom exporter.snapshot import Snapshot\n"
    names = imports_of(src, "exporter.export.gpu")
    assert violations("exporter.export.gpu", names) == [
        "aiohttp",
        "aiohttp.web",
        "exporter.serve",
        "exporter.serve.listener",
        "socket",
    ]


def test_the_check_catches_http_serving_outside_the_web_side() -> None:
    daemon = "import aiohttp\nrunner = aiohttp.web.AppRunner(app)\n"
    assert violations("exporter.daemon", imports_of(daemon, "exporter.daemon")) == ["aiohttp.web"]
    demo = "import http.server\nfrom aiohttp.web_runner import TCPSite\n"
    assert violations("exporter.commands.demo", imports_of(demo, "exporter.commands.demo")) == [
        "aiohttp.web_runner",
        "aiohttp.web_runner.TCPSite",
        "http.server",
    ]
    client = "import aiohttp\nsession = aiohttp.ClientSession()\n"  # a source's HTTP client is no server
    assert violations("exporter.sources.engine", imports_of(client, "exporter.sources.engine")) == []
    served = "from aiohttp import web\n"
    assert violations("exporter.serve.web", imports_of(served, "exporter.serve.web")) == []
