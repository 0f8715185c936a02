"""Real cgroups made by tests on this machine's hierarchy: removed when their processes are gone."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path


def remove_cgroups(dirs: Iterable[Path], tries: int = 50) -> None:
    """Remove cgroup directories, deepest first, retrying while the kernel still counts an exiting process in one."""
    for d in sorted(dirs, key=lambda d: -len(d.parts)):
        for _ in range(tries):
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)
