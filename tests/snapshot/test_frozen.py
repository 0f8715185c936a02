"""The Snapshot's `replace`: the copy dataclasses.replace makes, without running __init__ again."""

from __future__ import annotations

import dataclasses

import pytest

from exporter.snapshot import EngineReading, GpuReading, Snapshot
from exporter.snapshot.frozen import _plain, replace
from exporter.snapshot.verdict import Verdict


def test_a_copy_is_the_one_dataclasses_replace_makes_and_stays_frozen() -> None:
    e = EngineReading("vllm:8000", "vllm", running=3.0, pids=(1, 2))
    got, want = replace(e, running=4.0, waiting=1.0), dataclasses.replace(e, running=4.0, waiting=1.0)
    assert got == want and repr(got) == repr(want) and list(vars(got)) == list(vars(want))
    assert e.running == 3.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.running = 1.0  # type: ignore[misc]


def test_a_snapshots_gpu_index_is_not_carried_to_its_copy() -> None:
    gpus = tuple(GpuReading(i, f"GPU-{i}", "H200", "580") for i in range(9))
    snap = Snapshot(seq=1, at=0.0, mono=0.0, interval=0.5, dt=0.0, gpus=gpus)
    assert snap.gpu(8) is gpus[8]  # builds the index in the Snapshot's __dict__
    copy = replace(snap, gpus=gpus[:1])
    assert copy.gpu(8) is None and copy == dataclasses.replace(snap, gpus=gpus[:1])
    assert list(vars(copy)) == [f.name for f in dataclasses.fields(Snapshot)]


def test_slotted_or_unknown_fields_go_to_dataclasses_replace() -> None:
    g = GpuReading(0, "GPU-0", "H200", "580")
    assert _plain(GpuReading) is None and replace(g, index=1) == dataclasses.replace(g, index=1)
    v = Verdict(0, "gpu")
    assert replace(v, verdict="host") == dataclasses.replace(v, verdict="host")
    with pytest.raises(TypeError):
        replace(EngineReading("x", "vllm"), no_such_field=1)
