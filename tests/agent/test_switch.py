"""Sampled light hooks (exporter.agent.switch): swapped in and out whole, the counts of a slice scaled to the tick.

Against a stand-in torch (its CUDAGraph class) and a vLLM-shaped package whose EngineCore binds
step_fn at init, as vLLM's does; the switch itself with an injected clock.
"""

import itertools
import types
from pathlib import Path

import pytest

from exporter.agent.light import QUIET_AFTER
from exporter.agent.steps import StepTracker
from exporter.agent.switch import SWITCHED, Carry, Switch
from tests.agent import fake_torch, fake_vllm
from tests.agent.fresh import run_fresh
from tests.fakes.clock import Clock

ROOT = Path(__file__).resolve().parents[2]
MS = 1_000_000


def test_the_switch_puts_the_engines_own_functions_back_class_and_bound_alike() -> None:
    class Core:
        def __init__(self) -> None:
            self.step_fn = self.step

        def step(self) -> str:
            return "own"

    own = Core.__dict__["step"]

    def hooked(self: Core) -> str:
        return "hooked"

    sw = Switch(Clock(1_000 * MS))
    sw.add(Core, "step", own, hooked)
    core = Core()  # bound at init while the hook is in: its step_fn holds the hook
    assert core.step_fn() == "hooked" and getattr(hooked, SWITCHED)
    sw.adopt(core)
    sw.adopt(core)  # twice: managed once
    assert sw.start_cycle()
    sw.set_in(False)
    assert Core.__dict__["step"] is own and core.step_fn.__func__ is own and core.step_fn() == "own"
    assert not sw.hooks_in
    sw.set_in(True)
    assert Core.__dict__["step"] is hooked and core.step_fn() == "hooked"
    sw.set_in(False)
    sw.stop_cycle()  # the agent stopped: in for good, and no further swap takes them out
    sw.set_in(False)
    assert core.step_fn() == "hooked" and Core.__dict__["step"] is hooked


def one_site_cycling() -> tuple[types.SimpleNamespace, object, object, Switch]:
    """Return a module-like owner whose f is hooked, its own f, the hook, and a Switch cycling it."""
    mod = types.SimpleNamespace(f=lambda: "own")
    own = mod.f

    def hook() -> str:
        return "hooked"

    sw = Switch(Clock(1_000 * MS))
    sw.add(mod, "f", own, hook)
    assert sw.start_cycle()
    return mod, own, hook, sw


def test_a_hold_keeps_the_hooks_in_and_stops_the_cycle() -> None:
    mod, own, hook, sw = one_site_cycling()
    sw.set_in(False)
    assert mod.f is own
    sw.hold("sglang hooks")
    assert mod.f is hook and not sw.cycling and sw.held == "sglang hooks"
    assert not sw.start_cycle()  # held for good
    sw.set_in(False)
    assert mod.f is hook


def test_a_forked_child_puts_the_hooks_back_in_until_an_agent_cycles_them() -> None:
    mod, own, hook, sw = one_site_cycling()
    sw.set_in(False)
    sw.after_fork()  # the child has no agent's thread to put them back
    assert mod.f is hook and not sw.cycling and not sw.held
    sw.set_in(False)  # no cycle: nothing takes them out
    assert mod.f is hook
    assert sw.start_cycle()  # the child's own agent may cycle them again
    sw.set_in(False)
    assert mod.f is own


def test_the_scale_is_the_span_over_the_time_the_hooks_were_in() -> None:
    clock = Clock(1_000 * MS)
    sw = Switch(clock)
    assert sw.start_cycle()
    clock.t += 500 * MS
    assert sw.scale() == 1.0  # in the whole time: counts are exact
    sw.set_in(False)
    clock.t += 437 * MS
    sw.set_in(True)
    clock.t += 63 * MS
    sw.set_in(False)
    assert abs(sw.scale() - 500 / 63) < 1e-9
    clock.t += 500 * MS  # out the whole tick: nothing was counted, nothing to scale
    assert sw.scale() == 1.0
    sw.set_in(True)
    clock.t += 100 * MS
    sw.set_in(False)
    clock.t += 100 * MS
    sw.set_in(True)
    clock.t += 100 * MS  # still in at the scale: its time so far counts
    assert abs(sw.scale() - 300 / 200) < 1e-9


def test_a_tick_with_the_hooks_out_all_along_carries_its_span_to_the_next_slice_while_driving() -> None:
    # A call a period after the last tick ticks (an engine in bursts): where that is as the hooks go in,
    # nothing was sampled since, and the next slice's counts must stand for the whole stretch (a slow
    # engine's late calls would otherwise have its step rates cut to the in share: 1/8).
    clock = Clock(1_000 * MS)
    sw = Switch(clock)
    sw.add(types.SimpleNamespace(step=lambda: None), "step", lambda: None, lambda: None, rank=2)
    assert sw.start_cycle()
    assert sw.drive_inline(437 * MS, 63 * MS, 5 * MS, lambda: iter(()), lambda wake: None)
    sw.set_in(False)
    assert sw.scale() == 1.0
    clock.t += 450 * MS  # out all along: a tick here says nothing, and keeps the span
    assert sw.scale() == 1.0
    sw.set_in(True)
    clock.t += 63 * MS
    sw.set_in(False)
    assert abs(sw.scale() - 513 / 63) < 1e-9
    clock.t += 5_000 * MS  # out past two periods (a stop): dropped, as a catch-up drops it
    assert sw.scale() == 1.0
    sw.set_in(True)
    clock.t += 63 * MS
    sw.set_in(False)
    assert sw.scale() == 1.0


def test_carry_scales_counts_to_integers_without_drift() -> None:
    c = Carry()
    got = sum(c(("k",), 7, 500 / 63) for _ in range(1000))
    assert abs(got - 7 * 1000 * 500 / 63) <= 1
    assert c(("new",), 5, 1.0) == 5
    parts = c.many(("h",), (3, 0, 1), 2.5)
    assert parts == (7, 0, 2)  # 7.5, 0, 2.5: the halves carried
    assert c.many(("h",), (3, 0, 1), 2.5) == (8, 0, 3)


