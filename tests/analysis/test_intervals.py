"""Interval union, windows with carry-over and late records, idle-gap histograms, cross-process unions."""

from exporter.analysis import intervals as iv

MS = 1_000_000
S = 1_000_000_000


def test_merge_unions_overlapping_and_touching_intervals() -> None:
    assert iv.merge([(5, 9), (0, 3), (2, 4), (9, 12), (20, 20), (15, 18)]) == [(0, 4), (5, 12), (15, 18)]


def test_gaps_count_only_idle_stretches_over_1ms() -> None:
    merged = [(0, 10 * MS), (10 * MS + 500_000, 20 * MS), (23 * MS, 30 * MS)]
    found, last = iv.gaps(merged, None)
    assert found == [3 * MS]
    assert last == 30 * MS


def test_gap_histogram_puts_each_gap_in_its_le_bucket() -> None:
    counts, total = iv.gap_histogram([1_500_000, 2 * MS, 19 * MS, 3 * S])
    assert counts == (0, 2, 0, 0, 1, 0, 0, 0, 0, 0, 1)
    assert total == 1_500_000 + 2 * MS + 19 * MS + 3 * S


def seed_decode_window(acc: iv.WindowAccumulator, t0: int, steps: int = 139) -> None:
    """The seed's host-bound decode: 72 ms steps of which 19.4 ms run on the GPU, over 10 s."""
    for i in range(steps):
        start = t0 + i * 72 * MS
        acc.add(start, start + 19_400_000, "graph")


def test_seed_host_bound_decode_reads_27_percent_busy_and_gaps_over_1ms() -> None:
    acc = iv.WindowAccumulator(window_ns=10 * S, lag_ns=1 * S, start_ns=0)
    seed_decode_window(acc, 0)
    (w,) = acc.close(now=11 * S)
    assert round(w.busy_ns / (w.t1 - w.t0), 2) == 0.27
    assert w.graph_busy_ns == w.busy_ns
    # 138 gaps of 52.6 ms between steps (the first step starts at 0: no gap before it)
    assert sum(w.gap_counts) == 138
    assert w.gap_counts[6] == 138  # le 0.1 s
    assert abs(w.gap_sum_ns - 138 * 52_600_000) < 1000


def test_window_closes_only_after_the_flush_lag() -> None:
    acc = iv.WindowAccumulator(window_ns=S // 2, lag_ns=S, start_ns=0)
    acc.add(100 * MS, 200 * MS, "kernel")
    assert acc.close(now=S) == []  # [0, 0.5 s) ended 0.5 s ago: records may still come
    (w,) = acc.close(now=S + S // 2)
    assert (w.t0, w.t1, w.busy_ns) == (0, S // 2, 100 * MS)
    assert w.count("kernel") == 1


def test_interval_crossing_a_window_edge_counts_in_both_windows() -> None:
    acc = iv.WindowAccumulator(window_ns=S // 2, lag_ns=0, start_ns=0)
    acc.add(400 * MS, 700 * MS, "memcpy")
    first, second = acc.close(now=S)
    assert first.busy_ns == 100 * MS and second.busy_ns == 200 * MS
    assert first.count("memcpy") == 1 and second.count("memcpy") == 0  # counted where it starts


def test_gap_spanning_windows_is_counted_once_where_it_ends() -> None:
    acc = iv.WindowAccumulator(window_ns=S // 2, lag_ns=0, start_ns=0)
    acc.add(0, 10 * MS, "kernel")
    acc.add(1200 * MS, 1210 * MS, "kernel")
    w = acc.close(now=3 * S // 2)
    assert [sum(x.gap_counts) for x in w] == [0, 0, 1]
    assert w[2].gap_sum_ns == 1190 * MS
    assert w[2].gap_counts[-1] == 1  # 1.19 s: over the last bound, +Inf


def test_record_for_a_closed_window_counts_as_late() -> None:
    acc = iv.WindowAccumulator(window_ns=S // 2, lag_ns=0, start_ns=0)
    acc.close(now=S // 2)
    acc.add(100 * MS, 200 * MS, "kernel")
    acc.add(450 * MS, 600 * MS, "kernel")  # partly in the open window: that part counts
    (w,) = acc.close(now=S)
    assert w.late == 1
    assert w.busy_ns == 100 * MS


def test_graph_kernel_nodes_add_to_graph_busy_and_count_as_kernels() -> None:
    acc = iv.WindowAccumulator(window_ns=S, lag_ns=0, start_ns=0)
    acc.add(0, 2 * MS, "graph_kernel")
    acc.add(1 * MS, 3 * MS, "kernel")
    (w,) = acc.close(now=S)
    assert (w.busy_ns, w.graph_busy_ns, w.count("kernel")) == (3 * MS, 2 * MS, 2)


def test_two_processes_on_one_gpu_union_instead_of_adding() -> None:
    a = iv.ProcessWindow(busy_ns=300 * MS, intervals=((0, 300 * MS),))
    b = iv.ProcessWindow(busy_ns=200 * MS, intervals=((200 * MS, 400 * MS),))
    busy, merged = iv.union_busy([a, b], span_ns=500 * MS)
    assert busy == 400 * MS
    assert merged == [(0, 400 * MS)]


def test_coarsened_union_stays_within_the_exact_bounds() -> None:
    # each process filled 40 ms of idle time to fit its list: the union cannot be below the busiest
    a = iv.ProcessWindow(busy_ns=260 * MS, intervals=((0, 300 * MS),), slack_ns=40 * MS)
    b = iv.ProcessWindow(busy_ns=10 * MS, intervals=((100 * MS, 150 * MS),), slack_ns=40 * MS)
    busy, _ = iv.union_busy([a, b], span_ns=500 * MS)
    assert busy == 260 * MS


def test_single_process_union_is_its_own_busy_time() -> None:
    busy, _ = iv.union_busy(
        [iv.ProcessWindow(busy_ns=135 * MS, intervals=((0, 140 * MS),), slack_ns=5 * MS)], 500 * MS
    )
    assert busy == 135 * MS
