"""The agent -> sidecar wire format: round trips, validation, interval packing, shared bucket layouts."""

import ast
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from exporter import wire
from exporter.analysis import intervals


def window(**kw: object) -> wire.Window:
    base: dict[str, object] = dict(
        dev=0,
        t0=1_000_000_000_000,
        t1=1_000_500_000_000,
        busy=135_000_000,
        graph_busy=90_000_000,
        kernels=410,
        memcpys=3,
        graphs=22,
        gaps=(0, 4, 8, 6, 0, 1, 0, 0, 0, 0, 0),
        gap_sum=170_000_000,
        iv=(0, 20, 1500, 300),
    )
    base.update(kw)
    return wire.Window(**base)  # type: ignore[arg-type]


def test_message_round_trips_through_one_datagram() -> None:
    msg = wire.Message(
        pid=4242,
        state="running",
        seq=7,
        role="vllm_worker",
        lib="libcupti 13.0 (130001); cupti-python 13.0.1",
        mode="raw+graph_trace",
        devices=((0, "GPU-6f5e2c1a-0b7d-4c39-9d0e-2f1a3b4c5d6e"),),
        windows=(window(),),
        steps=(
            wire.Steps(
                "vllm",
                n=7,
                wall=504_000_000,
                gpu=133_000_000,
                tokens=1120,
                seqs=1120,
                hist=(0,) * 5 + (7,) + (0,) * 6,
            ),
        ),
    )
    data = wire.encode(msg)
    assert len(data) < wire.MAX_DATAGRAM_BYTES
    assert wire.decode(data) == msg
    assert wire.decode(data).uuid_of(0).startswith("GPU-6f5e")


def test_decode_rejects_unknown_version() -> None:
    data = json.dumps({"v": 2, "pid": 1, "state": "running"}).encode()
    with pytest.raises(wire.WireError, match="version"):
        wire.decode(data)


@pytest.mark.parametrize(
    "body, why",
    [
        (b"\xff\xfe not json", "JSON"),
        (b"[1, 2]", "object"),
        (json.dumps({"v": 1, "pid": 1, "state": "exploded"}).encode(), "state"),
        (json.dumps({"v": 1, "pid": -3, "state": "running"}).encode(), "negative"),
        (
            json.dumps(
                {"v": 1, "pid": 1, "state": "running", "windows": [{"dev": 0, "t0": 10, "t1": 5, "busy": 0}]}
            ).encode(),
            "ends before",
        ),
        (
            json.dumps(
                {"v": 1, "pid": 1, "state": "running", "windows": [{"dev": 0, "t0": 0, "t1": 10, "busy": 11}]}
            ).encode(),
            "exceeds",
        ),
        (
            json.dumps(
                {
                    "v": 1,
                    "pid": 1,
                    "state": "running",
                    "windows": [{"dev": 0, "t0": 0, "t1": 10, "busy": 1, "gaps": [1, 2]}],
                }
            ).encode(),
            "entries",
        ),
        (json.dumps({"v": 1, "pid": True, "state": "running"}).encode(), "integer"),
    ],
)
def test_decode_says_what_is_wrong(body: bytes, why: str) -> None:
    with pytest.raises(wire.WireError, match=why):
        wire.decode(body)


def test_a_decoded_message_is_the_one_its_constructor_builds_and_stays_frozen() -> None:
    w = window(slack=7, dropped=1, memsets=2)
    msg = wire.Message(
        pid=9,
        state="running",
        devices=((0, "GPU-a"),),
        windows=(w, window(t0=1_000_500_000_000, t1=1_001_000_000_000)),
    )
    got = wire.decode(wire.encode(msg))
    assert got == msg and repr(got) == repr(msg) and hash(got.windows[0]) == hash(w)
    assert list(vars(got.windows[0])) == list(vars(w)) and list(vars(got)) == list(vars(msg))
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.windows[0].busy = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.pid = 1  # type: ignore[misc]


def _one_window(**keys: object) -> bytes:
    d = {"dev": 0, "t0": 0, "t1": 10_000_000, "busy": 1, **keys}
    return json.dumps({"v": 1, "pid": 1, "state": "running", "windows": [d]}).encode()


@pytest.mark.parametrize(
    "keys, why",
    [
        ({"kernels": True}, "kernels is not an integer"),
        ({"dev": 256}, "dev is over 255"),
        ({"slack": -1}, "slack is negative"),
        ({"gap_sum": 2**62 + 1}, "gap_sum is over"),
        ({"t1": None}, "missing t1"),
        ({"busy": 1.0}, "busy is not an integer"),
        ({"iv": [0, 2**62 + 1]}, "iv holds a negative or too large value"),
        ({"iv": [2**62, 2**62]}, "iv reaches past"),
        ({"iv": [0, -1]}, "iv holds a negative"),
        ({"iv": [0, True]}, "iv is not a list of integers"),
        ({"gaps": [0] * 11, "memcpys": "3"}, "memcpys is not an integer"),
    ],
)
def test_each_window_key_is_refused_with_its_own_reason(keys: dict[str, object], why: str) -> None:
    with pytest.raises(wire.WireError, match=why):
        wire.decode(_one_window(**keys))


