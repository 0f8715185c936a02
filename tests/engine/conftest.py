"""Make this directory's helpers (engine_fixtures, vllm_sim, make_fixtures) importable by name.

Spawned processes of the multiprocess simulations import `vllm_sim` by name too.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
