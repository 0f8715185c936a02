"""No function in exporter/ is over 80 lines (the last long ones were split: docs/architecture.md, "Known debt")."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 80


def long_functions(root: Path, limit: int = LIMIT) -> dict[str, int]:
    """Return "path:Class.function" -> length in lines for every function longer than limit."""
    found: dict[str, int] = {}
    for path in sorted((root / "exporter").rglob("*.py")):
        tree = ast.parse(path.read_text())
        stack: list[tuple[ast.AST, str]] = [(tree, "")]
        while stack:
            node, prefix = stack.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    name = f"{prefix}{child.name}"
                    if not isinstance(child, ast.ClassDef):
                        lines = (child.end_lineno or child.lineno) - child.lineno + 1
                        if lines > limit:
                            found[f"{path.relative_to(root).as_posix()}:{name}"] = lines
                    stack.append((child, f"{name}."))
    return found


def test_no_new_function_over_80_lines() -> None:
    found = long_functions(ROOT)
    assert sorted(found) == [], "split it: a function fits on a screen"


def test_the_check_measures_nested_and_method_definitions(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(81))
    (tmp_path / "exporter").mkdir()
    (tmp_path / "exporter" / "m.py").write_text(
        f"class C:\n  def f(self):\n{body}\n\ndef g():\n    return 1\n"
    )
    assert long_functions(tmp_path) == {"exporter/m.py:C.f": 82}
