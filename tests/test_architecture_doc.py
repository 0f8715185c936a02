"""docs/architecture.md's table of where each exported number is computed stays true to the code.

Every catalogue metric is rendered by one export module (tests/export/test_export_families.py);
here each of those modules must stand in the table's "rendered by" column, and every module or
function the table names, in either column, must exist, so a move or a rename fails here.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from tests.export.test_export_families import declared

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
NAME = re.compile(r"`([a-z_]+(?:/[a-z_]+)*(?:\.py)?(?:\.[a-z_]+)?)`")


def table() -> dict[str, tuple[str, str]]:
    """Return area -> (rendered by, computed in) from the doc's table."""
    text = DOC.read_text()
    section = text.split("## Where each exported number is computed", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, tuple[str, str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] not in {"area", "---"} and not cells[0].startswith("-"):
            rows[cells[0]] = (cells[1], cells[2])
    return rows


def resolve(ref: str) -> bool:
    """Return whether `sources/nvml.py`, `analysis/pipeline.device_busy_increments` or `sampling.py` exists."""
    path, _, attr = ref.partition(".py")
    if not _:
        path, _, attr = ref.rpartition(".")
        if not path:
            path, attr = ref, ""
    module = "exporter." + path.replace("/", ".")
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return False
    attr = attr.lstrip(".")
    return not attr or hasattr(mod, attr)


def test_every_rendering_module_has_its_row_and_every_named_module_exists() -> None:
    rows = table()
    assert {"gpu", "busy", "engine", "host", "verdict", "probe", "self"} <= set(rows)
    rendered_by = " ".join(r for r, _ in rows.values())
    renderers = {mod for mods in declared().values() for mod in mods}
    missing = sorted(m for m in renderers if f"`export/{m}.py`" not in rendered_by)
    assert missing == [], f"export modules that render catalogue metrics but have no row: {missing}"
    named = {ref for r, computed in rows.values() for ref in NAME.findall(r + " " + computed)}
    assert len(named) >= 15
    assert sorted(ref for ref in named if not resolve(ref)) == []


def test_a_renamed_module_would_fail_the_check() -> None:
    assert resolve("analysis/pipeline.device_busy_increments") and resolve("sources/nvml.py")
    assert not resolve("analysis/pipeline.no_such_function") and not resolve("sources/no_such.py")
