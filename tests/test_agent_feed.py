"""The sidecar's agent feed on a real unix datagram socket: merging, unions across processes, states."""

import asyncio
import socket
from pathlib import Path

import pytest

from exporter import wire
from exporter.config import AgentFeedConfig
from exporter.sources.agent_feed import AgentFeed

MS = 1_000_000
T0 = 1_764_400_000_000_000_000  # aligned to 0.5 s
UUID = "GPU-6f5e2c1a-0b7d-4c39-9d0e-2f1a3b4c5d6e"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def wall_ns(self) -> int:
        """Return the receive time: a little after the first window of these tests closed."""
        return T0 + 2_000_000_000 + int((self.t - 1000.0) * 1e9)


def window(t0: int, busy_ivs: list[tuple[int, int]], **kw: object) -> wire.Window:
    packed, slack = wire.pack_intervals(busy_ivs, t0)
    busy = sum(e - s for s, e in busy_ivs)
    return wire.Window(dev=0, t0=t0, t1=t0 + 500 * MS, busy=busy, iv=packed, slack=slack, **kw)  # type: ignore[arg-type]


def message(pid: int, windows: tuple[wire.Window, ...] = (), state: str = "running", **kw: object) -> bytes:
    msg = wire.Message(pid=pid, state=state, devices=((0, UUID),), windows=windows, **kw)  # type: ignore[arg-type]
    return wire.encode(msg)


@pytest.fixture
async def feed(tmp_path: Path):  # type: ignore[no-untyped-def]
    clock = Clock()
    f = AgentFeed(
        AgentFeedConfig(socket=str(tmp_path / "run" / "agent.sock"), stale_seconds=5.0),
        clock=clock,
        wall_ns=clock.wall_ns,
    )
    await f.start()
    f.test_clock = clock  # type: ignore[attr-defined]
    yield f
    f.close()


async def send(path: str, *datagrams: bytes) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        for d in datagrams:
            s.sendto(d, path)
    for _ in range(5):
        await asyncio.sleep(0.01)


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
    await send(feed.cfg.socket, message(4242, (w,)))
    reading = await feed.read()
    (a,) = reading.activity
    assert (a.uuid, a.gpu, a.observed_ns, a.busy_ns) == (UUID, 0, 500 * MS, 135 * MS)
    assert (a.kernels, a.graphs, a.graph_busy_ns, a.idle_gap_counts[6]) == (410, 22, 90 * MS, 2)
    assert a.last_window_busy_ns / a.last_window_ns == pytest.approx(0.27)
    assert reading.messages == 1 and reading.bad_messages == 0
    (agent,) = reading.agents
    assert (agent.pid, agent.state, agent.uuid) == (4242, "running", UUID)


async def test_two_processes_on_one_gpu_are_unioned(feed: AgentFeed) -> None:
    a = window(T0, [(T0, T0 + 300 * MS)])
    b = window(T0, [(T0 + 200 * MS, T0 + 400 * MS)])
    await send(feed.cfg.socket, message(1, ()), message(2, ()))  # both known before their windows
    await feed.read()
    await send(feed.cfg.socket, message(1, (a,)))
    assert (await feed.read()).activity == ()  # waits for the other process on this GPU
    await send(feed.cfg.socket, message(2, (b,)))
    (act,) = (await feed.read()).activity
    assert act.busy_ns == 400 * MS  # not 500: the overlap counts once
    assert act.processes == 2


async def test_a_window_missing_from_one_process_is_merged_after_the_wait(feed: AgentFeed) -> None:
    await send(feed.cfg.socket, message(1), message(2))
    await feed.read()
    await send(feed.cfg.socket, message(1, (window(T0, [(T0, T0 + 100 * MS)]),)))
    assert (await feed.read()).activity == ()
    feed.test_clock.t += 1.5  # type: ignore[attr-defined]
    (act,) = (await feed.read()).activity
    assert act.busy_ns == 100 * MS


async def test_bad_datagrams_are_counted_not_raised(feed: AgentFeed) -> None:
    await send(feed.cfg.socket, b"GET / HTTP/1.1", b'{"v": 9, "pid": 1, "state": "running"}', message(7))
    reading = await feed.read()
    assert (reading.messages, reading.bad_messages) == (3, 2)
    assert "version" in feed.last_error or "JSON" in feed.last_error


async def test_silent_agent_turns_stale_then_is_forgotten(feed: AgentFeed) -> None:
    await send(feed.cfg.socket, message(9))
    assert [a.state for a in (await feed.read()).agents] == ["running"]
    feed.test_clock.t += 6  # type: ignore[attr-defined]
    assert [a.state for a in (await feed.read()).agents] == ["stale"]
    feed.test_clock.t += 120  # type: ignore[attr-defined]
    assert (await feed.read()).agents == ()


async def test_unavailable_agent_reports_its_reason(feed: AgentFeed) -> None:
    raw = wire.encode(
        wire.Message(
            pid=5, state="unavailable", detail="cuptiError: CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"
        )
    )
    await send(feed.cfg.socket, raw)
    (agent,) = (await feed.read()).agents
    assert agent.state == "unavailable" and "MULTIPLE_SUBSCRIBERS" in agent.detail and agent.gpu == -1


async def test_engine_steps_are_summed_per_engine(feed: AgentFeed) -> None:
    hist = (0,) * 5 + (7,) + (0,) * 6
    s = wire.Steps("vllm", n=7, wall=504 * MS, gpu=136 * MS, tokens=1120, seqs=1120, hist=hist)
    await send(feed.cfg.socket, message(3, steps=(s,)), message(3, steps=(s,)))
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
    await send(feed.cfg.socket, message(1, (window(T0, [(T0, T0 + 450 * MS)]),)))
    await feed.read()
    await send(feed.cfg.socket, message(1))
    (act,) = (await feed.read()).activity
    assert act.observed_ns == 0 and act.last_window_busy_ns == 450 * MS


async def test_restarted_sidecar_replaces_a_stale_socket_file(tmp_path: Path) -> None:
    path = tmp_path / "agent.sock"
    path.write_text("left over")
    f = AgentFeed(AgentFeedConfig(socket=str(path)))
    await f.start()
    try:
        await send(str(path), message(1))
        assert (await f.read()).messages == 1
    finally:
        f.close()
    assert not path.exists()
