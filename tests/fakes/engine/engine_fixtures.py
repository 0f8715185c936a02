"""Paths of the engine test fixtures."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent  # tests/fakes/engine: the stand-ins' scripts
ROOT = HERE.parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
PAGES = FIXTURES / "engine"
PROC = FIXTURES / "proc" / "engines"