def test_scaled_light_steps_keep_the_histogram_counting_n_and_request_seconds_unscaled() -> None:
    t = StepTracker()
    t.per_step = False
    t.record("vllm", 0, 10 * MS, tokens=40, seqs=40, running=8, waiting=0, n=10)
    t.take(scale=1.0)
    t.record("vllm", 490 * MS, 500 * MS, tokens=40, seqs=40, running=8, waiting=0, n=10)
    (s,) = t.take(scale=8.0)
    assert s.n == 80 and sum(s.hist) == s.n  # the wire refuses a histogram that does not count n
    assert (s.tokens, s.seqs, s.wall) == (320, 320, 80 * MS)
    assert s.run_ns == 8 * 490 * MS  # read at each tick and integrated over real time: not scaled


def run(tmp_path: Path, code: str, mode: str = "", idle_wake: str = "30") -> dict:  # type: ignore[type-arg]
    env = {"WAKES_MODE": mode, "IDLE_WAKE": idle_wake} if mode else None
    return run_fresh(tmp_path, code, [fake_torch, fake_vllm], env, timeout=120)  # type: ignore[no-any-return]


REPLAYS = """
import json, threading, time
from exporter.agent import hooks
from exporter.agent.light import LightAgent
from exporter.agent.settings import Settings
from exporter.agent.switch import SWITCH
hooks.install()
import torch
own = torch.cuda.CUDAGraph.__dict__["replay"].__wrapped__  # the stand-in's own (the hook is in at import)
from tests.agent.fresh import ListSender
sent = (sender := ListSender()).sent
agent = LightAgent(Settings(socket="", flush_s=0.05, hook_share=0.5), sender=sender)
agent.start()
g = torch.cuda.CUDAGraph()
states, n = set(), 0
end = time.monotonic() + 3.0
while time.monotonic() < end:
    for _ in range(20):
        g.replay()
    n += 20
    states.add(SWITCH.hooks_in)
    time.sleep(0.0005)
agent.stop()
print(json.dumps({"true": n, "sent": sum(m.graphs.replays for m in sent if m.graphs), "states": sorted(states),
                  "cycling": SWITCH.cycling, "back": torch.cuda.CUDAGraph.__dict__["replay"] is not own}))
"""


def test_replays_counted_in_slices_add_up_to_the_true_count(tmp_path: Path) -> None:
    out = run(tmp_path, REPLAYS)
    assert out["states"] == [False, True]  # out between slices (the replay's own, behind its check), in them
    # a ratio estimate over 60 ticks, the hooks in half of each (an unscaled count would be off by half);
    # sampled in half rather than an eighth, so a loaded 2-core machine's scheduling stays within 15%
    assert abs(out["sent"] - out["true"]) <= 0.15 * out["true"], out
    assert out["back"] and not out["cycling"]  # stopped: the hook is in for good


ENGINE = """
import json, time
import vllm.plugins
from vllm.config import VllmConfig
from exporter import agent as agent_pkg
from exporter.agent.light import LightAgent
from exporter.agent.settings import Settings
from exporter.agent.switch import SWITCH
vllm.plugins.load_general_plugins()
from vllm.v1.engine.core import EngineCore
from tests.agent.fresh import ListSender
sent = (sender := ListSender()).sent
agent_pkg._agent = LightAgent(Settings(socket="", role="vllm_engine", flush_s=0.05, hook_share=0.5), sender=sender)
agent_pkg._agent.start()
core = EngineCore(VllmConfig(max_num_seqs=4))
own = EngineCore.__dict__["step"].__wrapped__
steps, seen, driven = 0, set(), set()
end = time.monotonic() + 3.0
while time.monotonic() < end:
    core.scheduler.add_request(f"r{steps}", decode_steps=1)
    steps += core.step_fn()[1]           # vLLM's busy loop calls the bound step_fn
    fn = core.step_fn.__func__
    seen.add((fn is own, fn is EngineCore.__dict__["step"], SWITCH.hooks_in))
    driven.add(SWITCH.driving)
wakes = agent_pkg._agent.wakes
agent_pkg._agent.stop()
got = [s for m in sent for s in m.steps]
print(json.dumps({"true": steps, "n": sum(s.n for s in got), "tokens": sum(s.tokens for s in got),
                  "seqs": sum(s.seqs for s in got), "seen": sorted(seen), "held": SWITCH.held,
                  "driven": sorted(driven), "wakes": wakes, "ticks": len(sent),
                  "hist_ok": all(sum(s.hist) == s.n for s in got)}))
"""


def test_a_vllm_engine_cores_bound_step_fn_is_swapped_and_its_steps_scaled(tmp_path: Path) -> None:
    out = run(tmp_path, ENGINE)
    # the bound step_fn swapped with the class: the engine's own (the first cycle, the agent's thread
    # swapping), then the hook and the own function behind the step's check (the step drives the cycle)
    # (the engine's own function, the class's, hooks in): bound and class swapped together; once the
    # step drives the cycle the step holds the hook in a slice and a thin check around its own between
    # (its own bare only where a step ran in the first cycle's out-time, the agent's thread swapping)
    driven_states = [[False, True, False], [False, True, True]]
    assert out["held"] == "" and out["seen"] in (driven_states, [*driven_states, [True, True, False]]), out
    assert out["driven"] == [False, True]
    assert out["wakes"] <= 4, out  # the agent's thread: its first cycle, then asleep while the engine steps
    assert abs(out["n"] - out["true"]) <= 0.15 * out["true"], out  # as the replays' test: 60 ticks, half in
    assert out["tokens"] == out["seqs"] and out["hist_ok"]  # one token per sequence: ratios survive the scale


def test_a_step_hook_installed_by_hand_holds_the_hooks_in(tmp_path: Path) -> None:
    code = """
import json
from exporter import agent as agent_pkg
from exporter.agent import plugins
from exporter.agent.light import LightAgent
from exporter.agent.settings import Settings
from exporter.agent.switch import SWITCH
class Core:
    def step(self):
        return {}, True
Core.step = plugins.wrap_step(Core.step, "vllm", lambda core, n: (n, n))
agent_pkg._agent = LightAgent(Settings(socket="", flush_s=0.1))
agent_pkg._agent.start()
Core().step()
print(json.dumps({"held": SWITCH.held, "cycling": SWITCH.cycling}))
agent_pkg._agent.stop()
"""
    out = run(tmp_path, code)
    assert out == {"held": "a step hook installed by hand", "cycling": False}


