"""The light agent: CUDAGraph hooks against a stand-in torch, no CUPTI loaded, GRAPH_TRACE safety, integrals."""

import contextlib
import os
import socket
import time
from pathlib import Path

import pytest

from exporter import wire
from exporter.agent.light import LightAgent
from exporter.agent.settings import Settings, resolve_mode
from exporter.agent.steps import MODE_EAGER, MODE_GRAPH, StepTracker
from tests.agent import fake_torch
from tests.agent.fresh import run_fresh
from tests.fakes.wait import wait_until

ROOT = Path(__file__).resolve().parents[2]
MS = 1_000_000
T0 = 1_764_400_000_000_000_000


def run(tmp_path: Path, code: str, env: dict[str, str] | None = None) -> dict:  # type: ignore[type-arg]
    """Run code in a fresh interpreter with the fake torch importable; return the JSON it prints last."""
    return run_fresh(tmp_path, code, [fake_torch], env)  # type: ignore[no-any-return]


def test_hooks_installed_before_import_count_every_capture_and_replay(tmp_path: Path) -> None:
    code = """
import json
from exporter.agent import hooks
hooks.install()                       # before torch is imported: patched right after its import
import torch
before = hooks.graphs_so_far()        # hooks in, CUDA not initialised, nothing captured
torch.cuda.init(device=3)
during = hooks.graphs_so_far()        # CUDA is up, the hooks saw no capture: still none
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g, pool=7):
    pass
results = {g.replay() for _ in range(1000)}
print(json.dumps({"counts": hooks.counts(), "before": before, "during": during, "after": hooks.graphs_so_far(),
                  "dev": hooks.device(), "replays": g.replays, "results": sorted(results),
                  "calls": torch.cuda.calls, "name": torch.cuda.CUDAGraph.replay.__name__}))
"""
    out = run(tmp_path, code)
    assert out["counts"] == [1000, 1, 1]
    assert out["replays"] == 1000 and out["results"] == ["replayed"]  # torch's own method still runs
    assert out["calls"] == [["capture_begin", 7, "thread_local"], ["capture_end"]]  # arguments passed through
    assert (out["before"], out["during"], out["after"]) == ("none", "none", "some")
    assert out["dev"] == 3  # learnt on the capturing thread
    assert out["name"] == "replay"


def test_hooks_installed_after_cuda_init_stay_conservative(tmp_path: Path) -> None:
    code = """
import json
import torch
torch.cuda.init()
g = torch.cuda.CUDAGraph(); g.capture_begin(); g.capture_end()   # a capture the hooks never saw
from exporter.agent import hooks
from exporter.agent.core import graph_trace_safe
hooks.install()
hooks.install()                                                  # twice: one patch
g.replay(); g.replay()
print(json.dumps({"so_far": hooks.graphs_so_far(), "safe": graph_trace_safe(), "counts": hooks.counts()}))
"""
    out = run(tmp_path, code)
    assert out["so_far"] == "unknown" and out["safe"] is False
    assert out["counts"] == [2, 0, 0]


def test_graph_trace_is_safe_after_cuda_init_when_the_hooks_saw_no_capture(tmp_path: Path) -> None:
    code = """
import json
from exporter.agent import hooks
hooks.install()
import torch
from exporter.agent.core import graph_trace_safe
a = graph_trace_safe()
torch.cuda.init()
b = graph_trace_safe()                  # the late start of issue 9: CUDA up, no graph yet
g = torch.cuda.CUDAGraph(); g.capture_begin()
c = graph_trace_safe()                  # a capture in progress already forbids it
print(json.dumps([a, b, c]))
"""
    assert run(tmp_path, code) == [True, True, False]


def test_a_late_start_scans_the_heap_for_live_graphs(tmp_path: Path) -> None:
    code = """
import gc, json, sys
import torch
torch.cuda.init()                       # CUDA up before any hook: the hooks cannot vouch for the past
from exporter.agent import hooks
from exporter.agent.core import graph_trace_safe
hooks.install()
a = graph_trace_safe()                  # the late start of issue 9 before any capture: nothing alive
g = torch.cuda.CUDAGraph()              # made before the hooks could count its capture
b = graph_trace_safe()
del g; gc.collect()
c = graph_trace_safe()                  # gone: it can never be replayed
sys.modules["cupy"] = object()          # a library with graphs of its own: the scan cannot vouch
d = graph_trace_safe()
print(json.dumps([hooks.graphs_so_far(), a, b, c, d]))
"""
    assert run(tmp_path, code) == ["unknown", True, False, True, False]


