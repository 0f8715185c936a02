"""The agent's own thread path on synthetic raw CUPTI buffers: decode, windows, sampling spans, datagrams."""

import os
import socket
import struct
from pathlib import Path

import pytest

from exporter import wire

pytest.importorskip("numpy")
from exporter.agent import cuptilib as cl
from exporter.agent.core import Agent, Settings

MS = 1_000_000
T0 = 1_764_400_000_000_000_000


def kernel(start: int, end: int, dev: int = 0, graph_id: int = 0) -> bytes:
    buf = bytearray(cl.RECORD_SIZE[cl.KIND_CONCURRENT_KERNEL])
    struct.pack_into("<I", buf, 0, cl.KIND_CONCURRENT_KERNEL)
    struct.pack_into("<QQ", buf, 16, start, end)
    struct.pack_into("<I", buf, 40, dev)
    struct.pack_into("<I", buf, 156, graph_id)
    return bytes(buf)


def graph(start: int, end: int, dev: int = 0) -> bytes:
    buf = bytearray(cl.RECORD_SIZE[cl.KIND_GRAPH_TRACE])
    struct.pack_into("<I", buf, 0, cl.KIND_GRAPH_TRACE)
    struct.pack_into("<QQI", buf, 8, start, end, dev)
    return bytes(buf)


UUID0 = "GPU-6f5e2c1a-0b7d-4c39-9d0e-2f1a3b4c5d6e"


def make_agent(tmp_path: Path, spans=None, trim_ns: int = 0) -> tuple[Agent, socket.socket]:  # type: ignore[no-untyped-def]
    path = str(tmp_path / "agent.sock")
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(path)
    rx.settimeout(1.0)
    a = Agent(Settings(socket=path, sampling="off", kernel_trim_ns=trim_ns))
    a.run_offline(T0, spans=spans, uuids={0: UUID0, 1: "GPU-00000000-0000-0000-0000-000000000001"})
    return a, rx


def test_raw_buffers_become_windows_on_the_wire(tmp_path: Path) -> None:
    a, rx = make_agent(tmp_path)
    # window 1 ([T0 + 0.5 s, T0 + 1 s)): the seed's decode, 72 ms steps with 19 ms of graph + 0.4 ms eager
    buf = b""
    for i in range(7):
        s = T0 + 500 * MS + i * 72 * MS
        buf += graph(s, s + 19 * MS) + kernel(s + 19 * MS, s + 19 * MS + 400_000)
    a.feed_raw(buf)
    a.send_windows(a.close_windows(T0 + 2 * 1000 * MS + 1))
    windows = []
    while True:
        try:
            windows += wire.decode(rx.recv(wire.MAX_DATAGRAM_BYTES)).windows
        except TimeoutError:
            break
    rx.close()
    # the steps fall in the second window; the first is empty
    (w,) = [w for w in windows if w.t0 == T0 + 500 * MS]
    assert (w.kernels, w.graphs) == (7, 7)
    assert w.busy == 7 * 19_400_000 and w.graph_busy == 7 * 19 * MS
    assert round(w.busy / (w.t1 - w.t0), 2) == 0.27
    assert sum(w.gaps) == 6 and w.gaps[6] == 6  # 52.6 ms gaps between steps: le 0.1 s


def test_kernel_trim_shortens_only_kernel_records(tmp_path: Path) -> None:
    a, rx = make_agent(tmp_path, trim_ns=680)
    buf = b"".join(
        kernel(T0 + 500 * MS + i * 10_000, T0 + 500 * MS + i * 10_000 + 2_920) for i in range(1000)
    )
    buf += graph(T0 + 600 * MS, T0 + 602 * MS)
    a.feed_raw(buf)
    (w,) = [w for w in a.close_windows(T0 + 2000 * MS) if w.t0 == T0 + 500 * MS]
    rx.close()
    assert w.busy == 1000 * 2_240 + 2 * MS