WAKES = """
import json, os, time
from exporter.agent import hooks
from exporter.agent.light import LightAgent
from exporter.agent.settings import Settings
from exporter.agent.switch import SWITCH
hooks.install()
import torch
from tests.agent.fresh import ListSender
stepping = os.environ["WAKES_MODE"] == "stepping"
sender = ListSender()
idle_wake = float(os.environ["IDLE_WAKE"])
agent = LightAgent(Settings(socket="", flush_s=0.05, hook_share=0.25, idle_wake_s=idle_wake), sender=sender)
in_at_tick, phases = [], agent.phases
def counted_tick(*a, **k):  # every tick: the agent thread's, the engine's in phases, stop()'s
    in_at_tick.append(SWITCH.hooks_in)
    return phases(*a, **k)
agent.phases = counted_tick
agent.start()
g, replays = torch.cuda.CUDAGraph(), 0
if os.environ["WAKES_MODE"] == "stepping":  # idle first (the agent's thread drives), then the engine steps
    time.sleep(0.5)
woken_idle = agent.wakes
end = time.monotonic() + 1.0
while time.monotonic() < end:
    if stepping:  # an engine replaying a graph every ~0.5 ms, letting go of the GIL between (as torch's
        g.replay()  # ops do), so the agent's thread, were it awake, would take the GIL at once
        replays += 1
        t = time.perf_counter() + 0.0005
        while time.perf_counter() < t:
            time.sleep(0)
    else:
        time.sleep(0.01)
wakes, driven = agent.wakes - woken_idle, SWITCH.driving
agent.stop()
got = sum(m.graphs.replays for m in sender.sent if m.graphs)
print(json.dumps({"wakes": wakes, "ticks": len(in_at_tick) - 1, "in_at_tick": sorted(set(in_at_tick[:-1])),
                  "driven": driven, "replays": replays, "sent": got,
                  "states": [m.state for m in sender.sent if m.state != "stopped"]}))
"""


@pytest.mark.parametrize("idle_wake", ["inf", "30", "0"])
def test_with_no_engine_stepping_the_agents_thread_swaps_the_hooks_in_ticks_then_goes_quiet(
    tmp_path: Path, idle_wake: str
) -> None:
    out = run(tmp_path, WAKES, "idle", idle_wake)  # the idle run counts the first cycle's wake-ups too
    # (an engine never seen stepping fast gets no idle wake: the thread's rescue, as with none)
    # nothing steps, so the agent's thread wakes on its timer: its first cycle (in, out, tick), then
    # once to swap the hooks in where no step came to, once a tick with them left in; after
    # QUIET_AFTER ticks that saw nothing it says so and sleeps: over the rest of the second no tick,
    # no wake-up (each would take the GIL from a thread that runs)
    assert out["ticks"] == QUIET_AFTER and out["driven"], out
    assert 2 * out["ticks"] - 1 <= out["wakes"] <= 2 * out["ticks"] + 1, out
    # the first tick's message, then the quiet one (and stop()'s last tick, before "stopped")
    assert out["states"] == ["running", "quiet", "running"], out
    # the first cycle's tick runs with the hooks out; the thread's next with them in (not swapped out
    # again for nobody); the last tick is stop()'s, the hooks in for good
    assert out["in_at_tick"] == [False, True]


@pytest.mark.parametrize("idle_wake", ["inf", "30", "0"])
def test_while_the_engine_steps_its_own_thread_drives_the_cycle_and_the_agent_sleeps(
    tmp_path: Path, idle_wake: str
) -> None:
    out = run(tmp_path, WAKES, "stepping", idle_wake)
    assert out["driven"] and out["ticks"] >= 10, out  # flush_s 0.05 over 1 s: the ticks go on, inline
    # each wake-up would take the GIL from the engine (130-145 us on the H200's VM): after half a second
    # idle (the agent's thread swapping), the steps take the cycle over at the next due; one wake-up
    # the timer had set before, a few more on a loaded machine at most
    assert out["wakes"] <= 4, out
    # the engine's ticks run with the hooks out (its slice ended); the thread's, while idle, in
    assert out["in_at_tick"] == [False, True]
    # the replays counted in the quarter slices, scaled, add up to the true count (a ratio estimator
    # over ~20 ticks on a loaded machine: within 20%)
    assert abs(out["sent"] - out["replays"]) <= 0.2 * out["replays"], out


QUIET = """
import json, time
from exporter.agent import hooks
from exporter.agent.light import LightAgent
from exporter.agent.settings import Settings
from exporter.agent.switch import SWITCH
hooks.install()
import torch
from tests.agent.fresh import ListSender
sender = ListSender()
agent = LightAgent(Settings(socket="", flush_s=0.05, hook_share=0.25), sender=sender)
agent.start()
g = torch.cuda.CUDAGraph()
time.sleep(0.6)  # idle: two ticks that see nothing, then quiet
quiet, woken = SWITCH.quiet, agent.wakes
time.sleep(0.3)
woken_quiet = agent.wakes - woken
n = len(sender.sent)
g.replay()  # the engine starts: its first replay says at once that the agent runs again (no counts yet)
said = [(m.state, m.graphs is None, len(m.steps)) for m in sender.sent[n:]]
replays, end = 1, time.monotonic() + 1.0
while time.monotonic() < end:  # the engine starts: a replay every ~0.5 ms, the GIL let go between
    g.replay()
    replays += 1
    t = time.perf_counter() + 0.0005
    while time.perf_counter() < t:
        time.sleep(0)
stepping_wakes, resumed = agent.wakes - woken, not SWITCH.quiet
agent.stop()
states = [m.state for m in sender.sent if m.state != "stopped"]
print(json.dumps({"quiet": quiet, "woken_quiet": woken_quiet, "stepping_wakes": stepping_wakes,
                  "resumed": resumed, "replays": replays, "states": states, "said": said,
                  "sent": sum(m.graphs.replays for m in sender.sent if m.graphs)}))
"""


def test_a_quiet_agent_sleeps_and_the_first_replay_resumes_the_cycle_on_the_engines_thread(
    tmp_path: Path,
) -> None:
    out = run(tmp_path, QUIET)
    assert out["quiet"] and out["woken_quiet"] == 0, out  # quiet: the agent's thread sleeps
    # the first replay resumes the cycle where it runs: the engine's thread swaps and ticks, the agent's
    # thread stays asleep (one wake-up at most, on a loaded machine)
    assert out["resumed"] and out["stepping_wakes"] <= 1, out
    assert out["said"] == [["running", True, 0]], out  # at the first replay, before any tick: no counts
    first_quiet = out["states"].index("quiet")
    assert "running" in out["states"][first_quiet + 1 :], out  # the ticks after it say running again
    # counted in full while quiet (the hooks in), sampled after: the sum stays the true count
    assert abs(out["sent"] - out["replays"]) <= 0.2 * out["replays"], out


