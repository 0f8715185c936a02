"""The sidecar's agent feed on a real unix datagram socket: raw windows handed out when ready, through the union, states."""

import dataclasses
import json
import os
import socket
import time
from pathlib import Path

import pytest

from exporter import wire
from exporter.analysis.agent_union import merge
from exporter.config import AgentFeedConfig
from exporter.snapshot.agent import AgentReading, AgentState, AgentWindow
from exporter.sources import agent_feed
from exporter.sources.agent_feed import AgentFeed
from tests.fakes.clock import Clock
from tests.fakes.wait import wait_until, wait_until_async

MS = 1_000_000
T0 = 1_764_400_000_000_000_000  # aligned to 0.5 s
UUID = "GPU-6f5e2c1a-0b7d-4c39-9d0e-2f1a3b4c5d6e"
RECEIVED = T0 + 2_000_000_000  # the receive time at the clock's start: a little after the first window closed


def window(t0: int, busy_ivs: list[tuple[int, int]], **kw: object) -> wire.Window:
    packed, slack = wire.pack_intervals(busy_ivs, t0)
    busy = sum(e - s for s, e in busy_ivs)
    return wire.Window(dev=0, t0=t0, t1=t0 + 500 * MS, busy=busy, iv=packed, slack=slack, **kw)  # type: ignore[arg-type]


def raw(reading: AgentReading) -> list[AgentWindow]:
    """Return every raw window a reading hands out."""
    return [w for g in reading.windows for w in g.windows]


def message(pid: int, windows: tuple[wire.Window, ...] = (), state: str = "running", **kw: object) -> bytes:
    msg = wire.Message(pid=pid, state=state, devices=((0, UUID),), windows=windows, **kw)  # type: ignore[arg-type]
    return wire.encode(msg)


@pytest.fixture(autouse=True)
def blocking_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader stays blocking (each datagram in the inbox as it comes) unless a test paces it."""
    monkeypatch.setattr(agent_feed, "PACED_AFTER", 10**9)


@pytest.fixture
async def feed(tmp_path: Path):  # type: ignore[no-untyped-def]
    clock = Clock(wall_ns=RECEIVED)
    f = AgentFeed(
        AgentFeedConfig(socket=str(tmp_path / "run" / "agent.sock"), stale_seconds=5.0),
        clock=clock,
        wall_ns=clock.wall_ns,
    )
    await f.start()
    f.test_clock = clock  # type: ignore[attr-defined]
    yield f
    f.close()


async def send(feed: AgentFeed, *datagrams: bytes) -> None:
    """Send datagrams to the feed's socket and return once the feed has taken them all."""
    before = feed._arrived
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        for d in datagrams:
            s.sendto(d, feed.cfg.socket)
    await wait_until_async(
        lambda: feed._arrived >= before + len(datagrams), what=f"{len(datagrams)} datagrams"
    )


async def test_one_agent_window_reaches_the_reading(feed: AgentFeed) -> None:
    w = window(
        T0,
        [(T0 + 10 * MS, T0 + 145 * MS)],
        kernels=410,
        graphs=22,
        graph_busy=90 * MS,
        gaps=(0,) * 6 + (2,) + (0,) * 4,
        gap_sum=170 * MS,
    )
    await send(feed, message(4242, (w,)))
    reading = await feed.read()
    (g,) = reading.windows
    assert (g.gpu, g.uuid, g.running) == (0, UUID, 1)
    (got,) = g.windows
    assert (got.pid, got.t0, got.busy_ns, got.iv, got.gap_counts) == (4242, T0, 135 * MS, w.iv, w.gaps)
    (a,) = merge(reading, None).activity
    assert (a.uuid, a.gpu, a.observed_ns, a.busy_ns) == (UUID, 0, 500 * MS, 135 * MS)
    assert (a.kernels, a.graphs, a.graph_busy_ns, a.idle_gap_counts[6]) == (410, 22, 90 * MS, 2)
    assert a.last_window_busy_ns / a.last_window_ns == pytest.approx(0.27)
    assert reading.messages == 1 and reading.bad_messages == 0
    (agent,) = reading.agents
    assert (agent.pid, agent.state, agent.uuid) == (4242, "running", UUID)


async def test_two_processes_on_one_gpu_are_unioned(feed: AgentFeed) -> None:
    a = window(T0, [(T0, T0 + 300 * MS)])
    b = window(T0, [(T0 + 200 * MS, T0 + 400 * MS)])
    await send(feed, message(1, ()), message(2, ()))  # both known before their windows
    await feed.read()
    await send(feed, message(1, (a,)))
    assert raw(await feed.read()) == []  # waits for the other process on this GPU
    await send(feed, message(2, (b,)))
    reading = await feed.read()
    assert sorted(w.pid for w in raw(reading)) == [1, 2]
    (act,) = merge(reading, None).activity
    assert act.busy_ns == 400 * MS  # not 500: the overlap counts once
    assert act.processes == 2


