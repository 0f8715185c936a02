"""The integrated counters and histograms, typed per area: what analysis adds up tick by tick.

Analysis (`exporter.analysis`) produces them; only `exporter/export/<area>.py` maps a field to
its metric name. A series is a mapping entry keyed by its labels (an int GPU index, an engine
name, or a named tuple of several labels); an entry present at 0 is a series that exists from
its first tick, so `rate()` sees it start. One tick's increments have the same shape as the
totals, and `Totals.plus` adds them.
"""

from __future__ import annotations

import dataclasses
import operator
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, NamedTuple, TypeVar


@dataclass(frozen=True)
class HistogramValue:
    """A cumulative histogram: counts per upper bound (ascending, +Inf last), sum, count."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]  # non-cumulative, len(bounds) + 1 (the last is +Inf)
    total: float = 0.0

    def add(self, counts: tuple[float, ...], total: float) -> HistogramValue:
        """Return this histogram with more observations added."""
        if not self.counts:
            return HistogramValue(self.bounds, tuple(counts), total)
        if len(counts) != len(self.counts):
            raise ValueError(f"histogram of {len(self.counts)} buckets added {len(counts)}")
        return _histogram(self.bounds, tuple(map(operator.add, self.counts, counts)), self.total + total)

    @property
    def count(self) -> float:
        """Return the number of observations."""
        return float(sum(self.counts))


def _histogram(bounds: tuple[float, ...], counts: tuple[float, ...], total: float) -> HistogramValue:
    """Return `HistogramValue(bounds, counts, total)` without the frozen __init__'s three setattr calls.

    Its __dict__ is filled in field order, as __init__ fills it: equal, the same repr, still frozen.
    """
    new = object.__new__(HistogramValue)
    new.__dict__.update(bounds=bounds, counts=counts, total=total)
    return new


class GpuSource(NamedTuple):
    """Labels of a per-GPU figure that has several sources (cupti, gpm, nvml)."""

    gpu: int
    source: str


class GpuKind(NamedTuple):
    """Labels of a per-GPU count of CUPTI records by kind (kernel, memcpy, memset, graph)."""

    gpu: int
    kind: str


class GpuVerdict(NamedTuple):
    """Labels of the time a GPU spent in one verdict."""

    gpu: int
    verdict: str


class EngineMethod(NamedTuple):
    """Labels of an engine's steps and how they were counted."""

    engine: str
    method: str


class EngineReason(NamedTuple):
    """Labels of one engine's page losses by reason (snapshot.engine.PAGE_REFUSED_REASONS)."""

    engine: str
    reason: str


class EngineServer(NamedTuple):
    """Labels of one API server of an engine (server: its number, as the page shows it)."""

    engine: str
    server: str


K = TypeVar("K")


class GpuKeys(Generic[K]):
    """The label keys of one kind for each GPU index, made once: `make(gpu, label)` for each label.

    A tick's counters key every GPU's series by new named tuples (`GpuKind(gpu, "kernel")`, ...):
    ~0.2 us each, several per GPU. The keys are immutable, so each GPU's are made once and shared
    by every tick's increments. Only a GPU index of type int is kept (an equal bool or float would
    give a key with another repr); past `size` GPUs the cache starts afresh.
    """

    def __init__(self, make: Callable[[int, str], K], labels: tuple[str, ...], size: int = 4096) -> None:
        self._make = make
        self.labels = labels
        self.size = size
        self._kept: dict[int, tuple[K, ...]] = {}

    def __call__(self, gpu: int) -> tuple[K, ...]:
        """Return the GPU's keys, one per label in the labels' order."""
        keys = self._kept.get(gpu)
        if keys is None or type(gpu) is not int:
            keys = tuple(self._make(gpu, label) for label in self.labels)
            if type(gpu) is int:
                if len(self._kept) >= self.size:
                    self._kept.clear()
                self._kept[gpu] = keys
        return keys


def _none() -> Mapping[Any, Any]:
    return MappingProxyType({})