def test_held_hooks_keep_ticking_on_the_engines_thread_without_a_swap() -> None:
    clock = Clock(1_000 * MS)
    sw = Switch(clock)
    mod = types.SimpleNamespace(step=lambda: "own")
    own = mod.step
    calls: list[str] = []

    def hook() -> str:
        calls.append("hook")
        return "hooked"

    sw.add(mod, "step", own, hook, rank=2)
    sw.hold("sglang hooks")
    ticks: list[int] = []
    wakes: list[int] = []

    def tick() -> object:
        ticks.append(clock())
        yield

    assert sw.drive_inline(40 * MS, 10 * MS, 5 * MS, tick, wakes.append)  # held: ticks only, every 50 ms
    for _ in range(20):  # 20 steps, 10 ms apart
        clock.t += 10 * MS
        assert mod.step() == "hooked"  # always the hook: nothing is swapped out
    assert sw.hooks_in and len(calls) == 20
    # one tick a period (due at 1,050 ms, its phase on the step after), the steps' last due left pending
    assert ticks == [1_060 * MS, 1_110 * MS, 1_160 * MS], ticks
    assert wakes and all(w > clock() - 50 * MS for w in wakes[-1:])  # the agent's timer kept ahead
    mod.step()  # the tick pending since 1,200 ms: its phase
    clock.t += 500 * MS  # the engine stalls for ten periods, then steps again
    for _ in range(3):  # the last tick's end; the tick due (one, not ten); its phase
        mod.step()
    assert ticks[-1] == clock() and len(ticks) == 5, ticks
    mod.step()
    assert sw.due[0] == clock() + 50 * MS  # the next a period from the step that found it late


def test_a_hook_outside_the_switch_drives_by_polling() -> None:
    clock = Clock(1_000 * MS)
    sw = Switch(clock)
    sw.hold("sglang hooks")
    ticks: list[int] = []

    def tick() -> object:
        ticks.append(clock())
        yield

    assert not sw.drive_inline(40 * MS, 10 * MS, 5 * MS, tick, lambda w: None)  # nothing drives yet
    sw.poll()  # SGLang's run_batch: it steps
    assert sw.drive_inline(40 * MS, 10 * MS, 5 * MS, tick, lambda w: None)
    for _ in range(12):
        clock.t += 10 * MS
        sw.poll()
    assert len(ticks) == 2, ticks  # at 50 and 100 ms


def test_quiet_holds_the_hooks_in_and_the_first_driving_call_resumes_the_cycle() -> None:
    mod, _own, hook, sw = one_site_cycling()
    clock = sw._clock
    sw.set_in(False)
    wakes: list[int] = []
    ticks: list[int] = []

    def tick() -> object:
        ticks.append(clock())
        yield

    sw.add(mod, "g", lambda: "g own", lambda: "g hook", rank=1)  # a replay-like driver site
    assert sw.drive_inline(40 * MS, 10 * MS, 5 * MS, tick, wakes.append, quiet=True)
    assert sw.quiet and sw.hooks_in and mod.f is hook and wakes[-1] == 0  # in; the agent's timer disarmed
    clock.t += 5_000 * MS  # a long idle: nothing is swapped or ticked
    assert ticks == [] and sw.quiet
    assert mod.g() == "g hook"  # the first driving call resumes: counted (the hooks were in), no tick yet
    assert not sw.quiet and wakes[-1] == clock() + 10 * MS + 5 * MS  # an in slice from now, the timer past it
    clock.t += 10 * MS
    mod.g()  # the slice ends here: out, and the tick
    assert not sw.hooks_in
    mod.g()
    assert ticks == [clock()]


def test_the_call_that_resumes_a_quiet_cycle_says_so_once_on_the_engines_thread() -> None:
    """A quiet agent's sidecar counts its silence as no replay: the resuming call sends word at once."""
    mod, _own, _hook, sw = one_site_cycling()
    clock = sw._clock
    resumed: list[int] = []

    def tick() -> object:
        yield

    sw.add(mod, "g", lambda: "g own", lambda: "g hook", rank=1)
    sw.drive_inline(
        40 * MS, 10 * MS, 5 * MS, tick, lambda w: None, quiet=True, on_resume=lambda: resumed.append(clock())
    )
    clock.t += 5_000 * MS
    sw.drive(by_thread=True)  # the agent's thread (its quiet beat) never resumes, nor says so
    assert sw.quiet and resumed == []
    mod.g()  # the engine replays: resumed, and said at once
    assert not sw.quiet and resumed == [clock()]
    for _ in range(30):  # the cycle goes on: said once
        clock.t += 5 * MS
        mod.g()
    assert resumed == [clock() - 150 * MS]
    # quiet again without a resumer (none could be built), then resumed: nothing said, nothing raised
    sw.drive_inline(40 * MS, 10 * MS, 5 * MS, tick, lambda w: None, quiet=True)
    mod.g()
    assert not sw.quiet and len(resumed) == 1
    # a resumer that fails costs the engine's call nothing
    sw.drive_inline(40 * MS, 10 * MS, 5 * MS, tick, lambda w: None, quiet=True, on_resume=lambda: 1 / 0)
    assert mod.g() == "g hook" and not sw.quiet
    # stopped while quiet: the resumer is dropped with the drive
    sw.drive_inline(
        40 * MS, 10 * MS, 5 * MS, tick, lambda w: None, quiet=True, on_resume=lambda: resumed.append(0)
    )
    sw.undrive()
    mod.g()
    assert len(resumed) == 1


def two_step_sites() -> tuple[types.SimpleNamespace, Clock, Switch, list[str], list[int]]:
    """Return a module with two rank-2 step sites (`dead` added first, never called; `live`), its clock,
    the switch, the hooks' calls and the ticks."""
    clock = Clock(1_000 * MS)
    sw = Switch(clock)
    mod = types.SimpleNamespace(dead=lambda: "dead own", live=lambda: "live own", replay=lambda: "replay own")
    calls: list[str] = []
    for name in ("dead", "live"):
        own = getattr(mod, name)

        def hook(name: str = name) -> str:
            calls.append(name)
            return f"{name} hooked"

        sw.add(mod, name, own, hook, rank=2)
    assert sw.start_cycle()
    ticks: list[int] = []
    return mod, clock, sw, calls, ticks