async def test_a_window_missing_from_one_process_is_merged_after_the_wait(feed: AgentFeed) -> None:
    await send(feed, message(1), message(2))
    await feed.read()
    await send(feed, message(1, (window(T0, [(T0, T0 + 100 * MS)]),)))
    assert raw(await feed.read()) == []
    feed.test_clock.t += 1.5  # type: ignore[attr-defined]
    (act,) = merge(await feed.read(), None).activity
    assert act.busy_ns == 100 * MS


async def test_bad_datagrams_are_counted_not_raised(feed: AgentFeed) -> None:
    await send(feed, b"GET / HTTP/1.1", b'{"v": 9, "pid": 1, "state": "running"}', message(7))
    reading = await feed.read()
    assert (reading.messages, reading.bad_messages) == (3, 2)
    assert "version" in feed.last_error or "JSON" in feed.last_error


async def test_silent_agent_turns_stale_then_is_forgotten(feed: AgentFeed) -> None:
    await send(feed, message(9))
    assert [a.state for a in (await feed.read()).agents] == ["running"]
    feed.test_clock.t += 6  # type: ignore[attr-defined]
    assert [a.state for a in (await feed.read()).agents] == ["stale"]
    feed.test_clock.t += 120  # type: ignore[attr-defined]
    assert (await feed.read()).agents == ()


async def test_a_quiet_agent_stays_quiet_while_its_process_runs(feed: AgentFeed) -> None:
    await send(feed, message(9), message(9, state="quiet"))
    feed.test_clock.t += 120  # type: ignore[attr-defined]  # silent for long, but it said it had nothing to say
    # its process (this test's, as SO_PEERCRED names it to the daemon) runs: quiet, neither stale nor forgotten
    assert [a.state for a in (await feed.read()).agents] == ["quiet"]
    feed.alive = lambda pid: False  # the process ended without a word: silent for over the forget time, gone
    feed.test_clock.t += 6  # type: ignore[attr-defined]
    assert (await feed.read()).agents == ()


async def test_a_quiet_agent_whose_process_ended_turns_stale_then_is_forgotten(feed: AgentFeed) -> None:
    await send(feed, message(9, state="quiet"))
    asked: list[int] = []
    feed.alive = lambda pid: bool(asked.append(pid))  # the process ended without a word
    feed.test_clock.t += 6  # type: ignore[attr-defined]
    assert [a.state for a in (await feed.read()).agents] == ["stale"]
    assert set(asked) == {
        os.getpid()
    }  # asked about the sender's pid as the daemon sees it, not the message's
    feed.test_clock.t += 120  # type: ignore[attr-defined]
    assert (await feed.read()).agents == ()


async def test_unavailable_agent_reports_its_reason(feed: AgentFeed) -> None:
    raw = wire.encode(
        wire.Message(
            pid=5, state="unavailable", detail="cuptiError: CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"
        )
    )
    await send(feed, raw)
    (agent,) = (await feed.read()).agents
    assert agent.state == "unavailable" and "MULTIPLE_SUBSCRIBERS" in agent.detail and agent.gpu == -1


async def test_engine_steps_are_summed_per_engine(feed: AgentFeed) -> None:
    hist = (0,) * 5 + (7,) + (0,) * 6
    s = wire.Steps("vllm", n=7, wall=504 * MS, gpu=136 * MS, tokens=1120, seqs=1120, hist=hist)
    await send(feed, message(3, steps=(s,)), message(3, steps=(s,)))
    (steps,) = (await feed.read()).steps
    assert (steps.engine, steps.steps, steps.wall_ns, steps.gpu_busy_ns, steps.seqs) == (
        "vllm",
        14,
        1008 * MS,
        272 * MS,
        2240,
    )
    assert steps.step_hist[5] == 14
    assert steps.gpu_measured is False  # this agent saw no GPU work of its own (vLLM EngineCore, mp executor)


async def test_latest_ratio_is_kept_between_windows_while_the_agent_lives(feed: AgentFeed) -> None:
    await send(feed, message(1, (window(T0, [(T0, T0 + 450 * MS)]),)))
    first = merge(await feed.read(), None)
    await send(feed, message(1))
    reading = await feed.read()
    assert [(g.running, g.windows) for g in reading.windows] == [(1, ())]
    (act,) = merge(reading, first).activity
    assert act.observed_ns == 0 and act.last_window_busy_ns == 450 * MS


async def test_restarted_sidecar_replaces_a_stale_socket_file(tmp_path: Path) -> None:
    path = tmp_path / "agent.sock"
    path.write_text("left over")
    f = AgentFeed(AgentFeedConfig(socket=str(path)))
    await f.start()
    try:
        await send(f, message(1))
        assert (await f.read()).messages == 1
    finally:
        f.close()
    assert not path.exists()


# --- light-agent figures ----------------------------------------------------------------------


def light(pid: int, *steps: wire.Steps, graphs: wire.GraphCounts | None = None) -> bytes:
    return wire.encode(wire.Message(pid=pid, state="running", mode="light", steps=steps, graphs=graphs))


def vsteps(n: int, **kw: object) -> wire.Steps:
    return wire.Steps(engine="vllm", n=n, wall=n * 10 * MS, hist=(n,) + (0,) * 11, **kw)  # type: ignore[arg-type]


