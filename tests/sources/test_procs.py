"""The process table: stat parsing, command lines, environments, and CPU per process and thread."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from engine_fixtures import PROC
from make_fixtures import stat_line

from exporter.snapshot.engine import demand
from exporter.sources import procs
from tests.fakes.wait import wait_until


def test_stat_with_spaces_and_parentheses_in_the_name_parses():
    s = procs.parse_stat((PROC / "4101" / "task" / "4111" / "stat").read_text())
    assert s is not None
    assert (s.comm, s.ppid, s.cpu_ticks, s.start_ticks) == ("asyncio (0)", 4100, 950, 54101)


def test_a_titled_process_shows_its_title_without_padding():
    info = procs.proc_info(str(PROC), 4101)
    assert info is not None
    assert info.title == "VLLM::APIServer_0"
    assert info.comm == "VLLM::APIServer"  # the kernel keeps 15 characters


def test_environment_of_a_child_holds_the_multiprocess_dir():
    assert procs.read_environ(str(PROC), 4101)["PROMETHEUS_MULTIPROC_DIR"] == "/tmp/vllm-mp-a1"
    assert procs.read_environ(str(PROC), 99999) == {}


def test_find_by_title_comm_or_command_line_words():
    found = procs.find(str(PROC), lambda p: procs.matches(p, title_prefix="VLLM::APIServer"))
    assert [p.pid for p in found] == [4101, 4102, 4601, 4602]
    found = procs.find(str(PROC), lambda p: procs.matches(p, cmdline_has=["vllm", "serve"]))
    assert [p.pid for p in found] == [4100, 4700]  # "train.py --vllm serve" is not vllm
    assert [p.pid for p in procs.find(str(PROC), lambda p: procs.matches(p, comm="systemd"))] == [1]


def test_cgroup_of_a_process_comes_from_its_cgroup_file():
    assert procs.cgroup_of(str(PROC), 4103) == "/kubepods.slice/pod-a/ctr-vllm/engine"
    assert procs.cgroup_of(str(PROC), 99999) == "/"


def test_descendants_walk_the_whole_tree():
    table = list(procs.processes(str(PROC)))
    assert sorted(p.pid for p in procs.descendants(table, 4100)) == [4101, 4102, 4103, 4104, 4105]
    assert [p.pid for p in procs.children(table, 4103)] == [4105]


def test_cpu_is_the_tick_delta_over_wall_time_per_process_and_thread(tmp_path):
    root = tmp_path / "proc"
    shutil.copytree(PROC, root, symlinks=True)
    now = [100.0]
    tracker = procs.CpuTracker(str(root), clock=lambda: now[0])
    info = procs.proc_info(str(root), 4101)
    assert tracker.sample([info]) == {}  # the first sample is the baseline
    hz = procs.CLK_TCK
    # 0.5 s later: the process used 0.45 s (0.4 s in asyncio (0), 0.05 s in the main thread).
    (root / "4101" / "stat").write_text(
        stat_line(4101, "VLLM::APIServer", 4100, 1000 + 4101 % 97 + int(0.45 * hz), 200, 54101)
    )
    (root / "4101" / "task" / "4111" / "stat").write_text(
        stat_line(4111, "asyncio (0)", 4100, 900 + int(0.4 * hz), 50, 54101)
    )
    main = root / "4101" / "task" / "4101" / "stat"
    s = procs.parse_stat(main.read_text())
    main.write_text(stat_line(4101, "VLLM::APIServer", 4100, s.cpu_ticks - 150 + int(0.05 * hz), 150, 54101))
    now[0] += 0.5
    cpu = tracker.sample([info])[4101]
    assert cpu.cpu == pytest.approx(0.9)
    assert cpu.busiest_thread is not None
    assert (cpu.busiest_thread.name, cpu.busiest_thread.cpu) == ("asyncio (0)", pytest.approx(0.8))
    assert {t.tid for t in cpu.threads} == {4101, 4111}
    assert all(t.runnable is None for t in cpu.threads)  # no schedstat in this tree: demand is the CPU
    assert demand(cpu) == pytest.approx(0.8)


def test_demand_adds_run_queue_wait_to_time_on_cpu(tmp_path):
    root = tmp_path / "proc"
    shutil.copytree(PROC, root, symlinks=True)
    sched = root / "4101" / "task" / "4111" / "schedstat"
    sched.write_text("1000000000 500000000 10\n")
    now = [0.0]
    tracker = procs.CpuTracker(str(root), clock=lambda: now[0])
    info = procs.proc_info(str(root), 4101)
    tracker.sample([info])
    sched.write_text("1300000000 680000000 20\n")  # 0.3 s running, 0.18 s waiting for a CPU
    now[0] += 0.5
    thread = next(t for t in tracker.sample([info])[4101].threads if t.tid == 4111)
    assert thread.runnable == pytest.approx(0.96)


def test_a_reused_pid_starts_a_new_baseline(tmp_path):
    root = tmp_path / "proc"
    shutil.copytree(PROC, root, symlinks=True)
    now = [0.0]
    tracker = procs.CpuTracker(str(root), clock=lambda: now[0])
    info = procs.proc_info(str(root), 4102)
    tracker.sample([info])
    (root / "4102" / "stat").write_text(stat_line(4102, "other", 1, 5, 5, 999_999))  # a new process, same pid
    now[0] += 0.5
    assert tracker.sample([info]) == {}


def test_skipping_the_stat_of_threads_that_did_not_run_gives_the_figures_of_a_full_read(tmp_path):
    root = tmp_path / "proc"
    shutil.copytree(PROC, root, symlinks=True)
    task = root / "4101" / "task"
    for tid in (4101, 4111):
        (task / str(tid) / "schedstat").write_text("1000000000 500000000 10\n")
    now = [0.0]
    cheap = procs.CpuTracker(str(root), clock=lambda: now[0])
    full = procs.CpuTracker(str(root), clock=lambda: now[0], full_every=0.0)  # every stat, every tick
    info = procs.proc_info(str(root), 4101)
    assert cheap.sample([info]) == full.sample([info]) == {}
    hz = procs.CLK_TCK
    for k in range(1, 6):  # asyncio (0) runs 0.3 s of each 0.5 s tick and waits 0.1 s; the main thread sleeps
        (task / "4111" / "stat").write_text(
            stat_line(4111, "asyncio (0)", 4100, 900 + k * int(0.3 * hz), 50, 54101)
        )
        (task / "4111" / "schedstat").write_text(
            f"{1_000_000_000 + k * 300_000_000} {500_000_000 + k * 100_000_000} 10\n"
        )
        (task / "4101" / "schedstat").write_text(
            f"1000000000 {500_000_000 + k * 50_000_000} 10\n"
        )  # waited, never ran
        now[0] += 0.5
        a, b = cheap.sample([info]), full.sample([info])
        assert a == b
        busiest = a[4101].busiest_thread
        assert busiest is not None and (busiest.name, busiest.cpu) == ("asyncio (0)", pytest.approx(0.6))
        assert demand(a[4101]) == pytest.approx(0.8)
    assert full.stat_reads == 12  # 2 threads x 6 samples
    assert cheap.stat_reads == 2 + 5  # both at the baseline, then only the thread that ran


def test_a_thread_renamed_while_idle_is_seen_at_the_next_full_read(tmp_path):
    root = tmp_path / "proc"
    shutil.copytree(PROC, root, symlinks=True)
    sched = root / "4101" / "task" / "4111" / "schedstat"
    sched.write_text("1000000000 500000000 10\n")
    now = [0.0]
    tracker = procs.CpuTracker(str(root), clock=lambda: now[0], full_every=2.0)
    info = procs.proc_info(str(root), 4101)
    tracker.sample([info])
    (root / "4101" / "task" / "4111" / "stat").write_text(stat_line(4111, "renamed", 4100, 900, 50, 54101))
    names = []
    for _ in range(5):
        now[0] += 0.5
        names.append(next(t.name for t in tracker.sample([info])[4101].threads if t.tid == 4111))
    assert names == ["asyncio (0)"] * 3 + ["renamed"] * 2


def test_a_reused_pid_is_named_by_its_new_title(tmp_path):
    root = tmp_path / "proc"
    shutil.copytree(PROC, root, symlinks=True)
    now = [0.0]
    tracker = procs.CpuTracker(str(root), clock=lambda: now[0])
    old = procs.proc_info(str(root), 4102)
    assert old is not None
    (root / "4102" / "stat").write_text(stat_line(4102, "other", 1, 5, 5, 999_999))
    (root / "4102" / "cmdline").write_bytes(b"other\0--flag\0")
    tracker.sample([old])
    now[0] += 0.5
    cpu = tracker.sample([old])[4102]
    assert (cpu.name, cpu.cmdline) == ("other", ("other", "--flag"))


def test_the_table_reads_only_new_reparented_and_young_processes(tmp_path):
    root = tmp_path / "proc"
    shutil.copytree(PROC, root, symlinks=True)
    (root / "uptime").write_text("100000.00 1.00\n")  # every fixture process started long ago
    table = procs.ProcessTable(str(root))
    assert table.refresh() is True
    first = table.reads
    assert first == len(list(procs.processes(str(root)))) == len(table.rows)
    assert table.refresh() is False and table.reads == first  # nothing changed: nothing read
    shutil.copytree(root / "4102", root / "4900")  # a new process
    (root / "4900" / "stat").write_text(stat_line(4900, "new", 4100, 1, 1, 100000 * procs.CLK_TCK - 50))
    assert table.refresh() is True and table.reads == first + 1
    assert table.rows[4900].comm == "new"
    assert table.refresh() is False and table.reads == first + 2  # young (0.5 s old): read again
    shutil.rmtree(root / "4103")  # 4105's parent exits; the kernel re-parents 4105 to init
    (root / "4105" / "stat").write_text(stat_line(4105, "orphan", 1, 1, 1, 54105))
    assert table.refresh() is True
    assert 4103 not in table.rows and table.rows[4105].ppid == 1
    assert table.reads == first + 2 + 2  # the orphan and the young one
    assert [p.pid for p in procs.processes(str(root))] == sorted(table.rows)


class Server:
    """An API server in a /proc tree: each thread's utime (clock ticks) and schedstat, the process's sum."""

    PID = 5000

    def __init__(self, root, threads: int) -> None:
        self.root = root
        self.ticks = dict.fromkeys(range(self.PID, self.PID + threads), 0)
        self.run = dict.fromkeys(self.ticks, 0)
        self.wait = dict.fromkeys(self.ticks, 0)
        (root / "uptime").write_text("100000.00 1.00\n")
        (root / str(self.PID) / "cmdline").parent.mkdir(parents=True)
        (root / str(self.PID) / "cmdline").write_bytes(b"VLLM::APIServer_0\0")
        self.write()

    def tick(self, cpu: dict[int, float], wait: dict[int, float] | None = None) -> None:
        """Let each thread run `cpu` and wait `wait` of a 0.5 s tick."""
        for tid, share in cpu.items():
            self.ticks[tid] += round(share * 0.5 * procs.CLK_TCK)
            self.run[tid] += round(share * 0.5e9)
        for tid, share in (wait or {}).items():
            self.wait[tid] += round(share * 0.5e9)
        self.write()

    def write(self) -> None:
        d = self.root / str(self.PID)
        (d / "stat").write_text(stat_line(self.PID, "VLLM::APIServer", 1, sum(self.ticks.values()), 0, 54000))
        for tid, ticks in self.ticks.items():
            (d / "task" / str(tid)).mkdir(parents=True, exist_ok=True)
            (d / "task" / str(tid) / "stat").write_text(stat_line(tid, f"t{tid}", 1, ticks, 0, 54000))
            (d / "task" / str(tid) / "schedstat").write_text(f"{self.run[tid]} {self.wait[tid]} 1\n")


def saturation(cpu: procs.ProcessCpu) -> tuple[float, float | None]:
    """Return what the verdict reads of an API server: its busiest thread's CPU and its demand."""
    assert cpu.busiest_thread is not None
    return round(cpu.busiest_thread.cpu, 9), None if demand(cpu) is None else round(demand(cpu) or 0.0, 9)


