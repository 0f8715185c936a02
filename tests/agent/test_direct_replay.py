"""torch's `CUDAGraph.replay` shim (`def replay(self): super().replay()`) skipped for exactly that class.

`hooks.base_call` recognises the shim by its code and finds the base's method; the replay hook and
the driver's check (`Switch.add(direct=...)`) then call the base's method for an instance of exactly
the class, one frame fewer than torch's own call, and torch's method for any other instance (whose
`super()` may lead elsewhere). The stand-ins mirror torch 2.11's classes: a C++ base whose replay is
a builtin reached through pybind's `instancemethod`, and a Python subclass with the shim.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from exporter.agent import hooks
from tests.agent.fake_torch import GRAPH_2_11, INSTANCEMETHOD
from tests.agent.fresh import run_fresh

_made: dict[str, Any] = {}
exec(INSTANCEMETHOD, _made)  # pybind's wrapper of a function, as the stand-in torch makes it
_new_instancemethod = _made["instancemethod"]


def test_the_shim_is_found_and_its_base_method_is_what_it_calls() -> None:
    class Base:
        def replay(self) -> str:
            return "base"

    class Graph(Base):
        def replay(self) -> None:
            """Replay the CUDA work captured by this graph."""
            super().replay()

    class NoDoc(Base):
        def replay(self) -> None:
            super().replay()

    for cls in (Graph, NoDoc):
        found = hooks.base_call(cls, "replay")
        assert found is not None and found.exact is cls and found.base is Base.replay, cls
        assert found.owner is Base and found.held is vars(Base)["replay"] and found.still()


def test_a_builtin_base_as_pybind_holds_it_is_called_with_the_instance() -> None:
    # pybind11 keeps a bound C++ method in the class as an instancemethod around a builtin
    Base = type("Base", (list,), {"replay": _new_instancemethod(list.clear)})

    class Graph(Base):  # type: ignore[misc, valid-type]
        def replay(self) -> None:
            super().replay()

    assert type(vars(Base)["replay"]).__name__ == "instancemethod"
    found = hooks.base_call(Graph, "replay")
    assert found is not None and found.exact is Graph and found.base is list.clear
    g = Graph([1, 2])
    found.base(g)
    assert g == []
    # a method descriptor kept as it is
    Plain = type("Plain", (list,), {"replay": list.clear})

    class Graph2(Plain):  # type: ignore[misc, valid-type]
        def replay(self) -> None:
            super().replay()

    found = hooks.base_call(Graph2, "replay")
    assert found is not None and found.exact is Graph2 and found.base is list.clear


def test_anything_but_the_shim_is_left_to_its_own_call() -> None:
    class Base:
        def replay(self) -> str:
            return "base"

        def reset(self) -> None:
            pass

    class Returns(Base):
        def replay(self) -> str:  # a torch whose replay returns, or does more, is not the shim
            return super().replay()

    class More(Base):
        def replay(self) -> None:
            super().replay()
            self.replayed = True

    class Other(Base):
        def replay(self) -> None:
            super().reset()

    class Defaults(Base):
        def replay(self, stream: object = None) -> None:
            super().replay()

    class Named(Base):
        def replay(this) -> None:
            super().replay()

    class Borrowed(Base):  # the shim of another class: its super() is that class's
        replay = Returns.replay

    class StaticBase:
        replay = staticmethod(lambda: "static")

    class OverStatic(StaticBase):
        def replay(self) -> None:
            super().replay()

    class Inherits(Base):  # defines no replay of its own
        pass

    class Graph(Base):
        def replay(self) -> None:
            super().replay()

    class Moved(Base):
        replay = Graph.replay  # the shim itself, but its __class__ cell is Graph

    for cls in (Returns, More, Other, Defaults, Named, Borrowed, OverStatic, Inherits, Moved):
        assert hooks.base_call(cls, "replay") is None, cls.__name__
    assert hooks.base_call(object(), "replay") is None  # not a class
    assert hooks.base_call(Graph, "replay") is not None


DIRECT = (
    r"""
import json, sys
from exporter.agent import hooks
from exporter.agent.switch import SWITCH
log = []
"""
    + INSTANCEMETHOD
    + r"""
class _CUDAGraph:                      # torch._C._CUDAGraph: its replay a C++ method behind pybind's wrapper
    pass
def _replay(self):
    log.append(("base", type(self).__name__))
_CUDAGraph.replay = instancemethod(_replay)
"""
    + GRAPH_2_11
    + r"""
class Mixin(_CUDAGraph):               # a class torch's super() reaches before the base, for a subclass
    def replay(self):
        log.append(("mixin", type(self).__name__))
        super().replay()

class Diamond(CUDAGraph, Mixin):
    pass

class Sub(CUDAGraph):
    pass

own = CUDAGraph.__dict__["replay"]
before = hooks.replay_direct()
assert hooks.patch_graph_class(CUDAGraph)
frames = []
def prof(frame, event, arg):
    if event == "call":
        frames.append(frame.f_code)