async def test_light_agent_round_trip_fills_engine_steps_and_graph_use(feed: AgentFeed) -> None:
    from exporter.agent.light import LightAgent
    from exporter.agent.settings import Settings

    # the steps below end at T0 + 10-40 ms: the agent's wall clock is the feed's, near them
    agent = LightAgent(
        Settings(socket=feed.cfg.socket, role="vllm_engine", flush_s=0.02), wall_ns=lambda: T0 + 50 * MS
    )
    agent.start()
    try:
        # a served sequence: (step end ms, running, waiting) read after each 10 ms step
        for end, running, waiting in ((10, 2, 3), (20, 5, 0), (30, 5, 0), (40, 1, 0)):
            agent.steps.record(
                "vllm", T0 + (end - 10) * MS, T0 + end * MS, 5, running, running, waiting, 8, 0
            )
        # the steps' datagram received and decoded (the read decodes what the socket received)
        await wait_until_async(lambda: feed._open_inbox() or feed._steps, what="the light agent's steps")
        reading = await feed.read()
    finally:
        agent.stop()
    (s,) = reading.steps
    assert (s.pid, s.steps, s.tokens, s.max_num_seqs, s.dp_rank) == (os.getpid(), 4, 20, 8, 0)
    assert (s.running, s.waiting) == (1.0, 0.0)
    assert s.running_seconds == pytest.approx((2 + 5 + 5) * 0.010)  # left rule, request-seconds exactly
    assert s.waiting_seconds == pytest.approx(3 * 0.010)
    assert reading.agents[0].mode == "light"


def test_steps_are_named_by_engine_core_not_by_kind(tmp_path: Path) -> None:
    f = AgentFeed(AgentFeedConfig(socket=str(tmp_path / "x.sock")), wall_ns=lambda: 1_000_000)
    f.receive(light(100, vsteps(3, running=4, waiting=1, dp=0)))
    f.receive(light(200, vsteps(5, running=2, waiting=0, dp=0)))  # another engine, same kind and rank
    f.receive(light(300, vsteps(0, graph=4, eager=1, dp=0, owner=100)))  # a worker of engine 100
    f.receive(light(100, vsteps(2, running=6, waiting=0, dp=1, t1=5)))  # engine 100's second DP rank
    by = {(s.pid, s.dp_rank): s for s in f.collect().steps}
    assert set(by) == {(100, 0), (100, 1), (200, 0)}
    assert (by[100, 0].steps, by[100, 0].graph_steps, by[100, 0].eager_steps) == (3, 4, 1)
    assert (by[200, 0].steps, by[200, 0].running, by[200, 0].graph_steps) == (5, 2.0, 0)
    assert by[100, 1].running == 6.0


def test_agents_in_other_pid_namespaces_are_named_by_the_pids_this_daemon_sees(tmp_path: Path) -> None:
    """Two engine containers' agents both say pid 7 (their own namespaces'); the kernel's peer pids differ.

    Each is its own agent under its peer pid, and a worker's steps name its engine core by the peer's
    parent here (its getppid() means nothing in this namespace). A sender in this daemon's namespace
    whose pid differs from its peer (the process forked, a test) keeps the pid it says.
    """
    from exporter.sources.unixsock import Peer

    inner = {5001: 7, 6001: 7, 6002: 9}  # what /proc/<peer>/status NSpid ends with
    parents = {6002: 6001}  # a GPU worker forked by its container's engine core
    f = AgentFeed(
        AgentFeedConfig(socket=str(tmp_path / "x.sock")),
        wall_ns=lambda: 1_000_000,
        inner=lambda pid: inner.get(pid, 0),
        parent=lambda pid: parents.get(pid, 0),
    )
    f.receive(light(7, vsteps(3, running=4, waiting=1)), Peer(5001, 0, 0))
    f.receive(light(7, vsteps(5, running=2, waiting=0)), Peer(6001, 0, 0))
    f.receive(light(9, vsteps(0, graph=4, eager=1, owner=1)), Peer(6002, 0, 0))  # owner: its getppid() there
    f.receive(light(4242, vsteps(1, running=1, waiting=0)), Peer(os.getpid(), 0, 0))  # this namespace
    reading = f.collect()
    assert sorted(a.pid for a in reading.agents) == [4242, 5001, 6001, 6002]
    by = {s.pid: s for s in reading.steps}
    assert set(by) == {5001, 6001, 4242}
    assert (by[5001].steps, by[5001].running) == (3, 4.0)
    assert (by[6001].steps, by[6001].running, by[6001].graph_steps, by[6001].eager_steps) == (5, 2.0, 4, 1)


def test_newest_counts_win_and_implausible_values_are_clamped(tmp_path: Path) -> None:
    f = AgentFeed(AgentFeedConfig(socket=str(tmp_path / "x.sock")), wall_ns=lambda: 1_000_000)
    f.receive(light(1, vsteps(1, running=9, waiting=9, t1=20)))
    f.receive(light(1, vsteps(1, running=3, waiting=1, t1=10)))  # older, arrived later: refused, counted
    f.receive(light(1, vsteps(1, running=10**12, waiting=2, t1=30, max_seqs=10**12, graph=10**15)))
    (s,) = f.collect().steps
    assert (s.running, s.waiting) == (1_000_000.0, 2.0)
    assert s.max_num_seqs == 1_000_000 and s.graph_steps == 10_000_000
    assert f.collect().steps == ()  # handed out once


