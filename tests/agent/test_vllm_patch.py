"""The vLLM patch points against a small vLLM-shaped package: EngineCore steps counted in a forked child
(the `vllm serve` case of issue 16), workers in both layouts, the step's graph mode from either runner."""

import json
import socket
from pathlib import Path

import pytest

from exporter import wire
from exporter.config import AgentFeedConfig
from exporter.sources.agent_feed import AgentFeed
from tests.agent import fake_vllm
from tests.agent.fresh import run_fresh

ROOT = Path(__file__).resolve().parents[2]

PRELUDE = """
import json, os, sys
from vllm.config import VllmConfig
import vllm.plugins
"""

SERVE = (
    PRELUDE
    + """
vllm.plugins.load_general_plugins()            # the API server, before vllm.v1.engine.core exists
before = "vllm.v1.engine.core" in sys.modules
if CORE_IN_PARENT:
    import vllm.v1.engine.core                 # the launcher imports it to start the engine core
pid = os.fork()
if pid == 0:
    from vllm.v1.engine.core import EngineCoreProc
    core = EngineCoreProc(VllmConfig(max_num_seqs=4))   # its own load_general_plugins() does nothing
    for i in range(6):
        core.scheduler.add_request(f"r{i}", decode_steps=3)
    steps = 0
    while core.scheduler.has_requests():
        steps += core.step()[1]
    for _ in range(3):
        core.step()                              # nothing to run: not a step
    from exporter import agent
    a = agent.current()
    info = {"steps": steps, "mode": a.mode, "role": a.settings.role, "loads": vllm.plugins.loads}
    agent.stop()
    with open(OUT, "w") as f:
        json.dump(info, f)
    os._exit(0)
os.waitpid(pid, 0)
print(json.dumps({"child": pid, "before": before}))
"""
)


def run(tmp_path: Path, code: str) -> dict:  # type: ignore[type-arg]
    return run_fresh(tmp_path, code, [fake_vllm])  # type: ignore[no-any-return]


def receive_all(rx: socket.socket) -> list[bytes]:
    out = []
    rx.setblocking(False)
    while True:
        try:
            out.append(rx.recv(wire.MAX_DATAGRAM_BYTES))
        except BlockingIOError:
            return out


def listen(tmp_path: Path) -> socket.socket:
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    rx.bind(str(tmp_path / "agent.sock"))
    return rx


def feed_of(tmp_path: Path, datagrams: list[bytes]) -> AgentFeed:
    feed = AgentFeed(AgentFeedConfig(socket=str(tmp_path / "unused.sock")))
    for d in datagrams:
        feed.receive(d)
    return feed


@pytest.mark.parametrize("core_in_parent", [False, True])
def test_engine_core_forked_after_the_plugin_loaded_counts_its_steps(
    tmp_path: Path, core_in_parent: bool
) -> None:
    rx = listen(tmp_path)
    out_path = tmp_path / "child.json"
    try:
        out = run(tmp_path, f"CORE_IN_PARENT = {core_in_parent}\nOUT = {str(out_path)!r}\n" + SERVE)
        datagrams = receive_all(rx)
    finally:
        rx.close()
    child = json.loads(out_path.read_text())
    assert out["before"] is False  # the plugin loaded before the engine core module existed
    assert child["loads"] == ["vllm_plugin"]  # once, in the parent: the child inherited plugins_loaded
    assert child["steps"] == 6 and child["mode"] == "light" and child["role"] == "vllm_engine"
    reading = feed_of(tmp_path, datagrams).collect()
    (steps,) = reading.steps
    assert steps.pid == out["child"] and steps.engine == "vllm"
    assert steps.steps == 6 and steps.tokens == 18 and steps.seqs == 18  # 4+4+4 then 2+2+2 sequences
    assert (steps.running, steps.waiting, steps.max_num_seqs, steps.dp_rank) == (0.0, 0.0, 4, 0)
    # left rule over the served sequence: 4 running for 3 step gaps after step 1, then 2 for 3 steps
    wall_s = steps.wall_ns / 1e9
    assert steps.running_seconds > 0 and steps.running_seconds < 4 * 6 * wall_s
    assert steps.waiting_seconds > 0  # two requests waited through the first three steps


WORKER = (
    PRELUDE
    + """
vllm.plugins.load_general_plugins()
from vllm.{layout}.worker_base import WorkerWrapperBase
w = WorkerWrapperBase()
w.init_device()
from exporter import agent
a = agent.current()
print(json.dumps({{"wrapped": getattr(WorkerWrapperBase.init_device, "__boundwatch__", False),
                  "role": a.settings.role if a else None, "mode": a.mode if a else None,
                  "initialised": bool(w.initialised)}}))
agent.stop()
"""
)


@pytest.mark.parametrize("layout", ["v1.worker", "worker"])  # 0.11+ and 0.10.x
def test_worker_init_device_starts_the_light_agent_in_both_layouts(tmp_path: Path, layout: str) -> None:
    out = run(tmp_path, WORKER.format(layout=layout))
    assert out == {"wrapped": True, "role": "vllm_worker", "mode": "light", "initialised": True}