def replays(state):
    out = {}
    for g in (CUDAGraph(), Sub(), Diamond()):
        log.clear(); frames.clear()
        sys.setprofile(prof)
        r = g.replay()
        sys.setprofile(None)
        out[type(g).__name__] = {"log": [list(x) for x in log], "returned": r,
                                 "torch_frame": own.__code__ in frames, "frames": len(frames)}
    return out

got = {"in": replays("in")}                      # the hooks in, no cycle: the counted replay
assert SWITCH.start_cycle()
assert SWITCH.drive_inline(10**12, 10**12, 0, lambda: iter(()), lambda wake: None)
got["driver_in"] = replays("driver_in")         # the driver's check, hooks in (its first slice)
SWITCH.set_in(False)
got["driver_out"] = replays("driver_out")       # the driver's thin check, hooks out
got["counted"] = hooks.counts()[0]
got["exact"] = hooks.replays_exact()
# what the agent reports: the patched class's replay is the direct one (base_call, once patched, sees the hook)
got["replay_direct"] = [before, hooks.replay_direct(CUDAGraph), hooks.replay_direct(Sub), hooks.replay_direct()]
got["base_call_after"] = hooks.base_call(CUDAGraph, "replay") is not None
def patched(self):                               # someone patches the C++ base's replay afterwards
    log.append(("patched", type(self).__name__))
    _replay(self)
_CUDAGraph.replay = patched
SWITCH.set_in(True)                              # the next swap sees it
got["patched_in"] = replays("patched_in")
SWITCH.set_in(False)
got["patched_out"] = replays("patched_out")
print(json.dumps(got))
"""
)


def test_an_exact_graph_replays_through_its_base_a_frame_fewer_others_through_torchs_call(
    tmp_path: Path,
) -> None:
    out: dict[str, Any] = run_fresh(tmp_path, DIRECT, fakes=())
    assert out["replay_direct"] == [False, True, False, True] and out["base_call_after"] is False, out
    for state in ("in", "driver_in", "driver_out"):
        got = out[state]
        # exactly the class: the base's replay once, torch's shim never entered, None returned as it does
        assert got["CUDAGraph"]["log"] == [["base", "CUDAGraph"]], (state, got)
        assert not got["CUDAGraph"]["torch_frame"] and got["CUDAGraph"]["returned"] is None, (state, got)
        # a subclass goes through torch's own call: the same base, its frame entered
        assert got["Sub"]["log"] == [["base", "Sub"]] and got["Sub"]["torch_frame"], (state, got)
        # where super() leads elsewhere for a subclass, it still does
        assert got["Diamond"]["log"] == [["mixin", "Diamond"], ["base", "Diamond"]], (state, got)
        assert got["CUDAGraph"]["frames"] == got["Sub"]["frames"] - 1, (state, got)
    # every replay counted, hooks in or out: the hook takes the shim's place, so it stays in (exact)
    assert out["counted"] == 9 and out["exact"] is True, out
    # the base's replay patched while out: torch's own call again from the next swap on, in and out
    for state in ("patched_in", "patched_out"):
        got = out[state]
        assert got["CUDAGraph"]["log"] == [["patched", "CUDAGraph"], ["base", "CUDAGraph"]], (state, got)
        assert got["CUDAGraph"]["torch_frame"], (state, got)


HELD = r"""
import json
from exporter.agent import hooks
from exporter.agent.light import LightAgent
from exporter.agent.settings import Settings
from exporter.agent.switch import SWITCH
from tests.agent.fresh import ListSender
log = []
class _CUDAGraph:
    def replay(self):
        log.append("base")
class CUDAGraph(_CUDAGraph):
    def replay(self) -> None:
        super().replay()
    def capture_begin(self, *a, **k):
        pass
    def capture_end(self):
        pass
assert hooks.patch_graph_class(CUDAGraph)
SWITCH.hold("held in, as SGLang's hooks are")    # no swap from here on
agent = LightAgent(Settings(socket=""), sender=ListSender())
g = CUDAGraph()
g.replay()
before = list(log)
def patched(self):
    log.append("patched")
_CUDAGraph.replay = patched
log.clear(); g.replay(); unseen = list(log)     # no swap, no tick yet: the base taken is still called
for _ in agent.phases(force=True):              # the agent's tick looks
    pass
log.clear(); g.replay()
print(json.dumps({"before": before, "unseen": unseen, "after": list(log)}))
"""


def test_with_the_hooks_held_in_the_agents_tick_sees_a_patched_base(tmp_path: Path) -> None:
    out = run_fresh(tmp_path, HELD, fakes=())
    assert out == {"before": ["base"], "unseen": ["base"], "after": ["patched"]}, out


def test_a_class_that_breaks_the_look_gets_none_never_an_error() -> None:
    class Meta(type):
        def __getattribute__(cls, name: str) -> Any:
            if name == "__mro__":
                raise RuntimeError("no MRO today")
            return super().__getattribute__(name)

    class Base:
        def replay(self) -> None:
            pass

    class Graph(Base, metaclass=Meta):
        def replay(self) -> None:
            super().replay()

    assert hooks.base_call(Graph, "replay") is None