def test_hot_threads_each_tick_give_the_saturation_of_reading_every_thread_as_the_hot_one_moves(tmp_path):
    server = Server(tmp_path, threads=8)
    a, b, c = server.PID, server.PID + 1, server.PID + 5
    now = [0.0]
    hot = procs.CpuTracker(str(tmp_path), clock=lambda: now[0], hot_every=5.0)
    every = procs.CpuTracker(str(tmp_path), clock=lambda: now[0])
    info = procs.proc_info(str(tmp_path), server.PID)
    assert info is not None
    # (each thread's CPU share this tick, its run-queue wait): A saturated, then B takes over at
    # once, then C creeps up from idle past B, then everything idles, then A again with wait.
    script: list[tuple[dict[int, float], dict[int, float]]] = (
        [({a: 0.96, b: 0.02}, {a: 0.03})] * 4
        + [({a: 0.02, b: 0.98}, {})] * 3
        + [({b: 0.5, c: 0.1 * k}, {}) for k in range(1, 8)]
        + [({}, {})] * 3
        + [({a: 0.9}, {a: 0.08})] * 3
    )
    assert hot.sample([info]) == every.sample([info]) == {}
    for k, (cpu, wait) in enumerate(script):
        server.tick(cpu, wait)
        now[0] += 0.5
        got, want = hot.sample([info])[server.PID], every.sample([info])[server.PID]
        assert got.cpu == want.cpu
        if k == len(script) - 3:
            # A comes back from outside the hot set: its CPU is exact at once, its run-queue wait
            # (known only since its last read, seconds ago) from the next tick on
            assert saturation(got) == (saturation(want)[0], saturation(want)[0])
            assert saturation(got)[1] <= saturation(want)[1]
            continue
        assert saturation(got) == saturation(want), (k, cpu, wait)
    listings = hot.listings
    assert hot.schedstat_reads < every.schedstat_reads / 2  # most ticks read 2 of the 8 threads
    assert listings < len(script) / 2


