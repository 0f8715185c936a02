"""Per-GPU label keys made once, and histograms made without the frozen __init__: the same values."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from exporter.snapshot.totals import GpuKeys, GpuKind, GpuSource, GpuVerdict, HistogramTally, HistogramValue


def test_a_gpus_keys_are_the_named_tuples_in_label_order_and_made_once() -> None:
    keys = GpuKeys(GpuKind, ("kernel", "memcpy"))
    first = keys(3)
    assert first == (GpuKind(3, "kernel"), GpuKind(3, "memcpy"))
    assert [type(k) for k in first] == [GpuKind, GpuKind]
    assert keys(3) is first  # shared by the next tick
    assert keys(4) == (GpuKind(4, "kernel"), GpuKind(4, "memcpy"))
    assert GpuKeys(GpuVerdict, ("idle", "gpu"))(0) == (GpuVerdict(0, "idle"), GpuVerdict(0, "gpu"))


def test_an_index_equal_to_a_kept_one_but_of_another_type_gets_its_own_keys() -> None:
    keys = GpuKeys(GpuSource, ("cupti",))
    one = keys(1)
    (flag,) = keys(True)  # equal to 1 and hashed alike, but its key reads True
    assert repr(flag) == "GpuSource(gpu=True, source='cupti')"
    assert keys(1) is one  # and it did not replace the int's
    assert repr(keys(1.0)[0]) == "GpuSource(gpu=1.0, source='cupti')"


def test_the_cache_starts_afresh_past_its_size() -> None:
    keys = GpuKeys(GpuSource, ("nvml", "gpm"), size=2)
    a = keys(0)
    keys(1)
    keys(2)  # the third GPU clears the two kept
    assert keys(0) is not a and keys(0) == a


def _fields(h: HistogramValue) -> list[tuple[str, object]]:
    return list(h.__dict__.items())


def test_a_histogram_added_or_observed_is_the_one_init_makes() -> None:
    bounds = (0.001, 0.01)
    tally = HistogramTally[int]()
    tally.observe(0, bounds, (1, 2, 3), 4)
    tally.observe(0, bounds, (0.5, 0, 1), 2.5)
    got = tally[0]
    want = HistogramValue(bounds, (1.5, 2.0, 4.0), 6.5)
    assert got == want and repr(got) == repr(want) and hash(got) == hash(want)
    assert _fields(got) == _fields(want)  # the same fields in the same order
    assert pickle.loads(pickle.dumps(got)) == want
    added = want.add((1.0, 0.0, 0.0), 1.0)
    assert _fields(added) == _fields(HistogramValue(bounds, (2.5, 2.0, 4.0), 7.5))
    with pytest.raises(dataclasses.FrozenInstanceError):
        added.total = 0.0  # type: ignore[misc]
    with pytest.raises(ValueError, match="3 buckets added 2"):
        want.add((1.0, 2.0), 1.0)
