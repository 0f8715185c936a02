"""What the before/after benches share: their results file, with the command and the machine beside the figures."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def write_results(path: str, figures: dict[str, Any]) -> None:
    """Write figures to path as JSON, with the bench's arguments, the CPU count and the time it finished."""
    with open(path, "w") as f:
        json.dump(
            {
                **figures,
                "argv": sys.argv[1:],
                "cpus": os.cpu_count(),
                "at": time.strftime("%Y-%m-%d %H:%M:%S"),
            },
            f,
            indent=1,
        )