def test_a_thread_outside_the_hot_set_that_turns_busy_makes_that_tick_read_every_thread(tmp_path):
    server = Server(tmp_path, threads=6)
    now = [0.0]
    hot = procs.CpuTracker(str(tmp_path), clock=lambda: now[0], hot_every=60.0)
    info = procs.proc_info(str(tmp_path), server.PID)
    hot.sample([info])
    for _ in range(4):
        server.tick({server.PID: 0.3, server.PID + 1: 0.1})
        now[0] += 0.5
        hot.sample([info])
    before = hot.listings
    server.tick({server.PID: 0.3, server.PID + 1: 0.1, server.PID + 4: 0.95})
    now[0] += 0.5
    cpu = hot.sample([info])[server.PID]
    assert hot.listings == before + 1
    assert cpu.busiest_thread is not None and cpu.busiest_thread.tid == server.PID + 4
    assert cpu.busiest_thread.cpu == pytest.approx(0.95, abs=2 / procs.CLK_TCK)
    server.tick({server.PID + 4: 0.95})  # from now on it is a hot one
    now[0] += 0.5
    assert hot.sample([info])[server.PID].busiest_thread.tid == server.PID + 4
    assert hot.listings == before + 1


SPIN = """
import ctypes, threading, time
libc = ctypes.CDLL(None)
libc.prctl(15, b"spinner", 0, 0, 0)  # PR_SET_NAME: this thread's name
def idle():
    time.sleep(60)
threading.Thread(target=idle, daemon=True).start()
end = time.monotonic() + 30
while time.monotonic() < end:
    pass
"""