def test_engines_per_agent_are_capped(tmp_path: Path) -> None:
    from exporter.sources import agent_feed

    f = AgentFeed(AgentFeedConfig(socket=str(tmp_path / "x.sock")), wall_ns=lambda: 1_000_000)
    many = tuple(vsteps(1, dp=i) for i in range(agent_feed.MAX_ENGINES_PER_AGENT + 3))
    f.receive(light(1, *many[:8]))
    f.receive(light(1, *many[8:]))
    reading = f.collect()
    assert len(reading.steps) == agent_feed.MAX_ENGINES_PER_AGENT
    assert dict(reading.refused)["engines"] == 3


def test_graph_use_per_process_sums_windows_and_keeps_the_newest_capture_count(tmp_path: Path) -> None:
    wall = [T0 + 1000 * MS]
    f = AgentFeed(AgentFeedConfig(socket=str(tmp_path / "x.sock")), wall_ns=lambda: wall[0])
    f.receive(
        light(7, graphs=wire.GraphCounts(t0=T0, t1=T0 + 500 * MS, replays=800, captures=67, dev=1, uuid=UUID))
    )
    f.receive(
        light(7, graphs=wire.GraphCounts(t0=T0 + 500 * MS, t1=T0 + 1000 * MS, replays=790, captures=68))
    )
    f.receive(light(8, graphs=wire.GraphCounts(t0=T0, t1=T0 + 500 * MS)))  # hooks in, no graph ran
    g7, g8 = f.collect().graphs
    assert (g7.pid, g7.gpu, g7.uuid, g7.observed_ns, g7.replays, g7.captures) == (
        7,
        1,
        UUID,
        1000 * MS,
        1590,
        68,
    )
    assert (g8.pid, g8.observed_ns, g8.replays, g8.gpu) == (8, 500 * MS, 0, -1)
    assert (g7.since_ns, g7.until_ns, g8.since_ns, g8.until_ns) == (T0, T0 + 1000 * MS, T0, T0 + 500 * MS)
    assert f.collect().graphs == ()
    # what they cover never reaches past their arrival, nor further back than the span they give
    wall[0] = T0 + 200 * MS
    f.receive(light(9, graphs=wire.GraphCounts(t0=T0, t1=T0 + 900 * MS, replays=5)))
    (g9,) = f.collect().graphs
    assert (g9.since_ns, g9.until_ns) == (T0, T0 + 200 * MS)


def test_the_same_graph_counts_sent_again_count_once(tmp_path: Path) -> None:
    """Windows and steps refuse what ends no later than the last; graph counts too (an input audit's)."""
    f = AgentFeed(AgentFeedConfig(socket=str(tmp_path / "x.sock")), wall_ns=lambda: T0 + 1000 * MS)
    counts = wire.GraphCounts(t0=T0, t1=T0 + 490 * MS, replays=100, captures=3, dev=0, uuid=UUID)
    for _ in range(5):
        f.receive(light(7, graphs=counts))
    f.receive(light(7, graphs=wire.GraphCounts(t0=T0, t1=T0 + 400 * MS, replays=50)))  # older: refused too
    reading = f.collect()
    (g,) = reading.graphs
    assert (g.replays, g.observed_ns) == (100, 490 * MS)  # not 500 replays over 2.45 s
    assert dict(reading.refused)["overlap"] == 5


def test_a_raw_window_is_the_one_its_constructor_builds_and_stays_frozen() -> None:
    w = window(
        T0, [(T0 + 10 * MS, T0 + 145 * MS)], kernels=3, gaps=(1,) + (0,) * 10, gap_sum=2 * MS, dropped=1
    )
    got = agent_feed._raw(42, w)
    built = AgentWindow(
        pid=42,
        t0=w.t0,
        t1=w.t1,
        busy_ns=w.busy,
        graph_busy_ns=w.graph_busy,
        kernels=w.kernels,
        memcpys=w.memcpys,
        memsets=w.memsets,
        graphs=w.graphs,
        dropped=w.dropped,
        gap_counts=w.gaps,
        gap_sum_ns=w.gap_sum,
        iv=w.iv,
        slack_ns=w.slack,
    )
    assert got == built and repr(got) == repr(built) and hash(got) == hash(built)
    assert list(vars(got)) == list(vars(built))
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.pid = 1  # type: ignore[misc]