def test_encode_refuses_a_message_over_16_kib() -> None:
    big = window(iv=tuple(range(1, 8001)))
    with pytest.raises(wire.WireError, match="over"):
        wire.encode(wire.Message(pid=1, state="running", windows=(big,)))


def test_pack_intervals_round_trips_to_the_microsecond() -> None:
    t0 = 5_000_000_000
    ivs = [
        (t0 + 2_000, t0 + 1_502_000),
        (t0 + 3_000_000, t0 + 3_000_700),
        (t0 + 400_000_000, t0 + 500_000_000),
    ]
    packed, slack = wire.pack_intervals(ivs, t0)
    assert slack == 0
    assert packed == (2, 1500, 1498, 1, 396999, 100000)
    assert wire.unpack_intervals(packed, t0) == [
        (t0 + 2_000, t0 + 1_502_000),
        (t0 + 3_000_000, t0 + 3_001_000),
        (t0 + 400_000_000, t0 + 500_000_000),
    ]


def test_pack_intervals_fills_the_shortest_gaps_when_over_the_limit() -> None:
    t0 = 0
    # 4 kernels of 1 ms with gaps of 5 us, 2 ms and 10 us: two fills must take the 5 and 10 us gaps
    ivs = [(0, 1_000_000), (1_005_000, 2_005_000), (4_005_000, 5_005_000), (5_015_000, 6_015_000)]
    packed, slack = wire.pack_intervals(ivs, t0, limit=2)
    assert slack == 15_000
    assert wire.unpack_intervals(packed, t0) == [(0, 2_005_000), (4_005_000, 6_015_000)]


def test_packed_gaps_never_go_negative_when_ends_round_up() -> None:
    ivs = [(0, 1_500), (1_900, 3_000)]  # 400 ns apart: the first end rounds up past the next start
    packed, _ = wire.pack_intervals(ivs, 0)
    assert min(packed) >= 0
    assert wire.decode(
        wire.encode(
            wire.Message(
                pid=1,
                state="running",
                windows=(window(t0=0, t1=10_000, busy=2_600, graph_busy=0, gaps=(), gap_sum=0, iv=packed),),
            )
        )
    )


def test_bucket_layouts_are_defined_in_the_wire_only() -> None:
    root = Path(wire.__file__).parent
    defined = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for t in targets:
                if isinstance(t, ast.Name) and t.id.endswith("_BUCKETS_SECONDS"):
                    defined.add((path.relative_to(root).as_posix(), t.id))
    assert defined == {("wire.py", "IDLE_GAP_BUCKETS_SECONDS"), ("wire.py", "STEP_BUCKETS_SECONDS")}
    assert len(intervals.IDLE_GAP_BUCKETS_NS) + 1 == wire.IDLE_GAP_BUCKET_COUNT


def test_agent_socket_default_is_shared_with_the_sidecar_config() -> None:
    from exporter import config

    assert config.AgentFeedConfig().socket == wire.default_agent_socket()


# --- light-agent keys -------------------------------------------------------------------------

LIGHT_STEPS = wire.Steps(
    engine="vllm",
    n=12,
    wall=600_000_000,
    tokens=96,
    seqs=96,
    hist=(12,) + (0,) * 11,
    t0=1,
    t1=600_000_001,
    graph=11,
    eager=1,
    run_ns=4_800_000_000,
    wait_ns=1_200_000_000,
    running=8,
    waiting=0,
    max_seqs=256,
    dp=1,
    owner=4141,
)


def test_light_steps_and_graph_counts_round_trip() -> None:
    g = wire.GraphCounts(t0=10, t1=500_000_010, replays=1600, captures=67, dev=2, uuid="GPU-x")
    msg = wire.Message(pid=4242, state="running", mode="light", steps=(LIGHT_STEPS,), graphs=g)
    back = wire.decode(wire.encode(msg))
    assert back.steps == (LIGHT_STEPS,) and back.graphs == g and back.mode == "light"


def test_an_older_agents_datagram_decodes_to_the_light_defaults() -> None:
    old = b'{"v":1,"pid":7,"seq":1,"state":"running","role":"vllm_engine","mode":"steps",' \
          b'"steps":[{"engine":"vllm","n":3,"wall":9,"gpu":0,"tokens":6,"seqs":6,"measured":0,' \
          b'"hist":[],"t0":1,"t1":10}]}'  # fmt: skip
    msg = wire.decode(old)
    (s,) = msg.steps
    assert (s.graph, s.eager, s.run_ns, s.running, s.waiting, s.max_seqs, s.dp, s.owner) == (
        0,
        0,
        0,
        -1,
        -1,
        0,
        -1,
        0,
    )
    assert msg.graphs is None