def test_a_real_spinning_process_uses_one_core_in_its_busiest_thread():
    child = subprocess.Popen([sys.executable, "-c", SPIN])

    def spinning() -> bool:
        """Whether the child has named its main thread and started the idle one (then it only spins)."""
        try:
            tids = os.listdir(f"/proc/{child.pid}/task")
            names = [Path(f"/proc/{child.pid}/task/{tid}/comm").read_text().strip() for tid in tids]
        except OSError:
            return False
        return len(names) == 2 and "spinner" in names

    try:
        wait_until(spinning, what="the child's spinner and idle threads")
        tracker = procs.CpuTracker()
        info = procs.proc_info("/proc", child.pid)
        assert info is not None
        tracker.sample([info])
        time.sleep(0.5)
        cpu = tracker.sample([info])[child.pid]
        assert cpu.busiest_thread is not None and cpu.busiest_thread.name == "spinner"
        assert len(cpu.threads) == 2
        spinner = next(t for t in cpu.threads if t.tid == child.pid)  # the main thread spins
        idle = next(t for t in cpu.threads if t.tid != child.pid)
        # The spinning thread wants a whole core: running or waiting to run all the tick, whatever the
        # neighbours leave it; it got most of it. The sleeping thread wants nothing.
        assert spinner.runnable is not None and spinner.runnable > 0.9
        assert 0.3 < spinner.cpu <= spinner.runnable + 0.05
        assert demand(cpu) == spinner.runnable
        assert idle.runnable is not None and idle.runnable < 0.05 and idle.cpu < 0.05
    finally:
        child.kill()
        child.wait()


def test_listening_sockets_and_their_holders_in_a_fixture_tree():
    assert procs.listening_inodes(str(PROC), 4700, 8004) == {91001}  # the established 8004 connection is not
    assert procs.socket_inodes(str(PROC), 4701) == {91001, 91077}
    assert procs.socket_inodes(str(PROC), 4703) == {91078}


