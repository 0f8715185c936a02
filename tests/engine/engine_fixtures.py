"""Paths of the engine test fixtures."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent / "fixtures"
PAGES = FIXTURES / "engine"
PROC = FIXTURES / "proc" / "engines"