def test_an_agents_state_is_handed_out_again_while_it_stays_the_same(tmp_path: Path) -> None:
    clock = Clock(wall_ns=RECEIVED)
    f = AgentFeed(AgentFeedConfig(socket=str(tmp_path / "x.sock"), stale_seconds=5.0), clock=clock)
    f.receive(message(9))
    f.receive(message(8, lib="libcupti 13"))
    first = f.collect().agents
    f.receive(message(9))
    again = f.collect().agents
    assert again == first and all(a is b for a, b in zip(again, first, strict=True))
    f.receive(message(9, sent_dropped=2))  # one figure moved: a new state, equal to a fresh one
    (eight, nine) = f.collect().agents
    assert eight is first[0] and nine is not first[1] and nine.dropped_messages == 2
    assert nine == AgentState(9, 0, "running", role="generic", uuid=UUID, dropped_messages=2)
    f.receive(message(9, sent_dropped=2, steps_stale=3))  # the stale steps it dropped moved alone
    (eight, again) = f.collect().agents
    assert eight is first[0] and again is not nine and (again.dropped_messages, again.stale_steps) == (2, 3)
    assert again == AgentState(9, 0, "running", role="generic", uuid=UUID, dropped_messages=2, stale_steps=3)
    clock.t += 6  # both stale
    assert [a.state for a in f.collect().agents] == ["stale", "stale"]
    clock.t += 120  # both forgotten, and their kept states with them
    assert f.collect().agents == () and f._kept_states == {}


@pytest.mark.parametrize("key", ["sent_dropped", "steps_stale"])
def test_a_bad_count_of_what_an_agent_dropped_is_a_bad_message_and_its_last_state_stands(
    tmp_path: Path, key: str
) -> None:
    f = AgentFeed(
        AgentFeedConfig(socket=str(tmp_path / "x.sock"), stale_seconds=5.0), clock=Clock(wall_ns=RECEIVED)
    )
    f.receive(message(9, sent_dropped=4, steps_stale=2))
    for bad in (-1, 2.5, True, "4", [4], None, wire.MAX_INT + 1):
        body = json.loads(message(9, sent_dropped=5, steps_stale=3))
        body[key] = bad
        f.receive(json.dumps(body).encode())
    reading = f.collect()
    assert (reading.messages, reading.bad_messages) == (8, 7) and key in f.last_error
    (nine,) = reading.agents
    assert (nine.dropped_messages, nine.stale_steps) == (4, 2)


def test_a_quiet_agent_that_captured_graphs_counts_zero_replays_while_it_stays_quiet(tmp_path: Path) -> None:
    clock = Clock()
    f = AgentFeed(AgentFeedConfig(socket=str(tmp_path / "x.sock"), stale_seconds=5.0), clock=clock,
                  wall_ns=lambda: T0 + 3_000 * MS, alive=lambda pid: True)  # fmt: skip
    counts = wire.GraphCounts(t0=T0, t1=T0 + 500 * MS, replays=40, captures=9, dev=0, uuid=UUID)
    f.receive(light(7, graphs=counts))
    f.receive(light(8, graphs=wire.GraphCounts(t0=T0, t1=T0 + 500 * MS)))  # never captured a graph
    f.receive(wire.encode(wire.Message(pid=7, state="quiet", mode="light")))
    f.receive(wire.encode(wire.Message(pid=8, state="quiet", mode="light")))
    assert [(g.pid, g.replays) for g in f.collect().graphs] == [(7, 40), (8, 0)]
    for _ in range(4):  # quiet: its hooks in, it resumes at the first replay, so none ran
        clock.t += 0.5
        (g,) = f.collect().graphs
        assert (g.pid, g.gpu, g.uuid, g.observed_ns, g.replays, g.captures) == (7, 0, UUID, 500 * MS, 0, 9)
        assert (g.since_ns, g.until_ns) == (T0 + 2_500 * MS, T0 + 3_000 * MS)  # the tick's, by the wall clock
    clock.t += 0.5
    # it resumes: its next counts cover the quiet time too, which was counted already
    f.receive(light(7, graphs=wire.GraphCounts(t0=T0 + 500 * MS, t1=T0 + 3_000 * MS, replays=12, captures=9)))
    (g,) = f.collect().graphs
    assert (g.observed_ns, g.replays, g.gpu, g.uuid) == (500 * MS, 12, 0, UUID)
    f.receive(wire.encode(wire.Message(pid=7, state="quiet", mode="light")))
    f.collect()
    f.alive = lambda pid: False  # its process ended: no more zeros, whatever it said last
    clock.t += 6
    assert f.collect().graphs == ()


def test_a_quiet_agent_that_says_it_runs_again_stops_its_zeros_before_it_sends_counts(tmp_path: Path) -> None:
    """The light agent's resuming call says "running" at once; its counts come with its next tick."""
    clock = Clock()
    f = AgentFeed(AgentFeedConfig(socket=str(tmp_path / "x.sock"), stale_seconds=5.0), clock=clock,
                  wall_ns=lambda: T0 + 3_000 * MS, alive=lambda pid: True)  # fmt: skip
    f.receive(
        light(7, graphs=wire.GraphCounts(t0=T0, t1=T0 + 500 * MS, replays=40, captures=9, dev=0, uuid=UUID))
    )
    f.receive(wire.encode(wire.Message(pid=7, state="quiet", mode="light", silent_ms=1250)))
    f.collect()
    clock.t += 0.5
    assert [(g.pid, g.replays) for g in f.collect().graphs] == [(7, 0)]  # quiet: its silence is no replay
    f.receive(wire.encode(wire.Message(pid=7, state="running", mode="light", silent_ms=1250)))  # resumed
    clock.t += 0.5
    reading = f.collect()
    assert reading.graphs == () and [a.state for a in reading.agents] == ["running"]  # nothing covered yet