def test_defaults_are_left_off_the_wire_so_old_sidecars_see_the_old_shape() -> None:
    plain = wire.Steps(engine="vllm", n=1, wall=5)
    body = json.loads(wire.encode(wire.Message(pid=1, state="running", steps=(plain,))))
    assert set(body["steps"][0]) == {
        "engine",
        "n",
        "wall",
        "gpu",
        "tokens",
        "seqs",
        "measured",
        "hist",
        "t0",
        "t1",
    }
    assert "graphs" not in body


def _old_decode(commit: str, data: bytes) -> Any:
    """Decode `data` with exporter/wire.py as it was at `commit` (git history; skip without it)."""
    import importlib.util
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    r = subprocess.run(
        ["git", "-C", str(root), "show", f"{commit}:exporter/wire.py"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if r.returncode != 0:
        pytest.skip("git history unavailable")
    spec = importlib.util.spec_from_loader("old_wire", loader=None)
    assert spec is not None
    old = importlib.util.module_from_spec(spec)
    sys.modules["old_wire"] = old
    try:
        exec(compile(r.stdout, "old_wire.py", "exec"), old.__dict__)
        back = old.decode(data)
        assert type(back).__name__ == "Message"
        return back
    finally:
        del sys.modules["old_wire"]


def test_the_previous_decoder_reads_a_light_message() -> None:
    """Load wire.py as it was before the light keys (git history) and decode a new datagram with it."""
    g = wire.GraphCounts(t0=1, t1=2, replays=3, captures=4, dev=0)
    data = wire.encode(wire.Message(pid=9, state="running", mode="light", steps=(LIGHT_STEPS,), graphs=g))
    back = _old_decode("5f6513a", data)
    (s,) = back.steps
    assert (back.pid, s.n, s.tokens, s.wall) == (9, 12, 96, 600_000_000)


@pytest.mark.parametrize(
    "patch",
    [
        {"graph": -1},
        {"running": "8"},
        {"run_ns": 1.5},
        {"dp": True},
    ],
)
def test_bad_light_step_keys_are_refused(patch: dict) -> None:  # type: ignore[type-arg]
    body = json.loads(wire.encode(wire.Message(pid=1, state="running", steps=(LIGHT_STEPS,))))
    body["steps"][0].update(patch)
    with pytest.raises(wire.WireError):
        wire.decode(json.dumps(body).encode())


@pytest.mark.parametrize(
    "graphs", [[1, 2], {"t0": 5, "t1": 4}, {"t0": 1, "t1": 2, "replays": -3}, {"uuid": 7}]
)
def test_bad_graph_counts_are_refused(graphs: object) -> None:
    body = {"v": 1, "pid": 1, "state": "running", "graphs": graphs}
    with pytest.raises(wire.WireError):
        wire.decode(json.dumps(body).encode())


def test_the_stale_steps_a_light_agent_dropped_round_trip_beside_its_unsent_messages() -> None:
    msg = wire.Message(
        pid=4242, state="running", mode="light", steps=(LIGHT_STEPS,), sent_dropped=3, steps_stale=2
    )
    data = wire.encode(msg)
    assert json.loads(data)["steps_stale"] == 2
    back = wire.decode(data)
    assert back == msg and (back.sent_dropped, back.steps_stale) == (3, 2)
    assert list(vars(back)) == list(vars(msg))
    # none dropped: the key is left off the wire, and an agent from before it decodes as none dropped
    assert "steps_stale" not in json.loads(wire.encode(wire.Message(pid=1, state="running")))
    old = b'{"v":1,"pid":7,"seq":1,"state":"running","role":"generic","mode":"light","sent_dropped":3}'
    assert (wire.decode(old).sent_dropped, wire.decode(old).steps_stale) == (3, 0)


@pytest.mark.parametrize("key", ["sent_dropped", "steps_stale"])
@pytest.mark.parametrize(
    "value, why",
    [
        (-1, "{key} is negative"),
        (1.5, "{key} is not an integer"),
        (True, "{key} is not an integer"),
        ("3", "{key} is not an integer"),
        ([3], "{key} is not an integer"),
        (None, "missing {key}"),
        (wire.MAX_INT + 1, "{key} is over"),
        (10**30, "{key} is over"),
    ],
)
def test_a_bad_count_of_what_an_agent_dropped_refuses_the_message_with_its_reason(
    key: str, value: object, why: str
) -> None:
    body = {"v": 1, "pid": 7, "state": "running", "mode": "light", key: value}
    with pytest.raises(wire.WireError, match=why.format(key=key)):
        wire.decode(json.dumps(body).encode())


def test_the_previous_decoder_reads_a_message_with_stale_steps() -> None:
    """Load wire.py as it was before steps_stale (git history): a new agent's datagram decodes, the key ignored."""
    msg = wire.Message(
        pid=9, state="running", mode="light", steps=(LIGHT_STEPS,), sent_dropped=4, steps_stale=2
    )
    back = _old_decode("2dc9391", wire.encode(msg))
    assert not hasattr(back, "steps_stale")
    (s,) = back.steps
    assert (back.pid, back.sent_dropped, s.n, s.tokens) == (9, 4, 12, 96)
