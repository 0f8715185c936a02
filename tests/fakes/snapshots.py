"""Snapshots for tests that build one tick by hand."""

from __future__ import annotations

from typing import Any

from exporter.snapshot import Snapshot


def first_tick(**fields: Any) -> Snapshot:
    """Return the first tick (seq 1, at and mono 0, 0.5 s interval and dt) with the fields given."""
    return Snapshot(**{"seq": 1, "at": 0.0, "mono": 0.0, "interval": 0.5, "dt": 0.5, **fields})