def test_a_driver_site_never_called_hands_the_drive_to_the_one_that_steps() -> None:
    mod, clock, sw, calls, ticks = two_step_sites()

    def tick() -> object:
        ticks.append(clock())
        yield

    wakes: list[int] = []
    assert sw.drive_inline(40 * MS, 10 * MS, 5 * MS, tick, wakes.append)
    assert mod.live() == "live hooked" and not sw._claims  # in, but not the driver: its plain hook
    clock.t += 15 * MS  # the in slice's due went by: the driver (`dead`) never came
    # the agent's thread ticks and leaves the hooks in; `live` now holds a claiming hook
    assert sw.drive(by_thread=True) and sw._missed == 1 and ticks == [clock()]
    calls.clear()
    assert mod.live() == "live hooked" and calls == ["live"]  # counted; it took the drive over
    assert sw._driver == 1 and not sw._missed
    n = len(wakes)
    for _ in range(40):  # 40 steps 5 ms apart: the steps swap and tick, the timer always past them
        clock.t += 5 * MS
        mod.live()
    assert len(ticks) >= 4 and all(w > clock() for w in wakes[n:][-1:])
    claiming = set(sw._claims.values())
    assert not sw._missed and not claiming & {mod.dead, mod.live}  # nothing claims in steady state
    # in until the thread's due (45 ms: 9 steps), then out 40 ms, in 10 ms by the steps: ~15 of 41 counted
    assert 12 <= calls.count("live") <= 18, calls.count("live")


def test_a_quiet_agent_is_resumed_by_whichever_driver_site_is_called() -> None:
    mod, clock, sw, calls, _ = two_step_sites()
    wakes: list[int] = []
    assert sw.drive_inline(40 * MS, 10 * MS, 5 * MS, lambda: iter(()), wakes.append, quiet=True)
    clock.t += 5_000 * MS
    assert mod.live() == "live hooked" and not sw.quiet  # a GPU worker's runner: it resumes the cycle
    assert wakes[-1] == clock() + 15 * MS and calls == ["live"]


def test_a_lower_rank_site_claims_the_drive_only_after_a_second_miss() -> None:
    mod, clock, sw, _, _ = two_step_sites()
    sw.add(mod, "replay", mod.replay, lambda: "replay hooked", rank=1)
    assert sw.drive_inline(40 * MS, 10 * MS, 5 * MS, lambda: iter(()), lambda w: None)
    clock.t += 15 * MS
    sw.drive(by_thread=True)  # one miss: the thread ticks, the hooks left in
    assert sw._missed == 1 and sw.hooks_in
    mod.replay()  # a replay (rank 1) does not take the drive from a step (rank 2) at one miss
    assert sw._driver == 0
    clock.t += 50 * MS
    sw.drive(by_thread=True)  # two misses
    mod.replay()
    assert sw._driver == 2 and sw._rank == 1 and not sw._missed  # the replay drives now
    assert not set(map(id, sw._claims.values())) & {id(mod.live), id(mod.dead)}  # no claiming hooks left
    clock.t += 50 * MS
    mod.replay()  # past its due: the replay swaps the hooks out, by the engine's thread
    mod.replay()  # and runs the tick
    assert not sw.hooks_in and not sw._missed
    clock.t += 45 * MS  # then only eager steps: the replay misses its due once, the thread swaps in
    assert sw.drive(by_thread=True) and sw._missed == 1
    assert mod.live is sw._claims[1]
    mod.live()  # the engine's step (rank 2) takes the drive back at the first miss
    assert sw._driver == 1 and sw._rank == 2 and mod.live is not sw._claims[1]


BEAT = """
import json, os, time
from exporter.agent import hooks
from exporter.agent.light import LightAgent
from exporter.agent.settings import Settings
hooks.install()
import torch
from tests.agent.fresh import ListSender
sender = ListSender()
agent = LightAgent(Settings(socket="", flush_s=0.05, hook_share=0.25, quiet_beat_s=float(os.environ["BEAT"])),
                   sender=sender)
agent.start()
g = torch.cuda.CUDAGraph()
time.sleep(0.3)  # two idle ticks: quiet
quiet_at, woken = len(sender.sent), agent.wakes
time.sleep(1.05)  # quiet: a beat every 0.25 s
beats, beat_wakes = [m.state for m in sender.sent[quiet_at:]], agent.wakes - woken
with torch.cuda.graph(torch.cuda.CUDAGraph()):  # a capture while quiet: no driver site is called
    pass
at = len(sender.sent)
time.sleep(0.3)  # the next beat sends what the hooks (in) counted, then says quiet again
captured = [[m.state, m.graphs.captures if m.graphs else None] for m in sender.sent[at:]]
g.replay()  # the engine steps: the cycle resumes on its thread, the beat's timer replaced
time.sleep(0.2)
agent.stop()
print(json.dumps({"beats": beats, "beat_wakes": beat_wakes, "captured": captured,
                  "after": [m.state for m in sender.sent],
                  "captures_sent": max((m.graphs.captures for m in sender.sent if m.graphs), default=0)}))
"""


def test_a_quiet_agent_with_a_beat_says_so_again_every_beat_so_a_restarted_sidecar_finds_it(
    tmp_path: Path,
) -> None:
    out = run_fresh(tmp_path, BEAT, [fake_torch, fake_vllm], {"BEAT": "0.25"}, timeout=120)
    # one message and one wake-up a beat (a sidecar started while the engine idles learns of it)
    assert out["beats"] == ["quiet"] * len(out["beats"]) and 3 <= len(out["beats"]) <= 5, out
    assert 3 <= out["beat_wakes"] <= 5, out
    # a capture while quiet (no step, no replay): the next beat sends it, then says quiet again
    assert out["captured"][:2] == [["running", 1], ["quiet", None]], out
    assert out["after"][-2] == "running", out  # resumed by the replay (then stop()'s last message)


