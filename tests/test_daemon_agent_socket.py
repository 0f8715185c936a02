"""The real daemon against hostile agent datagrams on its real unix socket (issue 10 rows 1-6 and 14)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter import wire
from tests.fakes.promserver import ROOT, Daemon, free_port, http_get, running_daemon
from tests.fakes.wait import wait_until

pytestmark = pytest.mark.timeout(180)
NOBODY = 65534
MS = 1_000_000
UUID_A = "GPU-6f5e2c1a-0b7d-4c39-9d0e-2f1a3b4c5d6e"
UUID_B = "GPU-0a1b2c3d-0000-4000-8000-0123456789ab"


def aligned_window(busy_ns: int, back_s: float = 1.0, dev: int = 0) -> wire.Window:
    """Return a 0.5 s window that closed `back_s` ago, busy for its first `busy_ns`."""
    t0 = (time.time_ns() - int(back_s * 1e9)) // (500 * MS) * (500 * MS)
    packed, slack = wire.pack_intervals([(t0, t0 + busy_ns)], t0)
    return wire.Window(dev=dev, t0=t0, t1=t0 + 500 * MS, busy=busy_ns, iv=packed, slack=slack)


def blast(path: str, datagrams: Iterator[bytes] | list[bytes]) -> int:
    """Send every datagram, waiting while the daemon's receive queue is full; return how many."""
    n = 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.setblocking(False)
        for d in datagrams:
            deadline = time.monotonic() + 10
            while True:
                try:
                    s.sendto(d, path)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.0005)
            n += 1
    return n