@dataclass(frozen=True)
class BusyTotals:
    """GPU busy time by source, and what the agents' CUPTI windows add up to."""

    busy_seconds: Mapping[GpuSource, float] = field(default_factory=_none)
    observed_seconds: Mapping[GpuSource, float] = field(default_factory=_none)
    graph_busy_seconds: Mapping[int, float] = field(default_factory=_none)
    activity_records: Mapping[GpuKind, float] = field(default_factory=_none)
    dropped_records: Mapping[int, float] = field(default_factory=_none)
    idle_gaps: Mapping[int, HistogramValue] = field(default_factory=_none)


@dataclass(frozen=True)
class AgentTotals:
    """The agents' messages: received, rejected, and refused by reason (None: no agent source yet)."""

    messages: float | None = None
    bad_messages: float | None = None
    refused: Mapping[str, float] = field(default_factory=_none)


@dataclass(frozen=True)
class EngineTotals:
    """Request-seconds, steps, step times and API-server saturation, per engine."""

    running_request_seconds: Mapping[str, float] = field(default_factory=_none)
    waiting_request_seconds: Mapping[str, float] = field(default_factory=_none)
    steps: Mapping[EngineMethod, float] = field(default_factory=_none)
    step_gpu_seconds: Mapping[str, float] = field(default_factory=_none)
    step_seconds: Mapping[str, HistogramValue] = field(default_factory=_none)
    api_server_saturated_seconds: Mapping[EngineServer, float] = field(default_factory=_none)
    page_refused: Mapping[EngineReason, float] = field(default_factory=_none)


MAX_ENGINE_NAMES = 64  # engines whose counters are kept: the newest Snapshot's, then those seen first
MAX_SERVERS_PER_ENGINE = 64  # API servers an engine keeps saturated-seconds series for (discovery reads 64)


def _engine_of(key: str | EngineMethod | EngineReason | EngineServer) -> str:
    return key if isinstance(key, str) else key[0]


def _bounded_servers(
    area: EngineTotals, present: Callable[[], Collection[EngineServer]], limit: int
) -> EngineTotals:
    """Return an engine area whose engines keep at most `limit` API servers' series, the present ones first.

    A server's label is its title's index, which its process sets: one re-titled each tick would
    otherwise add a series each tick for as long as its engine's name is kept.
    """
    keys = area.api_server_saturated_seconds
    if len(keys) <= limit:  # every tick's case: nothing to count
        return area
    per = Counter(k.engine for k in keys)
    if max(per.values(), default=0) <= limit:
        return area
    now = set(present())
    over = {engine: n - limit for engine, n in per.items() if n > limit}
    kept: dict[EngineServer, float] = {}
    for key, value in keys.items():
        if over.get(key.engine, 0) > 0 and key not in now:
            over[key.engine] -= 1
            continue
        kept[key] = value
    return dataclasses.replace(area, api_server_saturated_seconds=MappingProxyType(kept))


def bounded_engines(
    area: EngineTotals,
    present: Callable[[], Collection[str]],
    limit: int = MAX_ENGINE_NAMES,
    servers: Callable[[], Collection[EngineServer]] = tuple,
) -> EngineTotals:
    """Return an engine area with the series of at most `limit` engines: past it, gone engines' go, first seen first.

    Each engine's counters are kept while the daemon runs, and engines come and go under new
    names (a new port, a look-alike process started by anyone): kept for good, they would grow the
    page without end. Engines `present` names (the newest Snapshot's) always keep theirs. An engine
    that comes back after its series went starts them again from 0, which `rate()` reads as a reset.
    Each engine keeps at most MAX_SERVERS_PER_ENGINE API servers' series (`servers`: the newest
    Snapshot's, asked for only when one engine is past that).
    """
    area = _bounded_servers(area, servers, MAX_SERVERS_PER_ENGINE)
    fields = _names(EngineTotals)
    if sum(len(getattr(area, f)) for f in fields) <= limit:  # every tick's case: no more names than series
        return area
    names = dict.fromkeys(_engine_of(k) for f in fields for k in getattr(area, f))
    if len(names) <= limit:
        return area
    now = set(present())
    gone = [name for name in names if name not in now][: len(names) - limit]
    if not gone:
        return area
    drop = set(gone)
    return EngineTotals(
        *(
            MappingProxyType({k: v for k, v in getattr(area, f).items() if _engine_of(k) not in drop})
            for f in fields
        )
    )