def test_a_child_that_inherited_a_listening_socket_holds_it():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        child = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(30)"], pass_fds=[sock.fileno()]
        )
        try:
            listening = procs.listening_inodes("/proc", os.getpid(), port)
            assert len(listening) == 1
            assert listening <= procs.socket_inodes("/proc", child.pid)
        finally:
            child.kill()
            child.wait()


def test_a_command_line_and_an_environment_are_read_up_to_their_bounds():
    # a real process whose command line and environment are each 1 MiB (the kernel takes 128 KiB a
    # word): what the table keeps is bounded
    big = ["x" * 100_000] * 10
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()", "vllm", "serve", *big],
        stdin=subprocess.PIPE,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "3", **{f"BIG{i}": b for i, b in enumerate(big)}},
    )
    try:
        wait_until(lambda: procs.read_cmdline("/proc", child.pid)[3:5] == ("vllm", "serve"), timeout=10)
        words, cut = procs.cmdline_of("/proc", child.pid)
        assert cut and words[3:] == (
            "vllm",
            "serve",
        )  # the first 100 KB word is past 64 KiB: not kept cut short
        env, cut = procs.environ_of("/proc", child.pid)
        assert cut and env["CUDA_VISIBLE_DEVICES"] == "3"  # before the big variables, as exec laid them out
        assert sum(len(k) + len(v) + 2 for k, v in env.items()) <= procs.MAX_ENVIRON_BYTES + 1
        assert all(v == big[0] for k, v in env.items() if k.startswith("BIG"))  # none kept cut short
        assert procs.proc_info("/proc", child.pid).cmdline_cut
        assert not procs.proc_info("/proc", os.getpid()).cmdline_cut
    finally:
        child.kill()
        child.wait()


def test_a_command_line_or_environment_that_fills_its_bound_is_whole_and_one_byte_more_is_cut(tmp_path):
    bound = procs.MAX_CMDLINE_BYTES
    (tmp_path / "1").mkdir()
    (tmp_path / "2").mkdir()
    flags = b"vllm\0serve\0--max-num-seqs\0"
    exact = flags + b"256\0" + b"x" * (bound - len(flags) - 4)  # the last word ends at the bound
    (tmp_path / "1" / "cmdline").write_bytes(exact)
    (tmp_path / "2" / "cmdline").write_bytes(flags + b"x" * (bound - len(flags)) + b"y")
    words, cut = procs.cmdline_of(str(tmp_path), 1)
    assert not cut and words[:4] == ("vllm", "serve", "--max-num-seqs", "256") and len(words) == 5
    assert procs.cmdline_of(str(tmp_path), 2) == (("vllm", "serve", "--max-num-seqs"), True)
    (tmp_path / "1" / "cmdline").write_bytes(flags + b"256")  # a word cut by the bytes, not by the bound
    assert procs.cmdline_of(str(tmp_path), 1) == (("vllm", "serve", "--max-num-seqs", "256"), False)
    # words past MAX_CMDLINE_WORDS are cut; the padding setproctitle leaves is not
    (tmp_path / "1" / "cmdline").write_bytes(b"a\0" * procs.MAX_CMDLINE_WORDS + b"\0" * 40)
    words, cut = procs.cmdline_of(str(tmp_path), 1)
    assert len(words) == procs.MAX_CMDLINE_WORDS and not cut
    (tmp_path / "1" / "cmdline").write_bytes(b"a\0" * procs.MAX_CMDLINE_WORDS + b"b\0")
    words, cut = procs.cmdline_of(str(tmp_path), 1)
    assert len(words) == procs.MAX_CMDLINE_WORDS and cut and "b" not in words

    env_bound = procs.MAX_ENVIRON_BYTES
    head = b"CUDA_VISIBLE_DEVICES=0,1\0"
    (tmp_path / "1" / "environ").write_bytes(head + b"A=" + b"x" * (env_bound - len(head) - 3) + b"\0")
    env, cut = procs.environ_of(str(tmp_path), 1)
    assert not cut and env["CUDA_VISIBLE_DEVICES"] == "0,1" and len(env["A"]) == env_bound - len(head) - 3
    (tmp_path / "2" / "environ").write_bytes(
        b"A=" + b"x" * (env_bound - 25) + b"\0" + head
    )  # "...=0" at the bound
    env, cut = procs.environ_of(str(tmp_path), 2)
    assert cut and "CUDA_VISIBLE_DEVICES" not in env  # cut to "CUDA_VISIB...=0": not kept wrong
    assert procs.environ_of(str(tmp_path), 3) == ({}, False)  # no such process