def test_windows_outside_collection_spans_are_not_reported(tmp_path: Path) -> None:
    a, rx = make_agent(
        tmp_path, spans=[(T0, T0 + 700 * MS), (T0 + 1600 * MS, None)]
    )  # off from 0.7 s to 1.6 s
    buf = b"".join(kernel(T0 + k * 100 * MS, T0 + k * 100 * MS + MS) for k in range(30))
    a.feed_raw(buf)
    got = [(w.t0 - T0) // MS for w in a.close_windows(T0 + 4000 * MS)]
    rx.close()
    assert got == [0, 2000, 2500]  # [0.5, 1.0) and [1.0, 1.5) and [1.5, 2.0) fall in the pause


def test_buffers_of_two_devices_decode_in_one_batch(tmp_path: Path) -> None:
    a, rx = make_agent(tmp_path)
    b0 = b"".join(kernel(T0 + 500 * MS + i * MS, T0 + 500 * MS + i * MS + 250_000, dev=0) for i in range(100))
    b1 = b"".join(kernel(T0 + 500 * MS + i * MS, T0 + 500 * MS + i * MS + 500_000, dev=1) for i in range(100))
    mixed = graph(T0 + 700 * MS, T0 + 710 * MS, dev=1) + kernel(T0 + 800 * MS, T0 + 801 * MS, dev=0)
    a.feed_raw(b0, b1, mixed)
    got = {w.dev: w for w in a.close_windows(T0 + 2000 * MS) if w.t0 == T0 + 500 * MS}
    rx.close()
    assert got[0].busy == 100 * 250_000 + MS and got[0].kernels == 101
    assert got[1].busy == 100 * 500_000 + 10 * MS
    assert got[1].graphs == 1 and got[1].graph_busy == 10 * MS


def test_objects_mode_rows_reach_the_same_windows(tmp_path: Path) -> None:
    a, rx = make_agent(tmp_path)
    rows = [
        (0, 0, T0 + 500 * MS, T0 + 519 * MS),
        (3, 0, T0 + 600 * MS, T0 + 619 * MS),
        (1, 0, T0 + 700 * MS, 0),
    ]
    a.feed_rows(rows)
    (w,) = [w for w in a.close_windows(T0 + 2000 * MS) if w.t0 == T0 + 500 * MS]
    rx.close()
    assert (w.busy, w.graph_busy, w.kernels, w.graphs) == (38 * MS, 19 * MS, 1, 1)
    assert a.stats.incomplete == 1


class ForeignClockLibrary:
    """Stands in for libcupti after kineto registered its own timestamp callback (a monotonic clock)."""

    def __init__(self) -> None:
        import time

        self.shift = time.time_ns() - time.monotonic_ns()

    def timestamp(self) -> int:
        import time

        return time.time_ns() - self.shift


def test_records_on_a_foreign_cupti_clock_are_moved_back_to_the_wall_clock(tmp_path: Path) -> None:
    import time

    a, rx = make_agent(tmp_path)
    lib = ForeignClockLibrary()
    a._lib = lib  # type: ignore[assignment]
    now = a._now()
    assert abs(now - time.time_ns()) < 50 * MS
    assert abs(a._ts_offset - lib.shift) < 50 * MS
    t = lib.timestamp()  # a kernel stamped on the foreign clock
    buf = kernel(t, t + 2 * MS)
    a.feed_raw(buf)
    w = a._windows[0]
    assert w.pending() == 1 and w._late == 0  # not thrown away as decades late
    rx.close()


class FakeCupti:
    """Stands in for cupti-python (the outside party): records what the agent asks of it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def activity_disable(self, kind: int) -> None:
        self.calls.append(("disable", kind))

    def finalize(self) -> None:
        self.calls.append(("finalize", 0))


def test_stop_disables_every_kind_and_never_finalizes_cupti(tmp_path: Path) -> None:
    import threading

    a, rx = make_agent(tmp_path)
    fake = FakeCupti()
    a._cupti = fake
    a._enabled = [cl.KIND_GRAPH_TRACE, cl.KIND_CONCURRENT_KERNEL, cl.KIND_MEMCPY]
    a._thread = threading.Thread(target=lambda: None)
    a._thread.start()
    a.stop()
    assert fake.calls == [
        ("disable", cl.KIND_GRAPH_TRACE),
        ("disable", cl.KIND_CONCURRENT_KERNEL),
        ("disable", cl.KIND_MEMCPY),
    ]
    assert a.state == "stopped"
    rx.close()


def test_kineto_teardown_guard_keeps_cupti_alive_and_says_what_it_replaced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from exporter.agent.core import guard_kineto_teardown

    monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)
    assert guard_kineto_teardown() is None
    assert os.environ["TEARDOWN_CUPTI"] == "0"
    monkeypatch.setenv("TEARDOWN_CUPTI", "1")
    assert guard_kineto_teardown() == "1"
    assert os.environ["TEARDOWN_CUPTI"] == "0"
    assert guard_kineto_teardown() is None


def test_cupti_attributes_and_hw_trace_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BOUNDWATCH_AGENT_CUPTI_ATTRS", "device_buffer_size=8m")
    monkeypatch.setenv("BOUNDWATCH_AGENT_HW_TRACE", "on")
    s = Settings.from_env()
    assert s.cupti_attrs == "device_buffer_size=8m" and s.hw_trace == "on"
    assert Settings().cupti_attrs == "" and Settings().hw_trace == "off"


@pytest.mark.parametrize("lag_max_s", [3.0, 1.0])
def test_windows_wait_for_records_that_arrive_late(tmp_path: Path, lag_max_s: float) -> None:
    """Records arriving over a second after they ended (CUPTI at ~500k kernel records a second):
    windows wait up to lag_max_s for them instead of counting the stragglers late."""
    import time

    from exporter.analysis.intervals import window_start

    path = str(tmp_path / "agent.sock")
    a = Agent(Settings(socket=path, sampling="off", kernel_trim_ns=0, lag_s=1.0, lag_max_s=lag_max_s))
    now = time.time_ns()
    w0 = window_start(now - 2_400 * MS, 500 * MS)  # a window that ended 1.9-2.4 s ago
    a.run_offline(w0 - 1_000 * MS, uuids={0: UUID0})
    a.feed_raw(kernel(w0 + 300 * MS, w0 + 310 * MS, graph_id=1))  # 2.1-2.6 s old when it arrives
    early = a.close_windows(time.time_ns(), hold=True)  # the agent's tick
    a.feed_raw(kernel(w0 + 100 * MS, w0 + 110 * MS, graph_id=1))  # a straggler of the same window
    rest = a.close_windows(time.time_ns() + 10_000 * MS)
    (w,) = [w for w in early + rest if w.t0 == w0]
    if lag_max_s > 1.0:
        assert w in rest and (w.kernels, w.dropped, w.busy) == (2, 0, 20 * MS)
        assert a.stats.delivery_lag_ns_max >= 2_000 * MS
    else:  # no waiting beyond lag_s: the window closed without the straggler, counted late
        assert w in early and (w.kernels, w.busy) == (1, 10 * MS)
        assert sum(x.dropped for x in rest) == 1
