"""The benches' agent stand-in sends what a real agent sends: aligned, consecutive windows the feed takes."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from bench.sidecar_cost import LAG_NS, MAX_CATCH_UP, WINDOW_NS, agent_windows
from exporter import wire
from exporter.config import AgentFeedConfig
from exporter.sources.agent_feed import AgentFeed

ROOT = Path(__file__).resolve().parent.parent


def test_windows_are_aligned_consecutive_and_one_lag_old() -> None:
    """Each window lies on the 0.5 s grid, starts where the previous ended and closes LAG_NS after its end."""
    start = 1_700_000_000_123_456_789
    next_t0 = start - start % WINDOW_NS
    seen: list[tuple[int, int]] = []
    for now in range(start, start + 20 * 10**9, 370_000_000):  # polled off the grid, as a sleep loop is
        due, next_t0 = agent_windows(next_t0, now)
        assert all(t1 <= now - LAG_NS for _, t1 in due)
        seen += due
    assert len(seen) >= 36
    assert all(t0 % WINDOW_NS == 0 and t1 - t0 == WINDOW_NS for t0, t1 in seen)
    assert all(b[0] == a[1] for a, b in itertools.pairwise(seen))


def test_a_stall_sends_the_backlog_once_then_skips_what_is_too_old() -> None:
    """After a stall the backlog goes out at most MAX_CATCH_UP windows at once, never a window twice."""
    t = 1_700_000_000_000_000_000
    due, nxt = agent_windows(t, t + LAG_NS + 3 * WINDOW_NS)
    assert due == [(t + k * WINDOW_NS, t + (k + 1) * WINDOW_NS) for k in range(3)]
    assert nxt == t + 3 * WINDOW_NS
    late = nxt + LAG_NS + 100 * WINDOW_NS
    due, nxt2 = agent_windows(nxt, late)
    assert len(due) == MAX_CATCH_UP and due[0][0] > nxt and due[-1][1] == nxt2 == late - LAG_NS
    assert agent_windows(nxt2, late) == ([], nxt2)


def test_the_standin_over_a_real_socket_is_never_refused(tmp_path: Path) -> None:
    """Four stand-in agents' datagrams for 3 s: the real feed refuses none, and they count as sent."""
    path = str(tmp_path / "agent.sock")
    count = str(tmp_path / "sent.json")
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(path)
    rx.settimeout(0.2)
    feed = AgentFeed(AgentFeedConfig())
    code = f"from bench.sidecar_cost import part_agent; part_agent({path!r}, 4, {count!r})"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    agent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env)
    windows: dict[int, list[tuple[int, int]]] = {}
    readings = []
    try:
        end = time.monotonic() + 3.5
        while time.monotonic() < end:
            try:
                data = rx.recv(wire.MAX_DATAGRAM_BYTES)
            except TimeoutError:
                continue
            msg = wire.decode(data)
            windows.setdefault(msg.pid, []).extend((w.t0, w.t1) for w in msg.windows)
            feed.receive(data)
            readings.append(feed.collect())
    finally:
        agent.kill()
        agent.wait()
        rx.close()
    assert sorted(windows) == [10_000, 10_001, 10_002, 10_003]
    for got in windows.values():
        assert len(got) >= 4
        assert all(b[0] == a[1] for a, b in itertools.pairwise(got))
    assert sum(r.messages for r in readings) == len(readings) >= 16
    assert sum(r.bad_messages for r in readings) == 0
    assert [(reason, n) for r in readings for reason, n in r.refused if n] == []
    merged = {g.gpu for r in readings for g in r.windows if g.windows}
    assert merged == {0, 1, 2, 3}
    assert set(json.loads(Path(count).read_text())) == {"datagrams", "windows", "send_errors"}