def test_a_quiet_agent_without_a_beat_the_default_never_wakes_and_a_capture_waits_for_the_next_step(
    tmp_path: Path,
) -> None:
    out = run_fresh(tmp_path, BEAT, [fake_torch, fake_vllm], {"BEAT": "0"}, timeout=120)
    # quiet: no message and no wake-up of the agent's thread (each a GIL take from the engine's)
    assert out["beats"] == [] and out["beat_wakes"] == 0, out
    # a capture while quiet is counted by the hooks (in) and sent once the engine steps again: the
    # replay resumes the cycle and stop()'s tick sends the capture with it
    assert out["captured"] == [] and out["captures_sent"] == 1, out
    assert out["after"][-2] == "running", out


def test_a_driver_of_self_alone_gets_checks_of_that_signature_others_pass_everything_through() -> None:
    class Core:
        def step(self) -> str:
            return "own"

        def execute_model(self, out: object, tensors: object = None) -> tuple[object, ...]:
            return out, tensors

    for name, hook, call, own, hooked in (
        ("step", lambda self: "hooked", lambda c: c.step(), "own", "hooked"),
        (
            "execute_model",
            lambda self, out, tensors=None: ("hooked", out, tensors),
            lambda c: c.execute_model(1, tensors=2),
            (1, 2),
            ("hooked", 1, 2),
        ),
    ):
        sw = Switch(Clock(1_000 * MS))
        original = Core.__dict__[name]
        sw.add(Core, name, original, hook, rank=2)
        assert sw.start_cycle() and sw.drive_inline(
            40 * MS, 10 * MS, 5 * MS, lambda: iter(()), lambda w: None
        )
        code = Core.__dict__[name].__code__
        # a step of self alone: a check of that signature, no (*args, **kwargs) frame on the step's path
        assert (code.co_argcount == 1) == (name == "step"), code
        assert call(Core()) == hooked  # the first slice: in
        sw.set_in(False)
        assert call(Core()) == own
        sw.stop_cycle()
        setattr(Core, name, original)


def test_the_agents_thread_puts_the_hooks_in_once_for_an_engine_that_stopped_and_ticks_each_period() -> None:
    mod, _own, hook, sw = one_site_cycling()
    clock = sw._clock
    sw.add(mod, "step", lambda: "own step", lambda: "hooked step", rank=2)
    sw.set_in(False)  # the agent's first cycle ends with the hooks out
    ticks: list[int] = []

    def tick() -> object:
        ticks.append(clock())
        yield

    assert sw.drive_inline(40 * MS, 10 * MS, 5 * MS, tick, lambda w: None)
    swaps, was = 0, sw.hooks_in
    for _ in range(6):  # the engine stopped: the thread wakes a margin past each due
        clock.t = sw.due[0] + 5 * MS
        sw.drive(by_thread=True)
        swaps, was = swaps + (sw.hooks_in != was), sw.hooks_in
    assert swaps == 1 and sw.hooks_in and mod.f is hook  # in once, then left in for whatever comes
    assert len(ticks) == 5 and all(b - a == 50 * MS for a, b in itertools.pairwise(ticks))
    assert mod.step() == "hooked step"  # the step comes back: counted, and it drives again
    clock.t = sw.due[0]
    mod.step()
    assert not sw.hooks_in  # sliced again by the engine's thread


def launch_and_step_sites() -> tuple[types.SimpleNamespace, Clock, Switch, list[str]]:
    """Return a module with an engine step (rank 2) and a graph launch (rank 1, its original queues work),
    its clock, the switch cycling, and the log the launch's original and the tick's phases write to."""
    clock = Clock(1_000 * MS)
    sw = Switch(clock)
    log: list[str] = []
    mod = types.SimpleNamespace(step=lambda: "own step", replay=lambda: log.append("launch"))
    mod.own_replay = mod.replay
    sw.add(mod, "replay", mod.replay, lambda: log.append("counted launch"), rank=1, launches=True)
    sw.add(mod, "step", mod.step, lambda: "hooked step", rank=2)
    assert sw.start_cycle()
    return mod, clock, sw, log


def three_phases(log: list[str]) -> object:
    for i in range(3):
        log.append(f"phase{i}")
        yield


def test_a_pending_ticks_phases_run_after_the_graph_launch_one_a_step_and_the_launch_site_is_put_back() -> (
    None
):
    mod, clock, sw, log = launch_and_step_sites()
    assert sw.drive_inline(40 * MS, 10 * MS, 5 * MS, lambda: three_phases(log), lambda w: None)
    per_step: list[list[str]] = []
    for _ in range(9):  # steps 5 ms apart: in for 10 ms, then out, the tick pending (the next at 60 ms)
        clock.t += 5 * MS
        log.clear()
        mod.step()
        mod.replay()
        per_step.append(list(log))
    phased = [s for s in per_step if any(x.startswith("phase") for x in s)]
    # each phase right after the step's launch, one a step, none before it (the driver ran none)
    assert phased == [["launch", "phase0"], ["launch", "phase1"], ["launch", "phase2"]], per_step
    assert not sw.hooks_in and mod.replay is mod.own_replay  # the tick done: the engine's own replay again
    assert (
        sw.due[0] > clock() and sw.after_launch == 4
    )  # the due restored; 3 phases and the end after launches


def test_each_ticks_phases_run_after_the_launch_through_one_runner_made_once() -> None:
    mod, clock, sw, log = launch_and_step_sites()
    assert sw.drive_inline(40 * MS, 10 * MS, 5 * MS, lambda: three_phases(log), lambda w: None)
    runners, phases = [], []
    for _ in range(40):  # four cycles of 50 ms, steps 5 ms apart
        clock.t += 5 * MS
        log.clear()
        mod.step()
        if not sw.hooks_in and mod.replay is not mod.own_replay:  # a tick pending: the site holds the runner
            runners.append(mod.replay)
        mod.replay()
        phases += [x for x in log if x.startswith("phase")]
    assert phases == ["phase0", "phase1", "phase2"] * 4, phases  # every tick's phases, after launches
    # the runner is made once and placed again at each tick (making it cost ~20 us on the H200)
    assert len(runners) >= 4 and len({id(r) for r in runners}) == 1, runners


def test_an_engine_that_launches_no_graph_gets_the_ticks_phases_from_its_step() -> None:
    mod, clock, sw, log = launch_and_step_sites()
    assert sw.drive_inline(40 * MS, 10 * MS, 5 * MS, lambda: three_phases(log), lambda w: None)
    for _ in range(9):  # eager steps: the launch site is never called
        clock.t += 5 * MS
        mod.step()
    assert [x for x in log if x.startswith("phase")] == ["phase0", "phase1", "phase2"], log
    assert mod.replay is mod.own_replay and not sw.hooks_in


