"""A CUPTI window that lost records gives no busy figure: GPM stands in, and the counters skip it."""

from exporter.analysis import activity
from exporter.analysis.pipeline import advance, pick_busy
from exporter.config import Config
from exporter.snapshot import Snapshot
from exporter.snapshot.agent import AgentReading, GpuActivity
from exporter.snapshot.gpu import GpmRatios, GpuReading
from exporter.snapshot.totals import GpuSource

HALF = 500_000_000


def _snap(seq: int, kept: int, dropped: int) -> Snapshot:
    act = GpuActivity(
        gpu=0,
        uuid="GPU-a",
        observed_ns=HALF,
        busy_ns=HALF // 10,  # 10% busy: what a window that kept a fifth of its records reads
        kernels=kept,
        dropped=dropped,
        last_window_busy_ns=HALF // 10,
        last_window_ns=HALF,
    )
    gpu = GpuReading(
        index=0, uuid="GPU-a", name="H200", driver="580", utilization=1.0, gpm=GpmRatios(graphics=0.97)
    )
    return Snapshot(
        seq=seq,
        at=float(seq),
        mono=float(seq) / 2,
        interval=0.5,
        dt=0.5 if seq else 0.0,
        gpus=(gpu,),
        agent=AgentReading(activity=(act,)),
    )


def test_a_window_that_lost_most_records_gives_way_to_gpm() -> None:
    assert pick_busy(_snap(1, kept=206_000, dropped=746_000))[0] == (0.97, "gpm")
    assert pick_busy(_snap(1, kept=240_000, dropped=0))[0] == (0.1, "cupti")


def test_lossy_windows_add_no_cupti_busy_time_but_their_drops_are_counted() -> None:
    cfg = Config()
    history: list[Snapshot] = []
    for seq, dropped in enumerate((0, 746_000, 0)):
        history.append(advance(history, _snap(seq, kept=206_000, dropped=dropped), cfg))
    busy = history[-1].totals.busy
    observed = busy.observed_seconds[GpuSource(0, "cupti")]
    assert observed == 2 * HALF * 1e-9  # the lossy window's half second is not in it
    assert busy.dropped_records[0] == 746_000
    assert activity.lossy(history[1].agent.activity[0])  # type: ignore[union-attr]


def _by_count(snap: Snapshot) -> dict[str, object]:
    """The record and verdict counters as `Tally.count` with new keys made them (the code before per-GPU keys)."""
    from exporter.snapshot.totals import GpuKind, GpuVerdict, Tally
    from exporter.snapshot.verdict import VERDICTS

    records, bound = Tally[GpuKind](), Tally[GpuVerdict]()
    for a in snap.agent.activity if snap.agent is not None else ():
        if a.observed_ns > 0:
            for kind, attr in activity.KINDS:
                records.count(GpuKind(a.gpu, kind), getattr(a, attr))
    for v in snap.verdicts:
        for name in VERDICTS:
            bound.count(GpuVerdict(v.gpu, name), snap.dt if name == v.verdict else 0.0)
    return {"records": records, "bound": bound}


def test_the_per_gpu_keys_count_what_new_keys_counted_in_the_same_order() -> None:
    from exporter.analysis import verdict

    cfg = Config()
    history: list[Snapshot] = []
    for seq, (kept, dropped) in enumerate(((0, 0), (206_000, 746_000), (5, 0), (-3, 2))):
        history.append(advance(history, _snap(seq, kept=kept, dropped=dropped), cfg))
        snap = history[-1]
        want = _by_count(snap)
        records = activity.accumulate(snap, cfg).busy.activity_records
        assert list(records.items()) == list(want["records"].items())  # type: ignore[attr-defined]
        assert all(type(v) is float for v in records.values())
        if snap.dt > 0:
            bound = verdict.accumulate(snap, cfg).verdict.bound_seconds
            assert list(bound.items()) == list(want["bound"].items())  # type: ignore[attr-defined]
            assert sum(bound.values()) == 0.5
    assert history[-1].totals.busy.activity_records[activity.KIND_KEYS(0)[0]] == 206_000 + 5
