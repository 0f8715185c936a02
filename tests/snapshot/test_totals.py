"""Typed totals: adding a tick's increments, series that exist at zero, frozen results."""

from __future__ import annotations

import math
from types import MappingProxyType

import pytest

from exporter.snapshot.totals import (
    EMPTY,
    AgentTotals,
    BusyTotals,
    EngineTotals,
    GpuSource,
    HistogramTally,
    HistogramValue,
    Tally,
    Totals,
    VerdictTotals,
)


def test_a_tally_creates_a_series_at_zero_and_never_counts_down_or_nan() -> None:
    t = Tally[int]()
    t.count(0, 0.0)
    t.count(1, 2.5)
    t.count(1, -4.0)  # a negative increment is a bug: the series stays where it was
    t.count(2, math.nan)
    assert t == {0: 0.0, 1: 2.5, 2: 0.0}


def test_plus_adds_series_by_key_and_keeps_both_sides_series() -> None:
    a = Totals(busy=BusyTotals(busy_seconds=MappingProxyType({GpuSource(0, "gpm"): 1.0})))
    inc = Tally[GpuSource]()
    inc.count(GpuSource(0, "gpm"), 0.25)
    inc.count(GpuSource(1, "nvml"), 0.0)
    total = a.plus(Totals(busy=BusyTotals(busy_seconds=inc)))
    assert total.busy.busy_seconds == {GpuSource(0, "gpm"): 1.25, GpuSource(1, "nvml"): 0.0}
    assert a.busy.busy_seconds == {GpuSource(0, "gpm"): 1.0}  # the old totals are untouched
    with pytest.raises(TypeError):
        total.busy.busy_seconds[GpuSource(2, "gpm")] = 1.0  # type: ignore[index]


def test_a_field_taken_whole_from_an_increment_is_frozen_too() -> None:
    inc = Tally[int]()
    inc.count(0, 0.5)
    total = EMPTY.plus(Totals(verdict=VerdictTotals(host_bound_seconds=inc))).plus(EMPTY)
    total = Totals(busy=BusyTotals(busy_seconds=MappingProxyType({GpuSource(0, "nvml"): 1.0}))).plus(total)
    assert total.verdict.host_bound_seconds == {0: 0.5}
    # read-only, as every field of the totals (a view: a tick's tally is not written after)
    with pytest.raises(TypeError):
        total.verdict.host_bound_seconds[0] = 1.0  # type: ignore[index]


def test_a_counter_without_labels_exists_once_an_increment_of_zero_arrives() -> None:
    assert Totals().plus(Totals()).agent.messages is None
    first = Totals().plus(Totals(agent=AgentTotals(messages=0.0)))
    assert first.agent.messages == 0.0
    assert first.plus(Totals(agent=AgentTotals(messages=3.0))).agent.messages == 3.0


def test_histograms_add_bucket_by_bucket() -> None:
    h = HistogramTally[str]()
    h.observe("vllm", (0.01, 0.1), (1, 2, 0), 0.05)
    h.observe("vllm", (0.01, 0.1), (0, 1, 1), 0.5)
    total = Totals(engine=EngineTotals(step_seconds=h))
    total = total.plus(total)
    assert total.engine.step_seconds["vllm"] == HistogramValue((0.01, 0.1), (2.0, 6.0, 2.0), 1.1)


def test_series_lists_every_field_by_area() -> None:
    total = Totals(
        busy=BusyTotals(graph_busy_seconds=MappingProxyType({3: 1.5})), agent=AgentTotals(messages=2.0)
    )
    assert dict(total.series()) == {("busy.graph_busy_seconds", 3): 1.5, ("agent.messages", ()): 2.0}


def test_an_increment_of_known_series_adds_like_one_of_new_series() -> None:
    known = MappingProxyType({GpuSource(0, "gpm"): 1.0, GpuSource(1, "gpm"): 2})
    inc = {GpuSource(1, "gpm"): 0.5, GpuSource(0, "gpm"): 3}  # every series known: the fast path
    mixed = {**inc, GpuSource(2, "nvml"): 0.0}  # one new series: the general path
    fast = Totals(busy=BusyTotals(busy_seconds=known)).plus(Totals(busy=BusyTotals(busy_seconds=inc)))
    slow = Totals(busy=BusyTotals(busy_seconds=known)).plus(Totals(busy=BusyTotals(busy_seconds=mixed)))
    assert list(fast.busy.busy_seconds.items()) == [(GpuSource(0, "gpm"), 4.0), (GpuSource(1, "gpm"), 2.5)]
    assert list(slow.busy.busy_seconds.items())[:2] == list(fast.busy.busy_seconds.items())
    assert isinstance(fast.busy.busy_seconds, MappingProxyType)


def test_histograms_of_different_bucket_counts_do_not_add() -> None:
    with pytest.raises(ValueError):
        HistogramValue((1.0,), (1.0, 2.0)).add((1.0,), 1.0)


def test_the_same_series_in_the_same_order_add_as_series_by_key_do() -> None:
    keys = [GpuSource(g, s) for g in range(3) for s in ("gpm", "nvml")]
    known = MappingProxyType({k: 1.0 + i for i, k in enumerate(keys)})
    inc = {k: 0.25 * i for i, k in enumerate(keys)}  # the same keys, the same order: added in one pass
    shuffled = dict(reversed(list(inc.items())))  # the same keys in another order: added key by key
    same = Totals(busy=BusyTotals(busy_seconds=known)).plus(Totals(busy=BusyTotals(busy_seconds=inc)))
    other = Totals(busy=BusyTotals(busy_seconds=known)).plus(Totals(busy=BusyTotals(busy_seconds=shuffled)))
    assert list(same.busy.busy_seconds.items()) == list(other.busy.busy_seconds.items())
    assert list(same.busy.busy_seconds) == keys and isinstance(same.busy.busy_seconds, MappingProxyType)
    h = HistogramValue((0.01,), (1.0, 2.0), 0.5)
    hist = Totals(engine=EngineTotals(step_seconds=MappingProxyType({"vllm": h})))
    assert hist.plus(hist).engine.step_seconds["vllm"] == HistogramValue((0.01,), (2.0, 4.0), 1.0)