class CountedSteps:
    """One engine step site (rank 2) on a fake clock whose hook counts each call; ticks turn the counts
    into estimates (count x scale); the agent's timer is `armed` (0: disarmed)."""

    def __init__(self) -> None:
        self.clock = Clock(1_000 * MS)
        self.sw = Switch(self.clock)
        self.counted = [0]
        self.mod = types.SimpleNamespace(step=lambda: None)
        self.sw.add(self.mod, "step", self.mod.step, self._hook, rank=2)
        assert self.sw.start_cycle()
        self.estimates: list[float] = []
        self.armed = [0]

    def _hook(self) -> None:
        self.counted[0] += 1

    def tick(self) -> object:
        self.estimates.append(self.counted[0] * self.sw.scale())
        self.counted[0] = 0
        yield

    def drive_inline(self, out_ns: int, in_ns: int, margin_ns: int, idle_wake: int) -> bool:
        rearm = self.armed.__setitem__
        return self.sw.drive_inline(
            out_ns, in_ns, margin_ns, self.tick, lambda w: rearm(0, w), idle_wake_ns=idle_wake
        )


def test_with_an_idle_wake_an_engine_that_stops_and_resumes_is_counted_right_with_no_thread_waking() -> None:
    import random

    e = CountedSteps()
    clock, sw, mod, counted, estimates, armed = e.clock, e.sw, e.mod, e.counted, e.estimates, e.armed
    idle_wake = 30_000 * MS
    assert e.drive_inline(40 * MS, 10 * MS, 5 * MS, idle_wake)
    rng, true, thread_wakes = random.Random(7), 0, 0
    for _ in range(30):  # bursts of 0.3-1 s of 1 ms steps, each followed by a stop of 0.1-5 s
        for _ in range(rng.randint(300, 1000)):
            clock.t += 1 * MS
            if 0 < armed[0] <= clock():  # the agent's timer came due before this step: its thread woke
                thread_wakes += 1
                sw.drive(by_thread=True)
            mod.step()
            true += 1
        clock.t += rng.randint(100, 5_000) * MS
    # once the engine stepped fast its drives set the agent's timer an idle wake on: the stops (up to
    # 5 s) never let it come due, so the thread never woke (the first cycle armed a rescue a margin past
    # its due, and the engine swapped before it)
    assert thread_wakes == 0 and sw.fast and sw.idle_armed
    for _ in range(3):  # the engine stopped for good: the agent's thread wakes (its timer) and catches up
        clock.t += idle_wake
        sw.drive(by_thread=True)
    assert counted[0] == 0 and sw._pending is None  # what the hooks counted went out in a tick
    # the ticks scaled over the time the hooks were in: a stretch the hooks missed was left out (else a
    # tick after a 5 s stop would count ~100 times its slice), so the estimate stays the true count, less
    # what the slices before each stop did not see (sampling: up to a cycle's steps a stop)
    assert abs(sum(estimates) - true) <= 0.1 * true, (sum(estimates), true)
    assert max(estimates) <= 12 * 5, max(estimates)  # no tick stood for more than its ~50 ms of steps


def test_a_fast_engines_drives_set_the_agents_timer_once_per_half_idle_wake_not_at_each_swap() -> None:
    """Each set of the timer is a syscall through ctypes (~32 us on the H200): one standing at least
    half an idle wake ahead is left, so a minute of 1 ms steps sets it a few times, not at ~2,400 swaps."""
    e = CountedSteps()
    clock, sw, mod = e.clock, e.sw, e.mod
    idle_wake = 30_000 * MS
    sets: list[int] = []
    assert sw.drive_inline(40 * MS, 10 * MS, 5 * MS, e.tick, sets.append, idle_wake_ns=idle_wake)
    start, swaps, was = clock(), 0, sw.hooks_in
    for _ in range(60_000):  # a minute of 1 ms steps
        clock.t += 1 * MS
        mod.step()
        swaps, was = swaps + (sw.hooks_in != was), sw.hooks_in
    assert swaps > 2_000 and sw.fast and sw.idle_armed
    # a rescue a margin past each due until the first slice shows the engine fast, then one about every 15 s
    assert 4 <= len(sets) <= 8, sets
    # where it stands, the timer is always at least half an idle wake ahead, at most a whole one
    assert clock() + idle_wake // 2 <= sets[-1] <= clock() + idle_wake
    # stopped, the engine's thread no longer drives: the agent's thread wakes 15-30 s after its last step
    assert idle_wake // 2 <= sets[-1] - clock() and sets[-1] - start > 60_000 * MS


def test_a_slow_engine_keeps_the_threads_rescue_and_its_steps_are_counted_right() -> None:
    """Steps of 100 ms outlast the 62.5 ms slice: the thread's timer stays a margin past each due."""
    e = CountedSteps()
    clock, sw, mod, counted, estimates, armed = e.clock, e.sw, e.mod, e.counted, e.estimates, e.armed
    idle_wake = 30_000 * MS
    assert e.drive_inline(437_500_000, 62_500_000, 31 * MS, idle_wake)
    thread_wakes = 0
    for _ in range(600):  # a minute of 100 ms steps
        clock.t += 100 * MS
        at = clock()
        while 0 < armed[0] <= at:  # the thread's rescue, a margin past a due the engine missed
            clock.t, armed[0] = armed[0], 0
            thread_wakes += 1
            sw.drive(by_thread=True)
        clock.t = at
        mod.step()
    assert not sw.fast and not sw.idle_armed and 0 < armed[0] < clock() + 1_000 * MS  # never the idle wake
    assert thread_wakes > 50, thread_wakes
    # counted in the slices the engine or the thread opened, scaled: within 15% of the 600 steps
    assert abs(sum(estimates) + counted[0] - 600) <= 90, (sum(estimates), counted[0])