def samples(page: str, name: str) -> dict[str, float]:
    """Return {label text: value} of one family's samples on a /metrics page."""
    out = {}
    for m in re.finditer(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", page, flags=re.M):
        out[m.group(1) or ""] = float(m.group(2))
    return out


def scrape(daemon: Daemon) -> str:
    status, body = http_get(daemon.metrics_url, timeout=30)
    assert status == 200
    return body.decode()


def wait_for(daemon: Daemon, name: str, labels: str, at_least: float, timeout: float = 15) -> str:
    """Scrape until a sample reaches a value and return the page; fail the test after `timeout` s."""
    last = [""]

    def reached() -> str:
        last[0] = scrape(daemon)
        return last[0] if samples(last[0], name).get(labels, -1) >= at_least else ""

    return wait_until(
        reached, timeout, 0.25, lambda: f"{name}{labels} >= {at_least}: {samples(last[0], name)}"
    )


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory under /tmp another user may traverse (pytest's own are 0700)."""
    path = Path(tempfile.mkdtemp(prefix="bw-daemon-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def send_as(uid: int, gid: int, path: str | None, data: bytes, run_dir: str | None = None) -> tuple[str, str]:
    """From a forked child running as uid:gid, send one datagram (to the agents' default path when
    `path` is None, chosen as that user); return (the path used, the error text or '')."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        used, error = "", ""
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            used = path or (wire.default_agent_socket(run_dir) if run_dir else wire.default_agent_socket())
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                s.sendto(data, used)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        os.write(w, f"{used}\n{error}".encode())
        os._exit(0)  # never returns into pytest
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        used, _, error = fh.read().decode().partition("\n")
    os.waitpid(pid, 0)
    return used, error


def agent_message(pid: int, uuid: str, busy_ns: int, **kw: object) -> bytes:
    return wire.encode(
        wire.Message(pid=pid, state="running", devices=((0, uuid),), windows=(aligned_window(busy_ns),), **kw)  # type: ignore[arg-type]
    )


# --- row 1 -------------------------------------------------------------------------------------


def test_10k_datagrams_with_new_devices_and_engines_leave_series_and_memory_bounded(tmp_path: Path) -> None:
    no_discovery = {"BOUNDWATCH_ENGINE__DISCOVER": "false"}  # engines elsewhere on this host add series
    with running_daemon(tmp_path, engine_pages=(), extra_env=no_discovery) as daemon:
        sock = str(tmp_path / "agent.sock")
        time.sleep(1.0)
        before_page = scrape(daemon)
        before = rss_kib(daemon.proc.pid)

        def flood() -> Iterator[bytes]:
            for i in range(10_000):
                w = aligned_window(MS, dev=i % 250)
                st = wire.Steps(f"engine-{i}", n=1, wall=MS, t0=w.t0, t1=w.t0 + MS, hist=(1,) + (0,) * 11)
                yield wire.encode(
                    wire.Message(
                        pid=200_000 + i,
                        state="running",
                        devices=((i % 250, f"GPU-{i:08d}-fake"),),
                        windows=(w,),
                        steps=(st,),
                    )
                )

        assert blast(sock, flood()) == 10_000

        def accounted() -> str:
            # each datagram taken, or dropped and counted where the event loop fell behind the reader (a
            # loaded machine: the inbox holds INBOX_HOLD x INBOX_MAX, then drops, never blocks the agents)
            page = scrape(daemon)
            taken = samples(page, "boundwatch_agent_messages_total").get("", 0)
            dropped = samples(page, "boundwatch_agent_refused_total").get('{reason="inbox"}', 0)
            return page if taken + dropped >= 10_000 else ""

        page = wait_until(accounted, 30, 0.25, "10,000 datagrams taken or dropped as late")
        after = rss_kib(daemon.proc.pid)
    series = [line for line in page.splitlines() if line and not line.startswith("#")]
    base = [line for line in before_page.splitlines() if line and not line.startswith("#")]
    taken = samples(page, "boundwatch_agent_messages_total")[""]
    dropped = samples(page, "boundwatch_agent_refused_total").get('{reason="inbox"}', 0)
    assert taken + dropped == 10_000 and taken >= 5_000, (taken, dropped)  # none lost uncounted
    assert len(series) - len(base) < 4_000, f"{len(series) - len(base)} new series"
    assert len(page) < 1_000_000
    gpus = set(re.findall(r'gpu="(\d+)"', page))
    assert len(gpus) <= 64
    engines = set(re.findall(r'engine="(engine-\d+)"', page))  # the names the flood sent
    assert len(engines) <= 32
    refused = samples(page, "boundwatch_agent_refused_total")
    assert refused['{reason="agents"}'] > 0 and refused['{reason="engines"}'] > 0
    assert after - before < 64 * 1024, f"RSS grew {(after - before) / 1024:.0f} MiB"


# --- row 2 -------------------------------------------------------------------------------------


def test_one_datagram_cannot_poison_the_counters(tmp_path: Path) -> None:
    poison = [
        b'{"v":1,"pid":1,"state":"running","windows":[{"dev":0,"t0":1,"t1":'
        + str(1 + 2**63).encode()
        + b',"busy":'
        + str(2**62).encode()
        + b"}]}",
        wire.encode(  # within the integer bounds, but 2**60 ns long and far in the future
            wire.Message(
                pid=2, state="running", windows=(wire.Window(dev=0, t0=2**61, t1=2**61 + 2**60, busy=2**59),)
            )
        ),
        wire.encode(  # a million steps in a millisecond
            wire.Message(
                pid=3,
                state="running",
                steps=(
                    wire.Steps(
                        "vllm",
                        n=10**6,
                        wall=2**61,
                        t0=time.time_ns() - MS,
                        t1=time.time_ns(),
                        hist=(0,) * 11 + (10**6,),
                    ),
                ),
            )
        ),
    ]
    with running_daemon(tmp_path, engine_pages=()) as daemon:
        started = time.monotonic()
        blast(str(tmp_path / "agent.sock"), poison)
        blast(str(tmp_path / "agent.sock"), [agent_message(4, UUID_A, 100 * MS)])
        page = wait_for(daemon, "boundwatch_agent_messages_total", "", 4)
        elapsed = time.monotonic() - started
    busy = samples(page, "boundwatch_gpu_busy_seconds_total")
    assert busy and max(busy.values()) <= elapsed
    steps = {k: v for k, v in samples(page, "boundwatch_engine_steps_total").items() if 'method="agent"' in k}
    assert all(v < 1000 for v in steps.values())
    assert samples(page, "boundwatch_agent_bad_messages_total")[""] >= 1
    refused = samples(page, "boundwatch_agent_refused_total")
    assert refused['{reason="limits"}'] + refused['{reason="clock"}'] >= 2


def test_an_agents_rejected_settings_are_counted_per_gpu_and_a_count_past_any_agents_is_refused(
    tmp_path: Path,
) -> None:
    """An agent whose BOUNDWATCH_AGENT_* values were out of bounds says how many; the sidecar shows them."""
    over = json.loads(agent_message(6, UUID_A, 100 * MS))
    over["settings_rejected"] = wire.MAX_SETTINGS_REJECTED + 1
    with running_daemon(tmp_path, engine_pages=()) as daemon:
        blast(
            str(tmp_path / "agent.sock"),
            [agent_message(5, UUID_A, 100 * MS, settings_rejected=2), json.dumps(over).encode()],
        )
        page = wait_for(daemon, "boundwatch_agent_settings_rejected", '{gpu="0"}', 2)
    assert samples(page, "boundwatch_agent_settings_rejected") == {'{gpu="0"}': 2}
    assert samples(page, "boundwatch_agent_bad_messages_total")[""] == 1


def test_what_an_agent_could_not_send_while_the_queue_was_full_is_shown_per_gpu(tmp_path: Path) -> None:
    """The real Sender drops rather than blocks once a sidecar's socket queue is full; its next message says so."""
    from exporter.agent.sender import Sender

    full = tmp_path / "full.sock"  # a sidecar that does not read: its queue fills (net.unix.max_dgram_qlen)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as stuck:
        stuck.bind(str(full))
        sender = Sender(str(full))
        went = sum(sender.send_data(agent_message(7, UUID_A, 100 * MS)) for _ in range(200))
    assert 0 < went < 200 and sender.dropped == 200 - went and sender.sent == went
    with running_daemon(tmp_path, engine_pages=()) as daemon:
        sender.path = str(tmp_path / "agent.sock")  # the same agent, now heard by a live sidecar
        assert sender.send_data(agent_message(7, UUID_A, 100 * MS, sent_dropped=sender.dropped))
        page = wait_for(daemon, "boundwatch_agent_unsent_messages", '{gpu="0"}', 200 - went)
    sender.close()
    assert samples(page, "boundwatch_agent_unsent_messages") == {'{gpu="0"}': 200 - went}


def test_the_stale_steps_agents_dropped_are_summed_per_gpu_and_a_bad_count_is_refused(tmp_path: Path) -> None:
    """Each message says how many step records its agent dropped as stale since it started; /metrics sums them."""
    bad = json.loads(agent_message(9, UUID_A, 100 * MS))
    bad["steps_stale"] = -1
    with running_daemon(tmp_path, engine_pages=()) as daemon:
        blast(
            str(tmp_path / "agent.sock"),
            [
                agent_message(5, UUID_A, 100 * MS, steps_stale=1),
                agent_message(8, UUID_B, 100 * MS, steps_stale=5),
                agent_message(5, UUID_A, 100 * MS, steps_stale=3),  # the same agent's newer count stands
                json.dumps(bad).encode(),
                agent_message(7, UUID_A, 100 * MS, steps_stale=4, sent_dropped=2),
            ],
        )

        def summed() -> str:
            page = scrape(daemon)
            return page if sorted(samples(page, "boundwatch_agent_stale_steps").values()) == [5, 7] else ""

        page = wait_until(summed, 15, 0.25, "GPU A's agents' stale steps summed (3 + 4), GPU B's 5")
    stale = samples(page, "boundwatch_agent_stale_steps")
    a = next(gpu for gpu, n in stale.items() if n == 7)  # the pipeline gives each UUID its index
    assert set(stale) == {'{gpu="0"}', '{gpu="1"}'}
    assert samples(page, "boundwatch_agent_unsent_messages") == {gpu: 2 if gpu == a else 0 for gpu in stale}
    assert samples(page, "boundwatch_agent_bad_messages_total")[""] == 1


@pytest.mark.parametrize("role", ["generic", "vllm_engine"])  # vLLM's EngineCore: its steps, no GPU
def test_a_light_agents_stale_steps_dropped_after_a_long_stop_reach_metrics(
    tmp_path: Path, role: str
) -> None:
    """The real light agent drops a step record that ended 400 s ago and its next message carries the count."""
    from exporter.agent.light import LightAgent
    from exporter.agent.settings import Settings

    with running_daemon(tmp_path, engine_pages=()) as daemon:
        agent = LightAgent(Settings(socket=str(tmp_path / "agent.sock"), role=role, flush_s=0.05))
        ended = time.time_ns() - 400 * 10**9  # a step before a stop of 400 s, taken at the agent's first tick
        agent.steps.record("vllm", ended - 10 * MS, ended, tokens=8, seqs=8)
        agent.start()
        try:
            page = wait_for(daemon, "boundwatch_agent_stale_steps", '{gpu=""}', 1)
        finally:
            agent.stop()
    assert agent.steps_stale == 1
    assert samples(page, "boundwatch_agent_stale_steps") == {'{gpu=""}': 1}  # no CUDA in this process: no GPU


def test_light_agents_are_counted_for_the_gpu_their_graph_counts_name(tmp_path: Path) -> None:
    """Two GPU workers' light agents (no windows) on two stand-in GPUs: each under its own GPU on /metrics.

    Before, every light agent counted under gpu="", so BoundwatchAgentMissing (per gpu) could not see
    one of eight workers' agents go. One that names no device yet stays under "".
    """
    from tests.fakes.standin_daemon import standin_daemon

    now = time.time_ns()

    def light(pid: int, uuid: str, dev: int) -> bytes:
        graphs = wire.GraphCounts(t0=now - 500 * MS, t1=now, replays=40, captures=1, dev=dev, uuid=uuid)
        return wire.encode(
            wire.Message(pid=pid, state="running", role="vllm_worker", mode="light", graphs=graphs)
        )

    second = (
        "GPU-8f3c0d5e-0000-0000-0000-000000000002"  # the stand-in's GPU 1 (tests/fakes/standin_daemon.py)
    )
    with standin_daemon(tmp_path, gpus=2) as daemon:

        def placed() -> str:
            blast(str(tmp_path / "agent.sock"), [light(41, second, 0), light(42, "", -1)])
            page = scrape(daemon)
            return page if samples(page, "boundwatch_agents").get('{gpu="1",state="running"}') == 1 else ""

        page = wait_until(placed, 15, 0.25, "the light agent on the stand-in's GPU 1 counted there")
    running = {k: v for k, v in samples(page, "boundwatch_agents").items() if 'state="running"' in k}
    assert running == {'{gpu="",state="running"}': 1, '{gpu="1",state="running"}': 1}


_NAMESPACED_SENDER = """
import os, socket, sys, time
from exporter import wire
assert os.getpid() == 1, os.getpid()  # PID 1 of a namespace of its own, as an engine container's first process
data = wire.encode(wire.Message(pid=os.getpid(), state="running", mode="light"))
with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
    for _ in range(60):  # a message every 0.25 s until killed
        s.sendto(data, sys.argv[1])
        time.sleep(0.25)
"""


@pytest.mark.skipif(
    shutil.which("unshare") is None or os.geteuid() != 0, reason="needs unshare and root for PID namespaces"
)
def test_two_containers_agents_that_both_say_pid_1_are_two_agents(tmp_path: Path) -> None:
    """Two senders, each PID 1 of a PID namespace of its own, both say pid 1: the daemon tells them apart.

    Before, both were one agent (keyed by the pid each message states); now an agent whose message's pid
    is its pid in another namespace is keyed by the pid this daemon sees (the kernel's peer).
    """
    with running_daemon(tmp_path, engine_pages=()) as daemon:
        sock = str(tmp_path / "agent.sock")
        cmd = ["unshare", "--pid", "--kill-child", sys.executable, "-c", _NAMESPACED_SENDER, sock]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        senders = [subprocess.Popen(cmd, env=env) for _ in range(2)]
        try:

            def two() -> str:
                page = scrape(daemon)
                return page if samples(page, "boundwatch_agents").get('{gpu="",state="running"}') == 2 else ""

            page = wait_until(two, 15, 0.25, "two running agents from the two namespaces")
        finally:
            for p in senders:
                p.kill()
                p.wait(5)
    assert samples(page, "boundwatch_agent_messages_total")[""] >= 2
    assert samples(page, "boundwatch_agent_bad_messages_total")[""] == 0


# --- row 3 -------------------------------------------------------------------------------------


def test_malformed_datagrams_are_counted_and_logged_rarely(tmp_path: Path) -> None:
    deep = b"[" * 5000 + b"]" * 5000
    huge = b'{"v": 1, "pid": ' + b"9" * 5000 + b', "state": "running"}'
    with running_daemon(tmp_path, engine_pages=()) as daemon:
        log_before = daemon.log.stat().st_size
        cpu_before = sum(os.times()[:2])
        blast(str(tmp_path / "agent.sock"), [deep if i % 2 else huge for i in range(10_000)])
        page = wait_for(daemon, "boundwatch_agent_bad_messages_total", "", 10_000, timeout=30)
        del cpu_before
        log_growth = daemon.log.stat().st_size - log_before
        log_text = daemon.log.read_text()
    assert samples(page, "boundwatch_agent_bad_messages_total")[""] == 10_000
    assert log_growth < 20_000, f"{log_growth} bytes of log for 10,000 bad datagrams"
    assert "Traceback" not in log_text and "agent_bad_message" in log_text


# --- row 4 -------------------------------------------------------------------------------------


def test_another_user_outside_the_allow_list_is_refused_and_counted(shared_dir: Path) -> None:
    workdir = shared_dir / "d"
    workdir.mkdir(mode=0o750)
    os.chown(workdir, 0, NOBODY)  # nobody's group may reach the socket; the allow-list says root only
    env = {"BOUNDWATCH_AGENT__ALLOWED_GROUPS": "root", "BOUNDWATCH_AGENT__SOCKET_GROUP": str(NOBODY)}
    with running_daemon(workdir, engine_pages=(), extra_env=env) as daemon:
        sock = str(workdir / "agent.sock")
        fake = agent_message(666, UUID_A, 500 * MS)
        for _ in range(3):
            _, error = send_as(NOBODY, NOBODY, sock, fake)
            assert error == ""  # the file system let it through...
        page = wait_for(daemon, "boundwatch_agent_refused_total", '{reason="peer"}', 3)
    assert samples(page, "boundwatch_agent_refused_total")['{reason="peer"}'] == 3  # ...the daemon did not
    assert not samples(page, "boundwatch_gpu_busy_seconds_total")
    assert not samples(page, "boundwatch_agents")


def test_by_default_other_users_cannot_reach_the_socket(shared_dir: Path) -> None:
    workdir = shared_dir / "d"
    with running_daemon(workdir, engine_pages=()) as daemon:
        sock = workdir / "agent.sock"
        assert sock.stat().st_mode & 0o777 == 0o660
        _, error = send_as(NOBODY, NOBODY, str(sock), agent_message(666, UUID_A, 500 * MS))
        time.sleep(1.0)
        page = scrape(daemon)
    assert "Permission denied" in error
    assert not samples(page, "boundwatch_gpu_busy_seconds_total")


# --- row 5 -------------------------------------------------------------------------------------


@pytest.fixture
def run_boundwatch() -> Iterator[Path]:
    """/run/boundwatch as the unit makes it (0750, a group engine users join: nogroup stands in)."""
    run = Path("/run/boundwatch")
    if run.exists() or os.geteuid() != 0:
        pytest.skip("/run/boundwatch exists (a real installation) or not root")
    run.mkdir(mode=0o750)
    os.chown(run, 0, NOBODY)
    try:
        yield run
    finally:
        shutil.rmtree(run, ignore_errors=True)


def test_an_agent_of_another_user_in_the_group_finds_the_units_socket(run_boundwatch: Path) -> None:
    sock = run_boundwatch / "agent.sock"
    with running_daemon(run_boundwatch, engine_pages=()) as daemon:  # it binds <workdir>/agent.sock
        used, error = send_as(NOBODY, NOBODY, None, agent_message(77, UUID_A, 200 * MS))
        page = wait_for(daemon, "boundwatch_agent_messages_total", "", 1)
    assert (used, error) == (str(sock), "")
    assert samples(page, "boundwatch_agent_messages_total")[""] == 1
    assert samples(page, "boundwatch_agents").get('{gpu="0",state="running"}') == 1


def report_as(uid: int, gid: int) -> dict[str, object]:
    """Return agent-check's socket report as seen by uid:gid (a forked child)."""
    from exporter.commands.agent_check import socket_report

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: as another user, ask where an agent would send
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            os.write(w, json.dumps(socket_report()).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as fh:
        report = json.loads(fh.read())
    os.waitpid(pid, 0)
    return dict(report)


def test_agent_check_says_where_an_agent_sends_and_why(run_boundwatch: Path) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(run_boundwatch / "agent.sock"))
    os.chmod(run_boundwatch / "agent.sock", 0o660)
    os.chown(run_boundwatch / "agent.sock", 0, NOBODY)
    try:
        member = report_as(NOBODY, NOBODY)
        outsider = report_as(NOBODY, 1)  # same user, not in the socket's group
    finally:
        sock.close()
    assert member["socket"] == str(run_boundwatch / "agent.sock")
    assert "may send" in str(member["socket_reason"]) and member["sidecar_listening"] is True
    assert "join its group" in str(outsider["socket_reason"]) and outsider["sidecar_listening"] is False


# --- row 6 -------------------------------------------------------------------------------------


def test_a_second_start_never_takes_a_live_daemons_socket(tmp_path: Path) -> None:
    with running_daemon(tmp_path, engine_pages=()) as daemon:
        sock = tmp_path / "agent.sock"
        inode = sock.stat().st_ino
        second = subprocess.run(
            [
                sys.executable,
                "-m",
                "exporter",
                "run",
                "--address",
                "127.0.0.1",
                "--port",
                str(daemon.port),
                "--agent-socket",
                str(sock),
                "--log-format",
                "json",
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert second.returncode != 0
        recorded = subprocess.run(  # sampling locally while the daemon runs: must not touch its socket
            [
                sys.executable,
                "-m",
                "exporter",
                "record",
                str(tmp_path / "rec.jsonl"),
                "--local",
                "--seconds",
                "1",
                "--agent-socket",
                str(sock),
                "--port",
                str(free_port()),
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert sock.stat().st_ino == inode
        blast(str(sock), [agent_message(9, UUID_A, 100 * MS)])
        page = wait_for(daemon, "boundwatch_agent_messages_total", "", 1)
    assert samples(page, "boundwatch_agent_messages_total")[""] == 1, recorded.stderr.decode()[-2000:]
    assert b"another boundwatch" in second.stdout + second.stderr


# --- row 14 ------------------------------------------------------------------------------------


def _both_busy(daemon: Daemon) -> str:
    """Return the page once two GPUs have CUPTI busy seconds (each agent's window merged), else ""."""
    page = scrape(daemon)
    busy = [v for k, v in samples(page, "boundwatch_gpu_busy_seconds_total").items() if "cupti" in k]
    return page if len(busy) == 2 and all(v > 0 for v in busy) else ""


def test_two_agents_each_on_ordinal_0_are_two_gpus_without_nvml(tmp_path: Path) -> None:
    with running_daemon(tmp_path, engine_pages=(), extra_env={"BOUNDWATCH_NVML__ENABLED": "false"}) as daemon:
        blast(
            str(tmp_path / "agent.sock"),
            [agent_message(1, UUID_A, 100 * MS), agent_message(2, UUID_B, 300 * MS)],
        )
        wait_for(daemon, "boundwatch_agent_messages_total", "", 2)
        page = wait_until(lambda: _both_busy(daemon), interval=0.1, what="both agents' busy on the page")
    busy = {k: v for k, v in samples(page, "boundwatch_gpu_busy_seconds_total").items() if "cupti" in k}
    assert sorted(busy.values()) == pytest.approx([0.1, 0.3])
    assert len(busy) == 2
    agents = samples(page, "boundwatch_agents")
    assert sum(v for k, v in agents.items() if "running" in k) == 2
    assert len([k for k, v in agents.items() if "running" in k and v == 1]) == 2
