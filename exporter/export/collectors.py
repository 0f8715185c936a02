"""The prometheus_client collector that renders the latest Snapshot at scrape time.

`collect()` reads memory only: no I/O, no waiting. A Snapshot older than `max_age` is not
served as if fresh: only the exporter's own families are rendered then, with its age.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Iterator
from types import ModuleType

import structlog
from prometheus_client.metrics_core import Metric

from exporter import __version__
from exporter import catalogue as c
from exporter.export import activity, busy, engine, gpu, host, probe, totals, verdict
from exporter.snapshot import Snapshot

log = structlog.get_logger("boundwatch.export")

RenderFn = Callable[[Snapshot], Iterator[Metric]]


AREAS: tuple[ModuleType, ...] = (gpu, busy, host, activity, engine, verdict, probe)


def render_self(snap: Snapshot | None, age: float | None, interval: float) -> Iterator[Metric]:
    """Yield the exporter's own families: build info, source status, ticks, snapshot age."""
    info = c.gauge("boundwatch_build_info")
    info.add_metric([__version__, platform.python_version()], 1)
    yield info
    tick = c.gauge("boundwatch_tick_interval_seconds")
    tick.add_metric([], interval)
    yield tick
    if snap is None:
        return
    up = c.gauge("boundwatch_source_up")
    errors = c.counter("boundwatch_source_errors_total")
    duration = c.gauge("boundwatch_source_duration_seconds")
    for status in snap.sources:
        up.add_metric([status.name], 1.0 if status.up else 0.0)
        errors.add_metric([status.name], status.errors_total)
        duration.add_metric([status.name], status.duration_seconds)
    yield from (up, errors, duration)
    ticks = c.counter("boundwatch_ticks_total")
    ticks.add_metric([], snap.seq)
    yield ticks
    if age is not None:
        fam = c.gauge("boundwatch_snapshot_age_seconds")
        fam.add_metric([], age)
        yield fam


class SnapshotCollector:
    """Render the newest Snapshot a provider returns."""

    def __init__(
        self,
        latest: Callable[[], Snapshot | None],
        interval: float,
        max_age: float,
        clock: Callable[[], float] = time.monotonic,
        areas: tuple[ModuleType, ...] = AREAS,
    ) -> None:
        self._latest = latest
        self._interval = interval
        self._max_age = max_age
        self._clock = clock
        self._areas = areas
        self._stale = False

    def collect(self) -> Iterator[Metric]:
        """Yield every family for the newest fresh Snapshot."""
        snap = self._latest()
        age = None if snap is None else max(0.0, self._clock() - snap.mono)
        yield from render_self(snap, age, self._interval)
        if snap is None or age is None or age > self._max_age:
            if snap is not None and not self._stale:  # once per change of state, not per scrape
                log.warning("snapshot_stale", age=round(age or 0.0, 3))
                self._stale = True
            return
        if self._stale:
            log.info("snapshot_fresh", age=round(age, 3))
            self._stale = False
        for area in (*self._areas, totals):
            try:
                families = list(area.render(snap))
            except Exception:  # one broken area must not blank the page
                log.exception("render_failed", area=area.__name__)
                continue
            yield from (fam for fam in families if fam.samples)