SPIN = """
import json, os, time
from exporter.agent import hooks
from exporter.agent.light import LightAgent
from exporter.agent.settings import Settings
from exporter.agent.switch import SWITCH
hooks.install()
import torch
from tests.agent.fresh import ListSender
sender = ListSender()
agent = LightAgent(Settings(socket="", flush_s=0.05, hook_share=0.25, idle_wake_s=float(os.environ["IDLE_WAKE"])),
                   sender=sender)
agent.start()
g, replays = torch.cuda.CUDAGraph(), 0
def replay_for(seconds):
    global replays
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # a replay every ~0.5 ms, the GIL let go between (as torch's ops do)
        g.replay()
        replays += 1
        t = time.perf_counter() + 0.0005
        while time.perf_counter() < t:
            time.sleep(0)
replay_for(0.6)
woken, end, spins = agent.wakes, time.monotonic() + 1.0, 0
while time.monotonic() < end:  # the engine stops and spins in Python, never letting go of the GIL itself
    spins += 1
spin_wakes, quiet = agent.wakes - woken, SWITCH.quiet
replay_for(0.6)
agent.stop()
print(json.dumps({"spin_wakes": spin_wakes, "quiet": quiet, "replays": replays,
                  "states": sorted({m.state for m in sender.sent}),
                  "silent_ms": sorted({m.silent_ms for m in sender.sent}),
                  "sent": sum(m.graphs.replays for m in sender.sent if m.graphs)}))
"""


@pytest.mark.parametrize("idle_wake", ["inf", "30", "0.3"])
def test_an_engine_that_stops_and_spins_loses_no_gil_to_the_agent_until_the_idle_wake(
    tmp_path: Path, idle_wake: str
) -> None:
    out = run_fresh(tmp_path, SPIN, [fake_torch], {"IDLE_WAKE": idle_wake}, timeout=120)
    if idle_wake != "0.3":  # never (the default), or the spin is shorter than it: the thread never woke
        assert out["spin_wakes"] == 0 and not out["quiet"] and "quiet" not in out["states"], out
    else:  # it woke once, 0.3 s after the last step: caught up, said quiet and slept
        assert out["spin_wakes"] == 1 and out["quiet"] and "quiet" in out["states"], out
    # each message says how long the sidecar may hear nothing while the engine steps: two ticks
    # (flush_s 0.05; every tick that counted a replay sends) and a quarter second
    assert out["silent_ms"] == [350], out
    # before the stop, across it and after it, the replays counted in slices add up to the true count
    assert abs(out["sent"] - out["replays"]) <= 0.2 * out["replays"], out


class CountedSets(type):
    """A metaclass that counts every set of its classes' attributes (each one a new type version)."""

    sets = 0

    def __setattr__(cls, name: str, value: object) -> None:
        CountedSets.sets += 1
        super().__setattr__(name, value)


def test_on_a_python_that_caps_type_versions_a_class_is_changed_a_bounded_number_of_times_then_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Python 3.13+ gives a class 1,000 type versions, each class attribute set using one: past the cap
    its instances run unspecialised for good (bench/class_versions.py: 81 -> 308 ns a round). The switch
    stops at CLASS_CHANGES_MAX changes of a class and holds the hooks in, still ticking."""
    from exporter.agent import switch as switch_mod

    monkeypatch.setattr(switch_mod, "CLASS_CHANGES_MAX", 20)
    CountedSets.sets = 0
    engine_core = CountedSets("EngineCore", (), {"step": lambda self: "own step"})
    own, counted = engine_core.__dict__["step"], [0]

    def hook(self: object) -> str:
        counted[0] += 1
        return "hooked step"

    clock = Clock(1_000 * MS)
    sw = Switch(clock)
    sw.add(engine_core, "step", own, hook, rank=2)
    assert sw.start_cycle()
    ticks: list[int] = []

    def tick() -> object:
        ticks.append(clock())
        yield

    assert sw.drive_inline(40 * MS, 10 * MS, 5 * MS, tick, lambda w: None)
    engine = engine_core()
    for _ in range(2_000):  # 2 s of 1 ms steps: 40 cycles, 80 swaps asked for
        clock.t += 1 * MS
        engine.step()
    assert sw.held == switch_mod.HELD_FOR_VERSIONS and sw.hooks_in and not sw.cycling
    # every set counted (the add's placing too), none past the one that reached the cap and the hold's own
    assert 20 <= CountedSets.sets == sw.class_changes[engine_core] <= 21
    sets, held_at, counted_before = CountedSets.sets, clock(), counted[0]
    for _ in range(3_000):  # 3 s more: the class is never changed again; every step counted, still ticking
        clock.t += 1 * MS
        assert engine.step() == "hooked step"
    assert CountedSets.sets == sets
    assert counted[0] - counted_before == 3_000
    assert len([t for t in ticks if t > held_at]) >= 50, ticks[-5:]  # a tick every 50 ms, held in


def test_setting_a_class_attribute_to_what_it_holds_is_skipped() -> None:
    """A set, even of the same value, changes the class's type version: where nothing changes, none."""
    CountedSets.sets = 0
    sched = CountedSets("Scheduler", (), {"schedule": lambda self: None})
    sw = Switch(Clock(1_000 * MS))
    sw.add(sched, "schedule", sched.__dict__["schedule"], lambda self: None)  # rank 0: never drives
    mod = types.SimpleNamespace(step=lambda: "own step")
    sw.add(mod, "step", mod.step, lambda: "hooked step", rank=2)  # re-places every site (a new driver)
    assert sw.start_cycle()
    for _ in range(3):  # each drive_inline and undrive re-places every site too
        assert sw.drive_inline(40 * MS, 10 * MS, 5 * MS, lambda: iter(()), lambda w: None)
        sw.undrive()
    assert CountedSets.sets == 1  # the add's own placing; the scheduler's hook never moved after it


def test_self_only_reads_the_code_not_a_signature_the_function_claims() -> None:
    """The hooks call fn(self) alone only where fn's own code takes nothing else, whatever it says of itself."""
    import functools

    from exporter.agent.switch import self_only

    def step(self: object) -> None: ...

    def step_pos(self: object, /) -> None: ...

    def with_arg(self: object, batch: object) -> None: ...

    def with_default(self: object, batch: object = None) -> None: ...

    def packed(*args: object, **kwargs: object) -> None: ...

    def keyword(self: object, *, batch: object = None) -> None: ...

    @functools.wraps(step)
    def wrapper(*args: object, **kwargs: object) -> None: ...  # inspect.signature would say (self)

    assert self_only(step) and self_only(step_pos)
    assert not any(self_only(f) for f in (with_arg, with_default, packed, keyword, wrapper))
    assert not self_only(len) and not self_only(
        object.__repr__
    )  # builtins: their frames are not ours to read
    assert not self_only(
        types.SimpleNamespace(__code__=step.__code__)
    )  # a code object alone is not a function
