"""The prometheus_client collector that renders the latest Snapshot at scrape time.

`collect()` reads memory only: no I/O, no waiting. A Snapshot older than `max_age` is not
served as if fresh: only the exporter's own families are rendered then, with its age.
Each family renders in its own guard: one that raises is left out of that page, counted in
`boundwatch_render_errors_total{family}` and logged once per change of state, and every other
family is still served.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Iterator

import structlog
from prometheus_client.metrics_core import Metric

from exporter import __version__
from exporter import catalogue as c
from exporter.export import activity, busy, engine, gpu, host, probe, verdict
from exporter.export.families import Family
from exporter.snapshot import Snapshot

log = structlog.get_logger("boundwatch.export")

AREAS = (gpu, busy, host, activity, engine, verdict, probe)
TOTALS: tuple[Family, ...] = tuple(f for area in AREAS for f in area.INTEGRATED)
# The page lists the figures of this tick area by area, then the integrated totals by name
# (counters, then histograms).
PAGE: tuple[Family, ...] = (
    *(f for area in AREAS for f in area.FAMILIES),
    *sorted(TOTALS, key=lambda f: (f.spec.kind == "histogram", f.spec.name)),
)
# The families this module renders without a Snapshot renderer of their own.
SELF_FAMILIES: tuple[c.MetricSpec, ...] = (
    c.BUILD_INFO,
    c.TICK_INTERVAL_SECONDS,
    c.SOURCE_UP,
    c.SOURCE_ERRORS_TOTAL,
    c.SOURCE_OVER_BOUND,
    c.SOURCE_DURATION_SECONDS,
    c.TICKS_TOTAL,
    c.SNAPSHOT_AGE_SECONDS,
    c.RENDER_ERRORS_TOTAL,
    c.DEMO,
)


def render_self(snap: Snapshot | None, age: float | None, interval: float) -> Iterator[Metric]:
    """Yield the exporter's own families: build info, source status, ticks, snapshot age."""
    info = c.gauge(c.BUILD_INFO)
    info.add_metric([__version__, platform.python_version()], 1)
    yield info
    tick = c.gauge(c.TICK_INTERVAL_SECONDS)
    tick.add_metric([], interval)
    yield tick
    if snap is None:
        return
    up = c.gauge(c.SOURCE_UP)
    errors = c.counter(c.SOURCE_ERRORS_TOTAL)
    over = c.gauge(c.SOURCE_OVER_BOUND)
    duration = c.gauge(c.SOURCE_DURATION_SECONDS)
    for status in snap.sources:
        up.add_metric([status.name], 1.0 if status.up else 0.0)
        errors.add_metric([status.name], status.errors_total)
        over.add_metric([status.name], status.over_bound)
        duration.add_metric([status.name], status.duration_seconds)
    yield from (up, errors, over, duration)
    ticks = c.counter(c.TICKS_TOTAL)
    ticks.add_metric([], snap.seq)
    yield ticks
    if age is not None:
        fam = c.gauge(c.SNAPSHOT_AGE_SECONDS)
        fam.add_metric([], age)
        yield fam


def counter_series(snap: Snapshot) -> dict[str, float]:
    """Return the integrated counters by series, keyed "name{label,label}" (for /api/snapshot)."""
    out: dict[str, float] = {}
    for family in TOTALS:
        if family.spec.kind == "counter":
            for sample in family.render(snap).samples:
                out[f"{sample.name}{{{','.join(sample.labels.values())}}}"] = sample.value
    return out


class SnapshotCollector:
    """Render the newest Snapshot a provider returns."""

    def __init__(
        self,
        latest: Callable[[], Snapshot | None],
        interval: float,
        max_age: float,
        clock: Callable[[], float] = time.monotonic,
        families: tuple[Family, ...] = PAGE,
    ) -> None:
        self._latest = latest
        self._interval = interval
        self._max_age = max_age
        self._clock = clock
        self._families = families
        self._stale = False
        self.render_errors: dict[str, int] = {}  # by family name: scrapes in which it failed
        self._failing: set[str] = set()

    def collect(self) -> Iterator[Metric]:
        """Yield every family for the newest fresh Snapshot."""
        snap = self._latest()
        age = None if snap is None else max(0.0, self._clock() - snap.mono)
        fresh = snap is not None and age is not None and age <= self._max_age
        families = self._render(snap) if fresh and snap is not None else []
        yield from render_self(snap, age, self._interval)
        if self.render_errors:
            errors = c.counter(c.RENDER_ERRORS_TOTAL)
            for name, n in sorted(self.render_errors.items()):
                errors.add_metric([name], n)
            yield errors
        if snap is not None and not fresh and not self._stale:  # once per change of state, not per scrape
            log.warning("snapshot_stale", age=round(age or 0.0, 3))
            self._stale = True
        elif fresh and self._stale:
            log.info("snapshot_fresh", age=round(age or 0.0, 3))
            self._stale = False
        yield from families

    def _render(self, snap: Snapshot) -> list[Metric]:
        """Return every family with samples; a family that raises is counted, logged on change, left out."""
        out: list[Metric] = []
        for family in self._families:
            name = family.spec.name
            try:
                metric = family.render(snap)
            except Exception:
                self.render_errors[name] = self.render_errors.get(name, 0) + 1
                if name not in self._failing:
                    self._failing.add(name)
                    log.exception("render_failed", family=name)
                continue
            if name in self._failing:
                self._failing.discard(name)
                log.info("render_recovered", family=name)
            if metric.samples:
                out.append(metric)
        return out


class DemoCollector:
    """Render `boundwatch_demo 1`: every scrape of a demo says it is one."""

    def collect(self) -> Iterator[Metric]:
        """Yield the demo gauge."""
        fam = c.gauge(c.DEMO)
        fam.add_metric([], 1.0)
        yield fam