@dataclass(frozen=True)
class VerdictTotals:
    """Time in each verdict, and host-bound time, per GPU."""

    bound_seconds: Mapping[GpuVerdict, float] = field(default_factory=_none)
    host_bound_seconds: Mapping[int, float] = field(default_factory=_none)


Area = TypeVar("Area", BusyTotals, AgentTotals, EngineTotals, VerdictTotals)


def _add_field(a: Any, b: Any) -> Any:
    """Add one field: a mapping of series (an empty one adds nothing), or one number (None adds nothing)."""
    if b is None or (not b and not isinstance(b, int | float)):
        return a
    if a is None or (not a and not isinstance(a, int | float)):
        return MappingProxyType(b) if isinstance(b, dict) else b  # frozen, as every field is
    if isinstance(a, int | float):
        return a + b
    if len(a) == len(b) and list(a) == list(b):  # the same series in the same order: every tick's case
        try:  # one hash per series, the loop in C; a histogram has no `+`, so it takes the loop below
            return MappingProxyType(dict(zip(a, map(operator.add, a.values(), b.values()), strict=True)))
        except TypeError:
            pass
    out = dict(a)
    get = out.get
    for key, value in b.items():  # a loop beats a comprehension or map() here: one hash per get and per store
        prev = get(key)  # a series' value is a number or a HistogramValue, never None
        if prev is None:
            out[key] = value
        elif type(prev) is HistogramValue:
            out[key] = prev.add(value.counts, value.total)
        else:
            out[key] = prev + value
    return MappingProxyType(out)


def _names(cls: type) -> tuple[str, ...]:
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


_FIELDS: dict[type, tuple[str, ...]] = {}


def plus(a: Area, b: Area) -> Area:
    """Return one area's totals with another's (or one tick's increments) added."""
    names = _names(type(a))
    if all(not getattr(b, n) and getattr(b, n) != 0 for n in names):
        return a  # b holds no series (an area this tick's accumulator left empty)
    return type(a)(*(_add_field(getattr(a, n), getattr(b, n)) for n in names))


@dataclass(frozen=True)
class Totals:
    """Every integrated counter and histogram, by area."""

    busy: BusyTotals = field(default_factory=BusyTotals)
    agent: AgentTotals = field(default_factory=AgentTotals)
    engine: EngineTotals = field(default_factory=EngineTotals)
    verdict: VerdictTotals = field(default_factory=VerdictTotals)

    def series(self) -> Iterator[tuple[tuple[str, object], float | HistogramValue]]:
        """Yield every series as (("area.field", key), value); a field without labels has key ()."""
        for area in dataclasses.fields(self):
            part = getattr(self, area.name)
            for f in dataclasses.fields(part):
                value = getattr(part, f.name)
                name = f"{area.name}.{f.name}"
                if isinstance(value, Mapping):
                    yield from (((name, k), v) for k, v in value.items())
                elif value is not None:
                    yield (name, ()), value

    def plus(self, other: Totals) -> Totals:
        """Return these totals with another's added, area by area."""
        if other is EMPTY or self is EMPTY:
            return self if other is EMPTY else other
        return Totals(
            plus(self.busy, other.busy),
            plus(self.agent, other.agent),
            plus(self.engine, other.engine),
            plus(self.verdict, other.verdict),
        )


class Tally(dict[K, float]):
    """One tick's counter increments for one field, built up by `count`."""

    def count(self, key: K, value: float) -> None:
        """Add value to a series; zero or negative only makes the series exist (a negative one is a bug)."""
        self[key] = self.get(key, 0.0) + (value if value > 0.0 else 0.0)  # max(0.0, value), NaN as 0


class HistogramTally(dict[K, HistogramValue]):
    """One tick's histogram observations for one field, built up by `observe`."""

    def observe(self, key: K, bounds: tuple[float, ...], counts: tuple[float, ...], total: float) -> None:
        """Add per-bucket counts (non-cumulative, +Inf last) and their sum to a series."""
        value = _histogram(bounds, tuple(map(float, counts)), float(total))
        prev = self.get(key)
        self[key] = value if prev is None else prev.add(value.counts, value.total)


EMPTY = Totals()
