"""Shared pieces of the engine tests: fixture paths and the vLLM simulation module."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent / "fixtures"
PAGES = FIXTURES / "engine"
PROC = FIXTURES / "proc" / "engines"

if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))  # vllm_sim: spawned processes import it by name
