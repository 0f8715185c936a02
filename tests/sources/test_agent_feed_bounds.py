"""The agent feed under hostile input, on a real unix datagram socket: bounds, limits, senders, ownership."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
from pathlib import Path

import pytest

from exporter import wire
from exporter.analysis.agent_union import merge
from exporter.config import AgentFeedConfig
from exporter.sources import agent_feed, unixsock
from exporter.sources.agent_feed import AgentFeed
from exporter.sources.base import SourceUnavailable
from tests.fakes.clock import Clock
from tests.fakes.wait import wait_until_async
from tests.sources.test_agent_feed import MS, RECEIVED, T0, UUID, message, window
from tests.sources.test_agent_feed import raw as raw_windows

NOBODY = 65534
OTHER_UUID = "GPU-0a1b2c3d-0000-4000-8000-0123456789ab"


async def send(feed: AgentFeed, *datagrams: bytes) -> None:
    """Send datagrams without blocking the loop the feed reads on (the receive queue holds only a few);
    return once the feed has taken them all."""
    before = feed._arrived
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.setblocking(False)
        for d in datagrams:
            while True:
                try:
                    s.sendto(d, feed.cfg.socket)
                    break
                except BlockingIOError:
                    await asyncio.sleep(0.001)
    await wait_until_async(
        lambda: feed._arrived >= before + len(datagrams), what=f"{len(datagrams)} datagrams"
    )


def new_feed(path: Path, clock: Clock | None = None, **cfg: object) -> AgentFeed:
    clock = clock or Clock(wall_ns=RECEIVED)
    feed = AgentFeed(
        AgentFeedConfig(socket=str(path), stale_seconds=5.0, **cfg),  # type: ignore[arg-type]
        clock=clock,
        wall_ns=clock.wall_ns,
    )
    feed.test_clock = clock  # type: ignore[attr-defined]
    return feed


@pytest.fixture
async def feed(tmp_path: Path):  # type: ignore[no-untyped-def]
    f = new_feed(tmp_path / "run" / "agent.sock")
    await f.start()
    yield f
    f.close()


def refused(reading: object) -> dict[str, int]:
    return dict(reading.refused)  # type: ignore[attr-defined]


def raw(body: dict[str, object]) -> bytes:
    return json.dumps(body).encode()


# --- row 1: label cardinality ------------------------------------------------------------------


async def test_new_devices_engines_and_pids_in_every_datagram_stay_bounded(feed: AgentFeed) -> None:
    """10k datagrams, each a new pid, device UUID and engine name: every table stays under its bound."""
    engines: set[str] = set()
    gpus: set[int] = set()
    total_refused: dict[str, int] = {}
    for i in range(10_000):
        w = window(T0 + i * 500 * MS, [(T0 + i * 500 * MS, T0 + i * 500 * MS + MS)])
        st = wire.Steps(f"engine-{i}", n=1, wall=MS, t0=T0, t1=T0 + MS, hist=(1,) + (0,) * 11)
        msg = wire.Message(
            pid=100_000 + i, state="running", devices=((i % 200, f"GPU-fake-{i}"),), windows=(w,), steps=(st,)
        )
        feed.receive(wire.encode(msg))
        if i % 500 == 0:
            feed.test_clock.t += 0.5  # type: ignore[attr-defined]
            reading = feed.collect()
            engines |= {s.engine for s in reading.steps}
            gpus |= {g.gpu for g in reading.windows} | {a.gpu for a in reading.agents}
            for k, v in reading.refused:
                total_refused[k] = total_refused.get(k, 0) + v
    reading = feed.collect()
    assert len(feed._agents) <= agent_feed.MAX_AGENTS
    assert len(feed._gpus) <= agent_feed.MAX_GPUS
    assert len(feed._engines) <= agent_feed.MAX_ENGINES
    assert len(feed._pending) <= agent_feed.MAX_PENDING_WINDOWS
    assert len(engines) <= agent_feed.MAX_ENGINES
    assert gpus <= set(range(-1, agent_feed.MAX_GPUS))  # label values stay in a fixed range
    assert total_refused["agents"] > 0 and total_refused["engines"] > 0


async def test_silent_agents_are_forgotten_and_their_slots_reused(feed: AgentFeed) -> None:
    for pid in range(agent_feed.MAX_AGENTS):
        feed.receive(message(10_000 + pid))
    feed.receive(message(99_999))
    assert refused(feed.collect())["agents"] == 1
    feed.test_clock.t += 6  # type: ignore[attr-defined]  # the first lot is silent past its stale time
    feed.receive(message(99_999))
    reading = feed.collect()
    assert refused(reading)["agents"] == 0
    assert 99_999 in {a.pid for a in reading.agents}
    feed.test_clock.t += 61  # type: ignore[attr-defined]
    assert feed.collect().agents == () and feed._agents == {}


async def test_one_agent_may_not_claim_many_devices(feed: AgentFeed) -> None:
    devices = tuple((d, f"GPU-{d}") for d in range(agent_feed.MAX_DEVICES_PER_AGENT + 1))
    feed.receive(wire.encode(wire.Message(pid=5, state="running", devices=devices)))
    reading = feed.collect()
    assert refused(reading)["devices"] == 1 and reading.agents == ()


# --- row 2: physical limits --------------------------------------------------------------------


async def test_the_poison_window_of_the_report_is_rejected(feed: AgentFeed) -> None:
    poison = {
        "v": 1,
        "pid": 1,
        "state": "running",
        "windows": [{"dev": 0, "t0": 1, "t1": 1 + 2**63, "busy": 2**62}],
    }
    await send(feed, raw(poison))
    reading = await feed.read()
    assert reading.bad_messages == 1 and raw_windows(reading) == []


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"t1": T0 + 60_000 * MS}, "limits"),  # a 60 s window: agents close one every 0.5 s
        ({"t0": T0 + 3_600_000 * MS, "t1": T0 + 3_600_500 * MS}, "clock"),  # an hour ahead of now
        ({"t0": T0 - 3_600_000 * MS, "t1": T0 - 3_599_500 * MS}, "clock"),  # an hour behind
    ],
)
async def test_windows_outside_physical_limits_are_refused_and_counted(
    feed: AgentFeed, kw: dict[str, int], reason: str
) -> None:
    w = wire.Window(**{"dev": 0, "t0": T0, "t1": T0 + 500 * MS, "busy": 100 * MS, **kw})  # type: ignore[arg-type]
    await send(feed, message(1, (w,)))
    feed.test_clock.t += 2  # type: ignore[attr-defined]
    reading = await feed.read()
    assert raw_windows(reading) == [] and refused(reading)[reason] == 1


async def test_a_replayed_window_counts_once(feed: AgentFeed) -> None:
    data = message(1, (window(T0, [(T0, T0 + 400 * MS)]),))
    await send(feed, *([data] * 50))
    feed.test_clock.t += 2  # type: ignore[attr-defined]
    reading = await feed.read()
    assert [w.busy_ns for w in raw_windows(reading)] == [400 * MS]
    assert refused(reading)["overlap"] == 49


async def test_steps_over_a_plausible_rate_are_refused(feed: AgentFeed) -> None:
    hist = (0,) * 11 + (1_000_000,)
    fast = wire.Steps("vllm", n=1_000_000, wall=MS, t0=T0, t1=T0 + MS, hist=hist)  # a million steps in 1 ms
    long = wire.Steps("vllm", n=1, wall=2**60, t0=T0, t1=T0 + 2 * MS, hist=(0,) * 11 + (1,))
    ok = wire.Steps(
        "vllm", n=7, wall=70 * MS, t0=T0 + 3 * MS, t1=T0 + 80 * MS, hist=(0,) * 3 + (7,) + (0,) * 8
    )
    await send(feed, message(3, steps=(fast,)), message(3, steps=(long,)), message(3, steps=(ok,)))
    reading = await feed.read()
    assert [(s.engine, s.steps) for s in reading.steps] == [("vllm", 7)]
    assert refused(reading)["limits"] == 2


async def test_a_flood_of_empty_steps_records_stays_its_senders_and_never_pushes_out_anothers(
    feed: AgentFeed,
) -> None:
    """Records of zero steps cost no step budget: a sender's own cap keeps them from the others' (an audit's)."""
    empty = wire.Steps("vllm", n=0, wall=0, running=1, waiting=0)
    ok = wire.Steps(
        "vllm", n=7, wall=70 * MS, t0=T0 + 3 * MS, t1=T0 + 80 * MS, hist=(0,) * 3 + (7,) + (0,) * 8
    )
    await send(feed, message(4242, steps=(ok,)))  # the real engine's first, then the flood
    flood = message(7777, steps=(empty,) * agent_feed.MAX_STEPS_PER_MESSAGE)
    await send(feed, *(flood for _ in range(700)))  # 11,200 records: past the 10,000 once kept in all
    reading = await feed.read()
    assert {s.pid: s.steps for s in reading.steps} == {7777: 0, 4242: 7}
    assert (
        refused(reading)["limits"]
        == 700 * agent_feed.MAX_STEPS_PER_MESSAGE - agent_feed.MAX_STEPS_PER_AGENT_READ
    )
    await send(feed, message(7777, steps=(empty,)))  # a new read: its count starts again
    assert {s.pid for s in (await feed.read()).steps} == {7777}


async def test_engine_cores_made_up_by_one_sender_cannot_take_the_ticks_groups(feed: AgentFeed) -> None:
    fake = [
        message(
            7777, steps=tuple(wire.Steps("vllm", n=0, wall=0, owner=100_000 + 16 * j + i) for i in range(16))
        )
        for j in range(4)
    ]
    await send(feed, *fake)  # 64 engine cores named by one sender: the tick's whole bound once
    ok = wire.Steps("vllm", n=10, wall=10 * MS, running=5)
    await send(feed, message(4242, steps=(ok,)))
    reading = await feed.read()
    got = {s.pid: s.steps for s in reading.steps}
    assert got[4242] == 10  # the real engine core's steps are there
    assert len([p for p in got if p >= 100_000]) == agent_feed.MAX_ENGINES_PER_AGENT
    assert refused(reading)["engines"] == 64 - agent_feed.MAX_ENGINES_PER_AGENT


async def test_untimed_steps_cannot_outrun_the_clock(feed: AgentFeed) -> None:
    s = wire.Steps("vllm", n=1000, wall=10_000 * MS, hist=(0,) * 11 + (1000,))  # 10 s of steps per message
    await send(feed, *(message(4, steps=(s,)) for _ in range(20)))  # all at once
    reading = await feed.read()
    (steps,) = reading.steps
    assert 0 < steps.wall_ns <= agent_feed.STEP_BURST_NS * agent_feed.MAX_STEP_THREADS
    assert refused(reading)["limits"] >= 16


# --- row 3: whatever the bytes, only counted ----------------------------------------------------


async def test_deep_nesting_and_huge_integers_are_bad_messages(feed: AgentFeed) -> None:
    deep = b"[" * 5000 + b"]" * 5000
    huge = b'{"v": 1, "pid": ' + b"9" * 5000 + b', "state": "running"}'
    nested_obj = b'{"v": 1, "pid": 1, "state": "running", "detail": ' + b"[" * 3000 + b"]" * 3000 + b"}"
    await send(feed, deep, huge, nested_obj, message(7))
    reading = await feed.read()
    assert (reading.messages, reading.bad_messages) == (4, 3)
    assert [a.pid for a in reading.agents] == [7]


async def test_a_datagram_over_the_limit_is_bad_not_truncated_into_a_message(feed: AgentFeed) -> None:
    body = wire.encode(wire.Message(pid=8, state="running"))
    padded = body[:-1] + b', "x": "' + b"a" * wire.MAX_DATAGRAM_BYTES + b'"}'
    await send(feed, padded)
    reading = await feed.read()
    assert reading.bad_messages == 1 and reading.agents == ()


# --- row 14: GPUs keyed by UUID ------------------------------------------------------------------


async def test_two_processes_each_with_ordinal_0_are_two_gpus_without_nvml(feed: AgentFeed) -> None:
    a = wire.Message(
        pid=1, state="running", devices=((0, UUID),), windows=(window(T0, [(T0, T0 + 100 * MS)]),)
    )
    b = wire.Message(
        pid=2, state="running", devices=((0, OTHER_UUID),), windows=(window(T0, [(T0, T0 + 300 * MS)]),)
    )
    await send(feed, wire.encode(a), wire.encode(b))
    feed.test_clock.t += 2  # type: ignore[attr-defined]
    reading = await feed.read()
    first = merge(reading, None)
    by_uuid = {x.uuid: (x.gpu, x.busy_ns) for x in first.activity}
    assert by_uuid[UUID][1] == 100 * MS and by_uuid[OTHER_UUID][1] == 300 * MS
    assert by_uuid[UUID][0] != by_uuid[OTHER_UUID][0]
    assert len({s.gpu for s in reading.agents}) == 2
    # stable: the same UUIDs keep their indices in later windows
    w2 = window(T0 + 500 * MS, [(T0 + 500 * MS, T0 + 600 * MS)])
    await send(
        feed,
        wire.encode(a.__class__(pid=2, state="running", devices=((0, OTHER_UUID),), windows=(w2,))),
    )
    feed.test_clock.t += 2  # type: ignore[attr-defined]
    again = {x.uuid: x.gpu for x in merge(await feed.read(), first).activity}
    assert again == {UUID: by_uuid[UUID][0], OTHER_UUID: by_uuid[OTHER_UUID][0]}


# --- row 4: the socket's directory and senders ---------------------------------------------------


async def test_the_socket_directory_is_created_0750_and_the_socket_0660(tmp_path: Path) -> None:
    f = new_feed(tmp_path / "made" / "agent.sock")
    await f.start()
    try:
        assert stat.S_IMODE(os.stat(tmp_path / "made").st_mode) == 0o750
        assert stat.S_IMODE(os.stat(tmp_path / "made" / "agent.sock").st_mode) == 0o660
    finally:
        f.close()


@pytest.mark.parametrize("setup", ["foreign_owner", "world_writable", "symlink"])
async def test_an_unsafe_socket_directory_is_refused_untouched(tmp_path: Path, setup: str) -> None:
    target = tmp_path / "dir"
    target.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("secret")
    victim.chmod(0o600)
    if setup == "foreign_owner":
        os.chown(target, NOBODY, NOBODY)
    elif setup == "world_writable":
        target.chmod(0o777)
    else:
        target.rmdir()
        real = tmp_path / "elsewhere"
        real.mkdir()
        target.symlink_to(real)
    (tmp_path / "dir" / "agent.sock").symlink_to(victim)
    f = new_feed(target / "agent.sock")
    with pytest.raises(SourceUnavailable):
        await f.start()
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600 and victim.read_text() == "secret"
    assert os.path.islink(target / "agent.sock")
    f.close()


def _send_as(uid: int, gid: int, path: str, data: bytes) -> str:
    """Send one datagram from a forked child running as uid:gid; return the child's error text or ''."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to the other user, send, report
        os.close(r)
        error = b""
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                s.sendto(data, path)
        except OSError as exc:
            error = str(exc).encode()
        os.write(w, error)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        error = fh.read().decode()
    os.waitpid(pid, 0)
    return error


@pytest.fixture
def shared_dir(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A directory under /tmp that another user may traverse (pytest's own are 0700)."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="bw-shared-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_a_sender_outside_the_allow_list_is_dropped_and_counted(shared_dir: Path) -> None:
    sock_dir = shared_dir / "run"
    sock_dir.mkdir(mode=0o750)
    os.chown(sock_dir, 0, NOBODY)  # nobody's group may reach the socket...
    f = new_feed(sock_dir / "agent.sock", allowed_groups=("root",), socket_group=str(NOBODY))
    await f.start()  # ...but only root's group is allowed to send
    try:
        fake = message(666, (window(T0, [(T0, T0 + 500 * MS)]),))
        assert _send_as(NOBODY, NOBODY, f.cfg.socket, fake) == ""  # the kernel let it through
        await wait_until_async(lambda: f._arrived >= 1, what="the datagram sent as nobody")
        reading = await f.read()
        assert reading.agents == () and reading.windows == ()
        assert refused(reading)["peer"] == 1 and reading.messages == 1
        await send(f, message(1))  # root is allowed
        assert [a.pid for a in (await f.read()).agents] == [1]
    finally:
        f.close()


async def test_an_allowed_uid_may_send(shared_dir: Path) -> None:
    sock_dir = shared_dir / "run"
    sock_dir.mkdir(mode=0o750)
    os.chown(sock_dir, 0, NOBODY)
    f = new_feed(
        sock_dir / "agent.sock", allowed_uids=("nobody",), allowed_groups=("root",), socket_group="nogroup"
    )
    await f.start()
    try:
        assert _send_as(NOBODY, NOBODY, f.cfg.socket, message(42)) == ""
        await wait_until_async(lambda: f._arrived >= 1, what="the datagram sent as nobody")
        assert [a.pid for a in (await f.read()).agents] == [42]
    finally:
        f.close()


async def test_a_user_outside_the_socket_group_cannot_reach_it(shared_dir: Path) -> None:
    f = new_feed(shared_dir / "private" / "agent.sock")
    await f.start()
    try:
        assert "Permission denied" in _send_as(NOBODY, NOBODY, f.cfg.socket, message(9))
    finally:
        f.close()


# --- row 6: never touch a live socket ------------------------------------------------------------


async def test_a_second_feed_never_unlinks_a_live_socket(feed: AgentFeed) -> None:
    inode = os.stat(feed.cfg.socket).st_ino
    second = new_feed(Path(feed.cfg.socket))
    with pytest.raises(SourceUnavailable, match="another boundwatch"):
        await second.start()
    second.close()
    assert os.stat(feed.cfg.socket).st_ino == inode
    await send(feed, message(5))
    assert [a.pid for a in (await feed.read()).agents] == [5]


async def test_a_live_socket_without_the_lock_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "agent.sock"
    other = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    other.bind(str(path))  # an older daemon that holds no lock file
    try:
        f = new_feed(path)
        with pytest.raises(SourceUnavailable, match="live socket"):
            await f.start()
        f.close()
        other.setblocking(False)
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(b"ping", str(path))
        assert other.recv(16) == b"ping"
    finally:
        other.close()


async def test_a_dead_socket_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "agent.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(str(path))
    dead.close()  # a daemon that was killed: the file stays, nothing reads it
    f = new_feed(path)
    await f.start()
    try:
        await send(f, message(1))
        assert (await f.read()).messages == 1
    finally:
        f.close()
    assert not path.exists()


async def test_a_removed_socket_turns_the_source_down(feed: AgentFeed) -> None:
    os.unlink(feed.cfg.socket)
    with pytest.raises(SourceUnavailable, match="removed or replaced"):
        await feed.read()


def test_peer_credentials_arrive_with_every_datagram(tmp_path: Path) -> None:
    sock, _ = unixsock.bind(str(tmp_path / "s.sock"), None)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(b"x", str(tmp_path / "s.sock"))
        data, peer, truncated = unixsock.receive_one(sock, 16)
        assert data == b"x" and not truncated
        assert peer == unixsock.Peer(os.getpid(), os.getuid(), os.getgid())
    finally:
        sock.close()