def test_graph_counts_on_a_clock_far_from_ours_are_refused_and_cover_nothing(tmp_path: Path) -> None:
    """What the counts cover is read off the agent's clock: off by more than the windows' bounds, it is unknown."""
    wall = T0 + 1_000 * MS
    f = AgentFeed(AgentFeedConfig(socket=str(tmp_path / "x.sock")), wall_ns=lambda: wall)
    ahead = wire.GraphCounts(t0=wall + 10_000 * MS, t1=wall + 10_500 * MS, replays=80, captures=3)
    behind = wire.GraphCounts(t0=T0 - 700_000_000 * MS, t1=T0 - 699_999_500 * MS, replays=80, captures=3)
    f.receive(light(7, graphs=ahead))
    f.receive(light(8, graphs=behind))
    f.receive(light(9, graphs=wire.GraphCounts(t0=T0, t1=wall + 4_000 * MS, replays=5, captures=1)))  # within
    reading = f.collect()
    assert [(g.pid, g.replays) for g in reading.graphs] == [(9, 5)]
    assert dict(reading.refused)["clock"] == 2 and "graph counts end" in f.last_error


async def test_start_read_hands_out_what_read_would_as_a_done_future(tmp_path) -> None:
    import asyncio

    from exporter.config import AgentFeedConfig
    from exporter.sources.agent_feed import AgentFeed
    from exporter.sources.base import SourceUnavailable

    feed = AgentFeed(AgentFeedConfig(socket=str(tmp_path / "a.sock")))
    future = feed.start_read()
    assert future.done() and isinstance(future.exception(), SourceUnavailable)
    await feed.start()
    try:
        done = feed.start_read()
        assert isinstance(done, asyncio.Future) and done.done()
        assert done.result() == await feed.read()
    finally:
        feed.close()


def test_a_light_agent_silent_past_its_silent_ms_reads_quiet_while_its_process_runs(tmp_path: Path) -> None:
    clock = Clock()
    alive = {7: True, 8: True}
    f = AgentFeed(AgentFeedConfig(socket=str(tmp_path / "x.sock"), stale_seconds=5.0), clock=clock,
                  wall_ns=lambda: T0 + 500 * MS, alive=lambda pid: alive[pid])  # fmt: skip
    counts = wire.GraphCounts(t0=T0, t1=T0 + 500 * MS, replays=40, captures=9, dev=0, uuid=UUID)
    # a light agent whose engine then stops (its thread stays asleep), and one that said nothing of its
    # silence (an older light agent, a CUPTI one: their threads say quiet or keep sending)
    f.receive(wire.encode(wire.Message(pid=7, state="running", mode="light", graphs=counts, silent_ms=1750)))
    f.receive(wire.encode(wire.Message(pid=8, state="running", mode="light")))
    clock.t += 1.5  # within what it said: running
    assert [(a.pid, a.state) for a in f.collect().agents] == [(7, "running"), (8, "running")]
    clock.t += 0.5
    reading = f.collect()
    assert [(a.pid, a.state) for a in reading.agents] == [(7, "quiet"), (8, "running")]
    (g,) = reading.graphs  # quiet, with graphs captured: its hooks saw no replay over the tick
    assert (g.pid, g.replays, g.observed_ns) == (7, 0, 500 * MS)
    clock.t += 4
    assert [(a.pid, a.state) for a in f.collect().agents] == [(7, "quiet"), (8, "stale")]
    clock.t += 120  # long silent: the quiet agent kept while its process runs, the other forgotten
    assert [(a.pid, a.state) for a in f.collect().agents] == [(7, "quiet")]
    alive[7] = False  # its process ended without a word: silent for over the forget time, gone
    clock.t += 6
    assert f.collect().agents == ()


async def test_datagrams_wait_in_the_inbox_and_are_taken_as_of_their_arrival(feed: AgentFeed) -> None:
    """The socket is drained when readable; what came is decoded at the read, each as of when it came."""
    clock = feed.test_clock  # type: ignore[attr-defined]
    await send(feed, message(7), message(8))  # two agents on the GPU
    await feed.read()
    await send(feed, message(7, (window(T0, [(T0, T0 + 100 * MS)]),)))
    assert len(feed._inbox) == 1  # received, not yet decoded
    came = clock.t
    clock.t += 0.9  # the read comes later; agent 8 never sends this window
    assert raw(await feed.read()) == []  # waiting for agent 8, merge_wait_s (1 s) from its arrival
    assert feed._agents[7].last_seen == came  # seen when it came, not when it was decoded
    clock.t += 0.2  # 1.1 s after the window came (0.2 s after it was decoded)
    (got,) = raw(await feed.read())
    assert (got.pid, got.t0) == (7, T0)


