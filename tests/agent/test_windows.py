"""The agent's numpy windows give the same figures as the stdlib reference in exporter.analysis.intervals."""

import random

import pytest

from exporter import wire
from exporter.analysis import intervals as iv

np = pytest.importorskip("numpy")
from exporter.agent import windows as aw  # noqa: E402

MS = 1_000_000
S = 1_000_000_000
NAMES = ("kernel", "memcpy", "memset", "graph", "graph_kernel")


def random_records(seed: int, n: int, t_end: int) -> list[tuple[int, int, int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        start = rng.randrange(0, t_end)
        length = rng.choice([2_240, 40_000, 700_000, 2 * MS, rng.randrange(1, 30 * MS)])
        out.append((start, start + length, rng.randrange(0, 5)))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_numpy_windows_match_the_reference(seed: int) -> None:
    records = random_records(seed, 4000, 3 * S)
    ref = iv.WindowAccumulator(window_ns=S // 2, lag_ns=S, start_ns=0)
    fast = aw.DeviceWindows(window_ns=S // 2, lag_ns=S, start_ns=0, iv_limit=10_000)
    # arrive in four shuffled batches, closing in between, like flushes
    rng = random.Random(seed)
    rng.shuffle(records)
    got_ref, got_fast = [], []
    for i, now in enumerate((S, 2 * S, 3 * S, 5 * S)):
        batch = sorted(records[i * 1000 : (i + 1) * 1000])
        batch = [r for r in batch if r[0] < now - S // 2] if i < 3 else batch
        for s, e, k in batch:
            ref.add(s, e, NAMES[k])
        if batch:
            arr = np.asarray(batch, dtype=np.int64)
            fast.add(arr[:, 0], arr[:, 1], arr[:, 2].astype(np.int8))
        got_ref += ref.close(now)
        got_fast += fast.close(now)
    assert len(got_ref) == len(got_fast) == 8
    for r, f in zip(got_ref, got_fast, strict=True):
        assert (f.t0, f.t1, f.busy_ns, f.graph_busy_ns) == (r.t0, r.t1, r.busy_ns, r.graph_busy_ns)
        assert dict(f.counts) == dict(r.counts)
        assert (f.gap_counts, f.gap_sum_ns, f.late) == (r.gap_counts, r.gap_sum_ns, r.late)
        packed, slack = wire.pack_intervals(list(r.intervals), r.t0, limit=10_000)
        assert (f.iv, f.slack_ns) == (packed, slack)


def test_numpy_packing_fills_as_much_as_the_reference_when_coarsening() -> None:
    ivs = sorted({(s, s + 3_000) for s in range(0, 400 * MS, 37_000)})
    merged = iv.merge(ivs)
    bs = np.asarray([a for a, _ in merged], dtype=np.int64)
    be = np.asarray([b for _, b in merged], dtype=np.int64)
    packed, slack = aw.pack_np(bs, be, 0, limit=600)
    ref_packed, ref_slack = wire.pack_intervals(merged, 0, limit=600)
    assert slack == ref_slack
    assert len(packed) == len(ref_packed) == 1200
    busy = sum(packed[1::2]) * 1000
    assert busy == sum(ref_packed[1::2]) * 1000


def test_pending_records_are_bounded_and_the_excess_counted() -> None:
    w = aw.DeviceWindows(window_ns=S, lag_ns=S, start_ns=0, max_pending=1000)
    for i in range(5):
        s = np.arange(i * 600, i * 600 + 600, dtype=np.int64) * 1000
        w.add(s, s + 500, np.zeros(600, dtype=np.int8))
    assert w.pending() <= 1000
    assert w.dropped == 3000 - w.pending()


def test_closing_one_window_at_a_time_gives_the_same_windows() -> None:
    records = sorted(random_records(7, 3000, 4 * S))
    arr = np.asarray(records, dtype=np.int64)
    whole = aw.DeviceWindows(window_ns=S // 2, lag_ns=S, start_ns=0)
    single = aw.DeviceWindows(window_ns=S // 2, lag_ns=S, start_ns=0)
    for w in (whole, single):
        w.add(arr[:, 0], arr[:, 1], arr[:, 2].astype(np.int8))
    all_at_once = whole.close(6 * S)
    one_by_one = []
    while closed := single.close(6 * S, max_windows=1):
        assert len(closed) == 1
        one_by_one += closed
    assert len(all_at_once) == len(one_by_one) == 10
    assert [(w.t0, w.busy_ns, w.graph_busy_ns, w.counts, w.gap_counts, w.iv) for w in one_by_one] == [
        (w.t0, w.busy_ns, w.graph_busy_ns, w.counts, w.gap_counts, w.iv) for w in all_at_once
    ]


def test_launch_gaps_between_graph_kernel_nodes_count_as_busy_and_host_gaps_do_not() -> None:
    # one replay: 760 kernel nodes of 1.5 us with 0.3 us launch gaps; then 3 ms on the host; again
    records = []
    for replay_start in (100 * MS, 100 * MS + 4 * MS):
        t = replay_start
        for _ in range(760):
            records.append((t, t + 1_500, 4))
            t += 1_800
    ref = iv.WindowAccumulator(window_ns=S // 2, lag_ns=S, start_ns=0)
    fast = aw.DeviceWindows(window_ns=S // 2, lag_ns=S, start_ns=0, iv_limit=10_000)
    for s, e, k in records:
        ref.add(s, e, NAMES[k])
    arr = np.asarray(records, dtype=np.int64)
    fast.add(arr[:, 0], arr[:, 1], arr[:, 2].astype(np.int8))
    r, f = ref.close(2 * S)[0], fast.close(2 * S)[0]
    span = 760 * 1_800 - 300  # first node's start to last node's end
    assert r.busy_ns == f.busy_ns == 2 * span
    assert r.graph_busy_ns == f.graph_busy_ns == 2 * span
    assert len(r.intervals) == 2  # the host gap between the replays stays idle
    # eager kernels with the same 0.3 us gaps are not bridged: they are not one device-side launch
    eager = aw.DeviceWindows(window_ns=S // 2, lag_ns=S, start_ns=0)
    eager.add(arr[:, 0], arr[:, 1], np.zeros(len(records), dtype=np.int8))
    assert eager.close(2 * S)[0].busy_ns == 2 * 760 * 1_500