def test_light_mode_never_loads_cupti(tmp_path: Path) -> None:
    code = """
import json, sys
from exporter import agent
import torch
state = agent.start(role="generic")
a = agent.current()
g = torch.cuda.CUDAGraph(); g.capture_begin(); g.capture_end(); g.replay()
maps = open("/proc/self/maps").read()
print(json.dumps({"state": state, "mode": a.mode, "cupti_modules": [m for m in sys.modules if "cupti" in m],
                  "libcupti": "libcupti" in maps, "numpy": "numpy" in sys.modules, "replays": a.describe()["replays"]}))
agent.stop()
"""
    for env in ({}, {"BOUNDWATCH_AGENT": "1"}, {"BOUNDWATCH_AGENT": "now"}):
        out = run(tmp_path, code, env)
        assert out["state"] == "running" and out["mode"] == "light"
        assert out["cupti_modules"] == [] and out["libcupti"] is False
        assert out["replays"] == 1


def test_mode_comes_from_the_argument_the_legacy_flag_or_the_environment(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("BOUNDWATCH_AGENT", raising=False)
    assert resolve_mode(None, {}) == "light"
    assert resolve_mode("cupti", {}) == "cupti"
    monkeypatch.setenv("BOUNDWATCH_AGENT", "cupti")
    assert resolve_mode(None, {}) == "cupti"
    assert resolve_mode(None, {"cupti": False}) == "light"  # the old steps-only start
    assert resolve_mode("light", {}) == "light"
    assert Settings.from_env().mode == "cupti"
    monkeypatch.setenv("BOUNDWATCH_AGENT", "now")
    assert Settings.from_env().mode == "light"


def test_settings_out_of_bounds_or_not_numbers_get_their_defaults_and_say_so(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    for name, value in {
        "FLUSH_S": "0",
        "LAG_MAX_S": "nan",
        "MAX_BUFFERS": "1e12",
        "BUFFER_KIB": "lots",
    }.items():
        monkeypatch.setenv("BOUNDWATCH_AGENT_" + name, value)
    monkeypatch.setenv("BOUNDWATCH_AGENT_WINDOW_S", "2.5")  # in bounds: kept
    s = Settings.from_env(sample_on_s=-1.0)  # a keyword override is bounded too
    assert (s.flush_s, s.lag_max_s, s.max_buffers, s.buffer_kib, s.sample_on_s) == (0.5, 3.0, 32, 1024, 1.0)
    assert s.window_s == 2.5
    assert set(s.rejected) == {"flush_s", "lag_max_s", "max_buffers", "buffer_kib", "sample_on_s"}
    assert LightAgent(s).detail.startswith("settings out of bounds, defaults used: ")
    monkeypatch.delenv("BOUNDWATCH_AGENT_FLUSH_S")
    assert "flush_s" not in Settings.from_env().rejected


def test_the_inline_switch_takes_on_or_off_and_counts_anything_else_as_rejected(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("BOUNDWATCH_AGENT_INLINE", "sometimes")
    s = Settings.from_env()
    assert s.inline == "on" and s.rejected == ("inline",) and LightAgent(s).inline
    monkeypatch.setenv("BOUNDWATCH_AGENT_INLINE", "off")
    s = Settings.from_env()
    assert s.inline == "off" and s.rejected == () and not LightAgent(s).inline


def test_the_idle_wake_is_never_by_default_a_number_or_never_when_set_and_the_quiet_beat_off(
    monkeypatch,
) -> None:  # type: ignore[no-untyped-def]
    s = Settings.from_env()
    assert s.idle_wake_s == float("inf") and s.quiet_beat_s == 0.0 and s.rejected == ()
    monkeypatch.setenv("BOUNDWATCH_AGENT_IDLE_WAKE_S", "30")
    monkeypatch.setenv("BOUNDWATCH_AGENT_QUIET_BEAT_S", "60")
    s = Settings.from_env()
    assert (s.idle_wake_s, s.quiet_beat_s, s.rejected) == (30.0, 60.0, ())
    monkeypatch.setenv("BOUNDWATCH_AGENT_IDLE_WAKE_S", "NEVER")
    assert Settings.from_env().idle_wake_s == float("inf")
    # "never" is the idle wake's alone; a beat or any other setting refuses it (and 1e9 s, and a negative)
    monkeypatch.setenv("BOUNDWATCH_AGENT_QUIET_BEAT_S", "never")
    monkeypatch.setenv("BOUNDWATCH_AGENT_FLUSH_S", "inf")
    s = Settings.from_env()
    assert (s.quiet_beat_s, s.flush_s) == (0.0, 0.5) and set(s.rejected) == {"quiet_beat_s", "flush_s"}
    monkeypatch.setenv("BOUNDWATCH_AGENT_IDLE_WAKE_S", "-1")
    monkeypatch.setenv("BOUNDWATCH_AGENT_QUIET_BEAT_S", "1e9")
    s = Settings.from_env()
    assert (s.idle_wake_s, s.quiet_beat_s) == (float("inf"), 0.0)
    assert {"idle_wake_s", "quiet_beat_s"} <= set(s.rejected)


def test_steps_counted_before_a_long_stop_are_dropped_and_counted_not_sent_for_the_sidecar_to_refuse() -> (
    None
):
    class Sender:
        """The agent's datagrams through the real wire format, kept as the sidecar decodes them."""

        dropped = 0

        def __init__(self) -> None:
            self.sent: list[wire.Message] = []
            self.seq = 0

        def next_seq(self) -> int:
            self.seq += 1
            return self.seq

        def encode(self, msg: wire.Message) -> bytes:
            return wire.encode(msg)

        def send_data(self, data: bytes) -> None:
            self.sent.append(wire.decode(data))

    sender = Sender()
    now = T0 + 3_600_000 * MS  # the agent's wall clock, an hour past T0
    agent = LightAgent(Settings(socket=""), sender=sender, wall_ns=lambda: now)  # type: ignore[arg-type]
    agent.tick(force=True)
    assert [m.steps_stale for m in sender.sent] == [0], sender.sent  # nothing dropped yet
    agent.steps.record("vllm", now - 400_000 * MS - MS, now - 400_000 * MS, tokens=8, seqs=8)  # 400 s ago
    agent.tick(force=True)
    assert agent.steps_stale == 1 and agent.describe()["steps_stale"] == 1
    # the tick's message, without them, says so (the sidecar exports it: boundwatch_agent_stale_steps)
    assert [(m.steps, m.steps_stale) for m in sender.sent[1:]] == [((), 1)], sender.sent
    agent.steps.record("vllm", now - 2 * MS, now - MS, tokens=8, seqs=8)  # a step of now: sent
    agent.tick(force=True)
    assert agent.steps_stale == 1 and [(s.engine, s.n) for s in sender.sent[-1].steps] == [("vllm", 1)], (
        sender.sent
    )
    assert sender.sent[-1].steps_stale == 1  # a count since the agent started, on every message


def test_the_light_agent_tells_the_sidecar_how_many_settings_it_rejected(tmp_path: Path) -> None:
    path = str(tmp_path / "agent.sock")
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(path)
    rx.settimeout(2.0)
    agent = LightAgent(Settings.from_env(socket=path, flush_s=0.0, lag_max_s=-1.0))
    try:
        agent.send([], None)
        msg = wire.decode(rx.recv(wire.MAX_DATAGRAM_BYTES))
    finally:
        agent.sender.close()
        rx.close()
    assert msg.settings_rejected == 2 and "flush_s,lag_max_s" in msg.detail


@pytest.mark.parametrize("per_step", [True, False])  # CUPTI keeps each step; the light agent folds them
def test_running_and_waiting_are_integrated_between_steps_by_the_left_rule(per_step: bool) -> None:
    tracker = StepTracker()
    tracker.lag_ns, tracker.per_step = 0, per_step
    # a known served sequence: (step end, running after it, waiting after it)
    served = [(10, 1, 4), (30, 3, 2), (35, 3, 0), (95, 0, 0), (100, 2, 1)]
    for i, (t_ms, running, waiting) in enumerate(served):
        tracker.record("vllm", T0 + t_ms * MS - MS, T0 + t_ms * MS, 8, running, running, waiting, 256, 0,
                       MODE_GRAPH if i % 2 else MODE_EAGER)  # fmt: skip
    (s,) = tracker.take()
    # left rule: 1 x 20 + 3 x 5 + 3 x 60 + 0 x 5 request-ms running; 4 x 20 + 2 x 5 + 0 + 0 waiting
    assert s.run_ns == (20 + 15 + 180) * MS and s.wait_ns == (80 + 10) * MS
    assert (s.running, s.waiting, s.max_seqs, s.dp) == (2, 1, 256, 0)
    assert (s.n, s.graph, s.eager) == (5, 2, 3)
    tracker.record("vllm", T0 + 119 * MS, T0 + 120 * MS, 8, 2, 2, 0, 256, 0)
    (s2,) = tracker.take()
    assert s2.run_ns == 2 * 20 * MS and s2.wait_ns == 1 * 20 * MS  # the integral continues across takes
    assert (s2.n, s2.running, s2.waiting, s2.hist[0]) == (1, 2, 0, 1)
    assert tracker.take() == []


@pytest.mark.parametrize("per_step", [True, False])
def test_two_engines_in_one_process_stay_apart_and_worker_modes_belong_to_the_parent(per_step: bool) -> None:
    tracker = StepTracker()
    tracker.lag_ns, tracker.per_step = 0, per_step
    tracker.record("vllm", T0, T0 + MS, 4, 4, 1, 0, 8, 0)
    tracker.record("vllm", T0, T0 + MS, 4, 4, 2, 0, 8, 1)
    steps = sorted(tracker.take(), key=lambda s: s.dp)
    assert [(s.dp, s.running) for s in steps] == [(0, 1), (1, 2)]
    worker = StepTracker()  # a GPU worker: the mode is decided here, the step is counted in EngineCore
    worker.count_mode("vllm", 0, graph=True)
    worker.count_mode("vllm", 0, graph=False)
    (m,) = worker.take()
    assert (m.n, m.graph, m.eager, m.owner, m.dp) == (0, 1, 1, os.getppid(), 0)
    assert worker.take() == []  # taken once
    here = StepTracker()  # uni executor: EngineCore and its worker in one process
    here.lag_ns, here.engine_here, here.per_step = 0, True, per_step
    here.count_mode("vllm", 0, graph=True)
    here.record("vllm", T0, T0 + MS, 4, 4, 1, 0, 8, 0)
    (h,) = here.take()
    assert (h.n, h.graph, h.owner) == (1, 1, 0)


def test_light_agent_sends_steps_and_graph_counts_on_the_wire(tmp_path: Path) -> None:
    path = str(tmp_path / "agent.sock")
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(path)
    rx.settimeout(2.0)
    agent = LightAgent(Settings(socket=path, role="vllm_engine", flush_s=0.05))
    agent.start()
    now = time.time_ns()
    agent.steps.record("vllm", now - 20 * MS, now - 10 * MS, 64, 8, 8, 2, 128, 0)
    agent.steps.record("vllm", now - 10 * MS, now, 64, 8, 8, 0, 128, 0)
    msgs: list[wire.Message] = []

    def both_steps_sent() -> bool:
        with contextlib.suppress(TimeoutError):
            msgs.append(wire.decode(rx.recv(wire.MAX_DATAGRAM_BYTES)))
        return sum(s.n for m in msgs for s in m.steps) >= 2

    try:
        wait_until(both_steps_sent, what="both steps on the wire while the agent runs")
        agent.stop()
        while True:
            msgs.append(wire.decode(rx.recv(wire.MAX_DATAGRAM_BYTES)))
    except TimeoutError:
        pass
    finally:
        rx.close()
    steps = [s for m in msgs for s in m.steps]
    assert sum(s.n for s in steps) == 2 and sum(s.run_ns for s in steps) == 8 * 10 * MS
    assert {m.mode for m in msgs} == {"light"} and msgs[-1].state == "stopped"
    assert agent.tick_ns_max < 1000 * MS  # never blocks (its speed: light_agent_overhead.py)


def test_the_agents_thread_hands_over_steps_of_an_engine_that_never_pauses(tmp_path: Path) -> None:
    """The engine's thread only counts (its own hand-over is a 2 s backstop): the agent's tick takes them."""
    import threading

    from exporter import agent as agent_pkg
    from exporter.agent import plugins

    path = str(tmp_path / "agent.sock")
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(path)
    rx.settimeout(0.05)
    light = LightAgent(Settings(socket=path, role="vllm_engine", flush_s=0.05))

    class Core:
        def step(self) -> tuple[dict[int, str], bool]:
            time.sleep(0.001)
            return {0: "out"}, True

    wrapped = plugins.wrap_step(Core.step, "vllm", lambda core, n: (4 * n, 4 * n))
    core, done, count = Core(), threading.Event(), [0]

    def engine() -> None:
        while not done.is_set():
            wrapped(core)
            count[0] += 1

    saved, agent_pkg._agent = agent_pkg._agent, light
    light.start()
    t = threading.Thread(target=engine)
    t.start()
    during: list[wire.Message] = []
    deadline = time.monotonic() + 0.6
    try:
        while time.monotonic() < deadline:
            try:
                during.append(wire.decode(rx.recv(wire.MAX_DATAGRAM_BYTES)))
            except TimeoutError:
                pass
        done.set()
        t.join()
        light.stop()
        after = []
        try:
            while True:
                after.append(wire.decode(rx.recv(wire.MAX_DATAGRAM_BYTES)))
        except TimeoutError:
            pass
    finally:
        done.set()
        agent_pkg._agent = saved
        plugins._wrappers.clear()
        rx.close()
    while_stepping = sum(s.n for m in during for s in m.steps)
    assert while_stepping > count[0] // 3  # the agent's ticks took them while the engine kept stepping
    assert while_stepping + sum(s.n for m in after for s in m.steps) == count[0]  # none lost, none twice


def test_asking_for_cupti_later_upgrades_the_light_agent_in_place(tmp_path: Path) -> None:
    code = """
import json
from exporter import agent
first = agent.start(role="vllm_worker")
light = agent.current()
light.steps.record("vllm", 1, 2, 3, 3)
again = agent.start()                      # a second plain start changes nothing
same = agent.current() is light
state = agent.start(mode="cupti")          # the deep mode asked for later
deep = agent.current()
print(json.dumps({"first": first, "again": again, "same": same, "state": state,
                  "mode": getattr(deep, "mode", ""), "kind": type(deep).__name__,
                  "steps_kept": deep.steps is light.steps, "sender_kept": deep.sender is light.sender,
                  "role": deep.settings.role, "per_step": deep.steps.per_step}))
agent.stop()
"""
    out = run(tmp_path, code)
    assert (out["first"], out["again"], out["same"]) == ("running", "running", True)
    assert (
        out["kind"] == "Agent" and out["steps_kept"] and out["sender_kept"] and out["role"] == "vllm_worker"
    )
    assert out["per_step"] is True  # CUPTI attaches GPU time to each step
    assert out["state"] in ("running", "unavailable")  # unavailable where CUPTI cannot load (here: no GPU)
    assert out["mode"].startswith("cupti:") or (out["state"], out["mode"]) == ("unavailable", "cupti")


def test_every_tick_that_counted_a_replay_sends_and_so_does_the_first_empty_one_after_it(
    tmp_path: Path,
) -> None:
    # A light agent silent past its silent_ms (two ticks and a quarter second) reads quiet at the sidecar,
    # so a tick that counted something must send at once, not wait for the heartbeat (1 s) as a tick that
    # counted nothing does; the first empty tick after one that counted sends too (replays that stop are
    # news: an engine gone eager), the empty ones after it wait for the heartbeat.
    code = """
import json
from exporter.agent import hooks
hooks.install()
import torch
from exporter.agent.light import LightAgent
from exporter.agent.settings import Settings
from tests.agent.fresh import ListSender
sender = ListSender()
agent = LightAgent(Settings(socket="", flush_s=0.5), sender=sender)
g = torch.cuda.CUDAGraph()
sent = []
agent.tick()                 # the first tick: nothing sent before, so the heartbeat is due
sent.append(len(sender.sent))
for replays in (3, 0, 0, 0, 2):
    for _ in range(replays):
        g.replay()
    agent.tick()             # all within a second of the first
    sent.append(len(sender.sent))
print(json.dumps({"sent": sent, "silent_ms": agent.silent_ms,
                  "replays": [m.graphs.replays for m in sender.sent if m.graphs]}))
"""
    out = run(tmp_path, code)
    assert out["sent"] == [1, 2, 3, 3, 3, 4], out  # the ticks with replays sent, and the first empty one
    assert out["replays"][1:] == [3, 0, 2], out  # the empty ticks after it went with the next message
    assert out["silent_ms"] == 1250, out


def test_an_engine_gone_eager_sends_its_zero_replays_within_a_tick_not_a_heartbeat(tmp_path: Path) -> None:
    # A torch engine whose graph replay drives the cycle (no step site), stepping every 25 ms (slower than
    # switch.FAST_STEP_NS, as the lab's decode), stops replaying but keeps stepping (CUDA graphs off
    # mid-run): no call drives, the agent's thread takes the cycle over a margin late, and its first tick,
    # which counts nothing, is the news that the graph-step share fell to 0. It goes out at once rather
    # than a heartbeat (1 s) after the last message (the lab's eager switch, session 29).
    code = """
import json, time
from exporter.agent import hooks
hooks.install()
import torch
from exporter.agent.light import LightAgent
from exporter.agent.settings import Settings
from tests.agent.fresh import ListSender

class Timed(ListSender):
    def send_data(self, data, windows=0):
        self.sent.append((time.monotonic(), data))
        return True

sender = Timed()
agent = LightAgent(Settings(socket="", flush_s=0.5), sender=sender)
agent.start()
g = torch.cuda.CUDAGraph()
end = time.monotonic() + 1.6
while time.monotonic() < end:   # graph steps, 25 ms apart: the replay drives the cycle
    g.replay()
    time.sleep(0.025)
eager_at = time.monotonic()
while time.monotonic() < eager_at + 2.0:   # eager steps: nothing the hooks see
    time.sleep(0.025)
agent.stop()
after = [(t - eager_at, m.graphs.replays) for t, m in sender.sent if t > eager_at and m.graphs is not None]
every = [(round(t - eager_at, 3), m.state, m.graphs.replays if m.graphs else None) for t, m in sender.sent]
print(json.dumps({"after": after, "every": every, "wakes": agent.wakes}))
"""
    out = run(tmp_path, code)
    zero = [t for t, replays in out["after"] if replays == 0]
    # the slice under way when the replays stopped may still carry some; the first window with none is
    # sent by the agent's thread's first tick: the next due (at most a cycle, 0.5 s), its slice and margin
    assert zero and zero[0] < 0.85, out


# A fresh process's start: the fake torch's CUDAGraph made torch 2.x's (`replay` a shim over a C++-like
# base, whose place the hooks take), CUDA up, the hooks in, and what a light agent needs imported.
SHIM_AGENT = (
    """
import json, time
import torch
"""
    + fake_torch.INSTANCEMETHOD
    + """
class _CUDAGraph:
    pass
def _replay(self):
    pass
_CUDAGraph.replay = instancemethod(_replay)
"""
    + fake_torch.GRAPH_2_11
    + """
torch.cuda.CUDAGraph = CUDAGraph
torch.cuda.init()
from exporter.agent import hooks
hooks.install()
from exporter.agent.light import LightAgent
from exporter.agent.settings import Settings
from tests.agent.fresh import ListSender
"""
)


def test_replays_through_torchs_shim_are_all_counted_however_they_fall_against_the_hooks_slices(
    tmp_path: Path,
) -> None:
    # Bursts of replays in step with the agent's ticks (a request at a time; API servers throttled in a
    # cgroup's 100 ms periods) can fall between the sampled slices every time: a sample then reads an
    # engine that replays its graphs as one that replays none (decodes eager). Where torch's replay is its
    # 2.x shim the hook takes its place, in and out, so every replay is counted and sent unscaled.
    code = (
        SHIM_AGENT
        + """sender = ListSender()
agent = LightAgent(Settings(socket="", flush_s=0.2, hook_share=0.125), sender=sender)
agent.start()
g = torch.cuda.CUDAGraph()
made = 0
for burst in range(8):       # 5 replays 10 ms apart, then 350 ms with none: a 0.4 s period, two ticks
    for _ in range(5):
        g.replay()
        made += 1
        time.sleep(0.01)
    time.sleep(0.35)
cycling = agent.describe()["hooks_cycling"]  # the hooks were sampled all along (stop puts them in)
agent.stop()
print(json.dumps({"made": made, "exact": agent.describe()["replays_exact"], "cycling": cycling,
                  "sent": sum(m.graphs.replays for m in sender.sent if m.graphs)}))
"""
    )
    out = run(tmp_path, code)
    assert out["exact"] is True and out["cycling"] is True, out
    assert out["sent"] == out["made"] == 40, out


def test_replays_of_a_graph_class_without_torchs_shim_are_a_sample() -> None:
    from exporter.agent.switch import Switch

    sw, counter = Switch(), [0]

    class Plain:
        def replay(self) -> None:
            pass

    original = Plain.replay

    def hook(self: object) -> None:
        counter[0] += 1
        original(self)

    assert not sw.exact(counter)  # nothing counts into it yet
    sw.add(Plain, "replay", original, hook, rank=1, counter=counter)  # no direct call: a frame more out
    assert not sw.exact(counter)
    assert sw.start_cycle()
    sw.set_in(False)
    assert Plain.__dict__["replay"] is original  # out: the engine's own, uncounted


def test_an_engine_stepping_in_short_bursts_keeps_its_agent_sending_within_its_silence(
    tmp_path: Path,
) -> None:
    # A fast engine (steps a few ms apart) whose work comes in bursts shorter than the hooks' out slice
    # calls only while they are out, each call after a slice it missed: no slice ends with a call. The
    # agent's thread does not wake for a fast engine (its idle wake is never), so without a tick on a
    # call a period after the last one the agent said nothing for seconds while its engine replayed, and
    # the sidecar, past silent_ms, read it quiet: zero replays, its steps "eager".
    code = (
        SHIM_AGENT
        + """
class Timed(ListSender):
    def send_data(self, data, windows=0):
        self.sent.append((time.monotonic(), data))
        return True

sender = Timed()
agent = LightAgent(Settings(socket="", flush_s=0.2, hook_share=0.125), sender=sender)
agent.start()
g = torch.cuda.CUDAGraph()
end = time.monotonic() + 1.0
while time.monotonic() < end:        # steady and fast: the switch reads the engine as fast
    g.replay(); time.sleep(0.004)
t0, made = time.monotonic(), []
for burst in range(12):              # then 5 replays 4 ms apart every 0.3 s: bursts of 20 ms
    for _ in range(5):
        g.replay(); made.append(time.monotonic()); time.sleep(0.004)
    time.sleep(0.28)
t1 = time.monotonic()
fast = agent.switch.fast
agent.stop()
times = [t for t, m in sender.sent if t0 <= t <= t1 and m.state == "running"]
edges = [t0] + times + [t1]
silence = max(b - a for a, b in zip(edges, edges[1:]) if any(a <= t < b for t in made))
print(json.dumps({"silence": silence, "silent_ms": agent.silent_ms, "messages": len(times), "fast": fast,
                  "made": len(made) + 0, "sent": sum(m.graphs.replays for _, m in sender.sent if m.graphs)}))
"""
    )
    out = run(tmp_path, code)
    assert out["silent_ms"] == 650, out  # two ticks and a quarter second
    assert out["silence"] * 1000 < out["silent_ms"], out