MP_EXECUTOR = (
    PRELUDE
    + """
from vllm.v1.core.sched.scheduler import SchedulerOutput
vllm.plugins.load_general_plugins()
from vllm.v1.engine.core import EngineCoreProc
core = EngineCoreProc(VllmConfig(max_num_seqs=16))
pid = os.fork()                                  # a GPU worker of the multiproc executor
if pid == 0:
    from vllm.v1.worker.worker_base import WorkerWrapperBase
    WorkerWrapperBase().init_device()
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner
    runner = GPUModelRunner(VllmConfig())
    for n in (4, 4, 12):                         # two decode steps in a FULL graph, one eager
        runner.execute_model(SchedulerOutput({i: n // 4 for i in range(4)}))
    runner.execute_model(SchedulerOutput({0: 4}), dummy_run=True)                  # warm-up: not a step
    runner.execute_model(SchedulerOutput({0: 4}), None, True)                      # positional dummy_run
    from exporter import agent
    agent.stop()
    os._exit(0)
os.waitpid(pid, 0)
for i in range(3):
    core.scheduler.add_request(f"r{i}", decode_steps=1)
core.step()
from exporter import agent
agent.stop()
print(json.dumps({"engine": os.getpid(), "worker": pid}))
"""
)


def test_worker_graph_modes_join_the_engine_core_that_forked_the_worker(tmp_path: Path) -> None:
    rx = listen(tmp_path)
    try:
        out = run(tmp_path, MP_EXECUTOR)
        datagrams = receive_all(rx)
    finally:
        rx.close()
    pids = {wire.decode(d).pid for d in datagrams}
    assert pids == {out["engine"], out["worker"]}
    (steps,) = feed_of(tmp_path, datagrams).collect().steps
    assert steps.pid == out["engine"] and steps.steps == 1
    assert (steps.graph_steps, steps.eager_steps) == (2, 1)


EAGER_WORKER = (
    PRELUDE
    + """
import time
from vllm.v1.core.sched.scheduler import SchedulerOutput
vllm.plugins.load_general_plugins()
from vllm.v1.worker.worker_base import WorkerWrapperBase
WorkerWrapperBase().init_device()                # a GPU worker of TP > 1: no engine core in this process
from vllm.v1.worker.gpu.model_runner import GPUModelRunner
from exporter import agent
from exporter.agent.switch import SWITCH
runner, a = GPUModelRunner(VllmConfig()), agent.current()
def steps(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:                # eager steps (no graph replay), the GIL let go between
        runner.execute_model(SchedulerOutput({i: 4 for i in range(4)}))
        t = time.perf_counter() + 0.001
        while time.perf_counter() < t:
            time.sleep(0)
steps(1.2)                                       # the agent's first cycle, on its own thread
woken, sent = a.wakes, a.sender.seq
steps(1.5)
out = {"wakes": a.wakes - woken, "driving": SWITCH.driving, "quiet": SWITCH.quiet, "sent": a.sender.seq - sent}
agent.stop()
print(json.dumps(out))
"""
)


def test_an_eager_workers_model_steps_drive_the_agent_where_no_engine_core_steps(tmp_path: Path) -> None:
    out = run(tmp_path, EAGER_WORKER)
    # no replay drives in eager mode: the runner's execute_model does, so the agent's thread, whose every
    # wake-up would take the GIL from the worker, sleeps while the ticks run on the worker's thread
    assert out["driving"] and not out["quiet"] and out["wakes"] <= 1, out
    assert out["sent"] >= 2, out  # the ticks went on: their messages (the mode counts) were built


V1_UNIPROC = (
    PRELUDE
    + """
from vllm.v1.core.sched.scheduler import SchedulerOutput
vllm.plugins.load_general_plugins()
from vllm.v1.worker.worker_base import WorkerWrapperBase
WorkerWrapperBase().init_device()                # the uni executor: the worker lives in EngineCore
from vllm.v1.engine.core import EngineCore
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
core, runner = EngineCore(VllmConfig()), GPUModelRunner(VllmConfig())
runner._dummy_run(4)                             # capture-time dispatch: not a step
core.scheduler.add_request("r0", decode_steps=2)
for n in (4, 16):
    core.step()
    runner.execute_model(SchedulerOutput({0: n}))
from exporter import agent
agent.stop()
print(json.dumps({"pid": os.getpid()}))
"""
)


def test_v1_runner_mode_counts_in_the_same_process_as_engine_core(tmp_path: Path) -> None:
    rx = listen(tmp_path)
    try:
        out = run(tmp_path, V1_UNIPROC)
        datagrams = receive_all(rx)
    finally:
        rx.close()
    (steps,) = feed_of(tmp_path, datagrams).collect().steps
    assert steps.pid == out["pid"] and steps.steps == 2
    assert (steps.graph_steps, steps.eager_steps) == (2, 0)  # FULL, then PIECEWISE: both graphs


def test_the_plugin_waits_for_modules_and_does_nothing_without_vllm(tmp_path: Path) -> None:
    code = """
import json, sys
from exporter.agent import plugins, importhook
plugins.vllm_plugin()
plugins.vllm_plugin()
print(json.dumps({"vllm": "vllm" in sys.modules, "waiting": importhook.waiting()}))
"""
    out = run(tmp_path, code)
    assert out["vllm"] is False
    assert "vllm.v1.engine.core" in out["waiting"] and "vllm.worker.worker_base" in out["waiting"]