async def test_a_full_inbox_is_opened_without_waiting_for_the_read(
    feed: AgentFeed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past INBOX_MAX datagrams (or INBOX_MAX_BYTES) the reader asks the event loop to open the inbox at once."""
    monkeypatch.setattr(agent_feed, "INBOX_MAX", 3)
    await send(feed, *(message(100 + i) for i in range(7)))
    # opened before any read, as often as it reached the bound: fewer than INBOX_MAX left held (which
    # ones depends on when the loop ran; under load it may have opened them 2, 3 or 5 at a time)
    await wait_until_async(
        lambda: len(feed._agents) >= 5 and feed._arrived - feed._opened < 3,
        what="the inbox opened before any read",
    )
    assert {a.pid for a in (await feed.read()).agents} == set(range(100, 107))
    monkeypatch.setattr(agent_feed, "INBOX_MAX_BYTES", 1)
    await send(feed, message(200))
    await wait_until_async(lambda: 200 in feed._agents, what="one datagram past the byte bound opened")
    assert not feed._inbox


async def test_while_the_event_loop_is_held_the_reader_keeps_a_bounded_inbox_and_counts_the_rest(
    feed: AgentFeed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The event loop busy elsewhere: the reader holds INBOX_HOLD x INBOX_MAX, drops the rest and says so."""
    monkeypatch.setattr(agent_feed, "INBOX_MAX", 2)
    held = agent_feed.INBOX_HOLD * 2
    with socket.socket(
        socket.AF_UNIX, socket.SOCK_DGRAM
    ) as s:  # blocking: waits while the kernel's queue is full
        for i in range(held + 5):
            s.sendto(message(300 + i), feed.cfg.socket)
    wait_until(lambda: feed._dropped >= 5, what="5 dropped")  # sleeps: the event loop never runs meanwhile
    assert (len(feed._inbox), feed._dropped) == (held, 5)
    reading = await feed.read()
    assert reading.messages == held and dict(reading.refused)["inbox"] == 5
    assert {a.pid for a in reading.agents} == set(range(300, 300 + held))  # the first ones, in order
    await send(feed, message(400))  # the reader goes on
    assert 400 in {a.pid for a in (await feed.read()).agents}


async def test_while_the_event_loop_is_busy_agents_sending_as_they_do_lose_nothing(feed: AgentFeed) -> None:
    """The kernel queues ~10 datagrams; the reader thread empties it while the event loop is held up (a tick's work)."""
    sent = 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.setblocking(False)  # as the agent's sender: drop rather than block
        for i in range(40):  # four times the queue, spread over ~40 ms, the event loop never let run
            try:
                s.sendto(message(500 + i), feed.cfg.socket)
                sent += 1
            except BlockingIOError:
                pass
            time.sleep(0.001)
    assert sent == 40  # none would have been dropped
    wait_until(lambda: feed._arrived >= 40, what="40 datagrams in the inbox")
    assert {a.pid for a in (await feed.read()).agents} == set(range(500, 540))


async def test_a_failed_receive_is_counted_and_the_reader_goes_on(
    feed: AgentFeed, monkeypatch: pytest.MonkeyPatch
) -> None:
    real, calls = agent_feed.unixsock.receive_one, []

    def failing_once(sock: socket.socket, limit: int) -> tuple[bytes, object, bool]:
        calls.append(1)
        if len(calls) == 1:
            raise OSError(5, "Input/output error")
        return real(sock, limit)

    monkeypatch.setattr(agent_feed.unixsock, "receive_one", failing_once)  # from the reader's next receive
    await send(feed, message(1), message(2))
    await wait_until_async(lambda: feed._arrived >= 3, what="two datagrams and the failure")
    reading = await feed.read()
    assert reading.bad_messages == 1 and "receive failed" in feed.last_error
    assert {a.pid for a in reading.agents} == {1, 2} and reading.messages == 2


async def test_closing_stops_the_reader_thread(feed: AgentFeed) -> None:
    reader = feed._reader
    assert reader is not None and reader.is_alive() and reader.name == "bw-agent_0"
    feed.close()
    assert not reader.is_alive() and not os.path.exists(feed.cfg.socket)


async def test_a_sender_not_allowed_is_refused_on_arrival_and_never_held(feed: AgentFeed) -> None:
    assert feed._allow is not None
    feed._allow = dataclasses.replace(feed._allow, uids=frozenset(), gids=frozenset(), _cache={})
    await send(feed, message(9))
    assert [(what, data) for what, data, *_ in feed._inbox] == [(agent_feed._REFUSED, b"")]  # not its data
    reading = await feed.read()
    assert dict(reading.refused)["peer"] == 1 and reading.messages == 1 and not reading.agents


def test_the_kernels_queue_limit_is_read_from_the_namespaces_setting(tmp_path: Path) -> None:
    setting = tmp_path / "max_dgram_qlen"
    setting.write_text("512\n")
    assert agent_feed.unixsock.dgram_queue_limit(str(setting)) == 512
    setting.write_text("not a number")
    assert agent_feed.unixsock.dgram_queue_limit(str(setting)) == 10  # Linux's default
    assert agent_feed.unixsock.dgram_queue_limit(str(tmp_path / "absent")) == 10
    setting.write_text(str(1 << 40))
    assert agent_feed.unixsock.dgram_queue_limit(str(setting)) == 1 << 20


async def paced(
    feed: AgentFeed, monkeypatch: pytest.MonkeyPatch, limit: int = 4, backstop: float = 30.0
) -> None:
    """Make the feed's reader paced: a few seconds (shortened) whose arrivals fit `limit`."""
    monkeypatch.setattr(agent_feed, "PACE_BACKSTOP_S", backstop)
    monkeypatch.setattr(agent_feed, "PACE_BIN_S", 0.05)
    monkeypatch.setattr(agent_feed, "PACED_AFTER", 2)
    feed._pace_limit = limit
    for i in range(5):
        await send(feed, message(900 + i))
        with feed._drain_lock:  # the thread has counted it
            if feed._paced:
                break
        time.sleep(0.06)  # each arrival in a bin of its own
    assert feed._paced and feed.paced_switches == 1 and i in (1, 2)
    await feed.read()


def send_now(feed: AgentFeed, *pids: int) -> None:
    """Send one message from each pid to the feed's socket, without waiting for the feed."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        for pid in pids:
            s.sendto(message(pid), feed.cfg.socket)


async def test_a_paced_reader_leaves_datagrams_in_the_kernel_until_the_ticks_read_drains_them(
    feed: AgentFeed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the kernel's queue holds a tick's datagrams, no thread wakes for each: the read takes them."""
    await paced(feed, monkeypatch)
    arrived = feed._arrived
    send_now(feed, 11, 12, 13)
    time.sleep(0.2)
    assert feed._arrived == arrived and not feed._inbox  # still in the kernel's queue
    reading = await feed.read()
    assert {11, 12, 13} <= {a.pid for a in reading.agents} and reading.messages == 3
    assert feed._arrived == arrived + 3 and feed._paced


async def test_more_arrivals_than_half_the_queue_put_the_reader_back_to_blocking(
    feed: AgentFeed, monkeypatch: pytest.MonkeyPatch
) -> None:
    logged: list[dict[str, object]] = []
    monkeypatch.setattr(agent_feed.log, "info", lambda event, **kw: logged.append({"event": event, **kw}))
    await paced(feed, monkeypatch, limit=2)
    send_now(feed, 21, 22, 23)  # three in one bin: more than the limit
    reading = await feed.read()
    assert {21, 22, 23} <= {a.pid for a in reading.agents}
    assert not feed._paced and feed.paced_switches == 2
    assert [(e["event"], e["waits"]) for e in logged] == [
        ("agent_reader", "paced"),
        ("agent_reader", "blocking"),
    ]
    assert logged[0]["arrivals_in_a_second"] == 1 and logged[1]["arrivals_in_a_second"] >= 3
    await send(feed, message(24))  # taken as it comes again: the thread waits in its receive
    assert 24 in {a.pid for a in (await feed.read()).agents}


async def test_a_paced_reader_drains_the_socket_itself_while_no_read_comes(
    feed: AgentFeed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The event loop held up: the thread drains the kernel's queue after PACE_BACKSTOP_S, before it fills."""
    await paced(feed, monkeypatch, backstop=0.3)
    arrived = feed._arrived
    send_now(feed, 31, 32)
    wait_until(lambda: feed._arrived >= arrived + 2, what="the thread's own drain")  # the loop never runs
    assert feed._paced
    assert {31, 32} <= {a.pid for a in (await feed.read()).agents}


async def test_closing_stops_a_paced_reader(feed: AgentFeed, monkeypatch: pytest.MonkeyPatch) -> None:
    await paced(feed, monkeypatch)
    reader = feed._reader
    assert reader is not None and reader.is_alive()
    feed.close()
    assert not reader.is_alive()


def test_a_gpu_first_named_by_graph_counts_takes_a_place_or_is_counted(tmp_path: Path) -> None:
    """Graph counts naming a UUID no agent's devices named: it takes a GPU place like one, and with every
    place named by live agents it is refused as `gpus` (before, dropped further on with no count)."""
    from exporter.sources import agent_feed

    wall = T0 + 1000 * MS
    f = AgentFeed(AgentFeedConfig(socket=str(tmp_path / "x.sock")), wall_ns=lambda: wall)
    new = wire.GraphCounts(t0=T0, t1=T0 + 500 * MS, replays=9, captures=1, dev=3, uuid="GPU-graphs-only")
    f.receive(light(7, graphs=new))
    assert "GPU-graphs-only" in f._gpus  # a place, as a device named in `devices` gets
    (g,) = f.collect().graphs
    assert g.uuid == "GPU-graphs-only"
    for i in range(agent_feed.MAX_GPUS - 1):  # every other place named by a live agent's devices
        f.receive(wire.encode(wire.Message(pid=100 + i, state="running", devices=((0, f"GPU-{i}"),))))
    assert dict(f.collect().refused)["gpus"] == 0
    assert len(f._gpus) == agent_feed.MAX_GPUS and "GPU-graphs-only" in f._gpus  # its own still named
    late = wire.GraphCounts(t0=T0, t1=T0 + 500 * MS, replays=4, captures=1, dev=2, uuid="GPU-late")
    f.receive(light(8, graphs=late))
    reading = f.collect()
    assert dict(reading.refused)["gpus"] == 1 and "GPU-late" not in f._gpus
    assert {u.uuid for u in reading.graphs if u.pid == 8} == {""}  # its counts kept, the UUID not
