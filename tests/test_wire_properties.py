"""Property tests: any datagram decodes to a Message or WireError; no accepted sequence bends a counter."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter import wire
from exporter.analysis.pipeline import advance
from exporter.config import AgentFeedConfig, Config
from exporter.snapshot import Snapshot
from exporter.snapshot.totals import HistogramValue
from exporter.sources import agent_feed
from exporter.sources.agent_feed import AgentFeed
from tests.fakes.clock import Clock

MS = 1_000_000
WALL = 1_796_000_000_000_000_000  # the feed's receive clock in these tests (Dec 2026), ns

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=40,
)


def decodes_or_wire_error(data: bytes) -> None:
    try:
        msg = wire.decode(data)
    except wire.WireError:
        return
    assert isinstance(msg, wire.Message)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=wire.MAX_DATAGRAM_BYTES + 64))
def test_any_bytes_decode_to_a_message_or_a_wire_error(data: bytes) -> None:
    decodes_or_wire_error(data)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 20_000), st.sampled_from(["[", '{"a":', '[{"x":']))
def test_deep_nesting_is_a_wire_error(depth: int, opener: str) -> None:
    with pytest.raises(wire.WireError):
        wire.decode((opener * depth).encode())


VALID = {
    "v": 1,
    "pid": 7,
    "state": "running",
    "devices": [{"dev": 0, "uuid": "GPU-x"}],
    "windows": [{"dev": 0, "t0": WALL, "t1": WALL + 500 * MS, "busy": 100 * MS, "iv": [0, 100_000]}],
    "steps": [
        {
            "engine": "vllm",
            "n": 2,
            "wall": 40 * MS,
            "hist": [0, 0, 2] + [0] * 9,
            "t0": WALL,
            "t1": WALL + 50 * MS,
            "graph": 2,
            "running": 3,
        }
    ],
    "graphs": {"t0": WALL, "t1": WALL + 500 * MS, "replays": 25, "captures": 3, "dev": 0, "uuid": "GPU-x"},
}


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(["", "windows.0", "steps.0", "devices.0"]),
    st.text(max_size=12)
    | st.sampled_from(["v", "pid", "state", "dev", "t0", "t1", "busy", "iv", "n", "hist", "gaps"]),
    json_values,
)
def test_a_valid_message_with_any_field_replaced_decodes_or_fails_cleanly(
    where: str, key: str, value: object
) -> None:
    body = json.loads(json.dumps(VALID))
    target = body
    for part in filter(None, where.split(".")):
        target = target[part] if isinstance(target, dict) else target[int(part)]
    target[key] = value
    decodes_or_wire_error(json.dumps(body, allow_nan=True).encode())


# --- increments ------------------------------------------------------------------------------

big = st.integers(0, 2**63)
windows = st.builds(
    lambda dev, off_ms, span_ms, busy, kernels, gaps, gap_sum: {
        "dev": dev,
        "t0": WALL + off_ms * MS,
        "t1": WALL + (off_ms + span_ms) * MS,
        "busy": busy,
        "kernels": kernels,
        "gaps": gaps,
        "gap_sum": gap_sum,
    },
    st.integers(0, 3),
    st.integers(-700_000, 10_000),
    st.sampled_from([1, 500, 500, 500, 60_000]),
    st.one_of(st.integers(0, 500 * MS), big),
    st.one_of(st.integers(0, 10_000), big),
    st.one_of(st.just([]), st.lists(st.integers(0, 1000), min_size=11, max_size=11)),
    st.one_of(st.integers(0, 10**9), big),
)
steps = st.builds(
    lambda engine, n, wall_ns, off_ms, span_ms: {
        "engine": engine,
        "n": n,
        "wall": wall_ns,
        "t0": WALL + off_ms * MS if off_ms is not None else 0,
        "t1": WALL + (off_ms + span_ms) * MS if off_ms is not None else 0,
    },
    st.sampled_from(["vllm", "sglang", "x"]),
    st.integers(0, 2_000_000),
    st.one_of(st.integers(0, 10**10), big),
    st.one_of(st.none(), st.integers(-700_000, 10_000)),
    st.integers(0, 2_000),
)
messages = st.builds(
    lambda pid, uuid, ws, ss, state: json.dumps(
        {
            "v": 1,
            "pid": pid,
            "state": state,
            "devices": [{"dev": 0, "uuid": uuid}],
            "windows": ws,
            "steps": ss,
        }
    ).encode(),
    st.integers(1, 4),
    st.sampled_from(["GPU-a", "GPU-b", ""]),
    st.lists(windows, max_size=3),
    st.lists(steps, max_size=2),
    st.sampled_from(["running", "running", "preempted", "stopped"]),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(messages, max_size=6), min_size=1, max_size=8))
def test_no_message_sequence_makes_a_counter_decrease_or_nan(ticks: list[list[bytes]]) -> None:
    clock = Clock(100.0, wall_ns=WALL)
    feed = AgentFeed(AgentFeedConfig(socket="/nonexistent/agent.sock"), clock=clock, wall_ns=clock.wall_ns)
    cfg = Config()
    history: list[Snapshot] = []
    elapsed_ns = 0
    for seq, tick in enumerate(ticks, 1):
        for data in tick:
            feed.receive(data)
        clock.t += 0.5
        elapsed_ns += 500 * MS
        raw = Snapshot(
            seq=seq,
            at=1.0 * seq,
            mono=clock.t,
            interval=0.5,
            dt=0.5 if history else 0.0,
            agent=feed.collect(),
        )
        snap = advance(tuple(history), raw, cfg)
        prev = dict(history[-1].totals.series()) if history else {}
        for key, value in snap.totals.series():
            if isinstance(value, HistogramValue):
                assert all(math.isfinite(c) and c >= 0 for c in value.counts) and math.isfinite(
                    value.total
                ), key
                continue
            assert math.isfinite(value) and value >= 0, key
            assert value >= prev.get(key, 0.0), key  # type: ignore[operator]
        for gpu_source, value in snap.totals.busy.busy_seconds.items():
            if gpu_source.source == "cupti":
                assert value <= snap.totals.busy.observed_seconds[gpu_source] + 1e-9
        for value in snap.totals.engine.steps.values():  # 4 agents, each no faster than a step per 10 us
            budget = agent_feed.STEP_BURST_NS + agent_feed.MAX_PAST_NS + agent_feed.MAX_FUTURE_NS
            assert value <= 4 * (budget + elapsed_ns) / agent_feed.MIN_STEP_NS + 4
        history.append(snap)


def _reference_unpack(iv: tuple[int, ...], t0: int) -> list[tuple[int, int]]:
    """The loop unpack_intervals replaced: the oracle."""
    out, cursor = [], 0
    for i in range(0, len(iv) - 1, 2):
        start = cursor + iv[i]
        end = start + iv[i + 1]
        out.append((t0 + start * 1000, t0 + end * 1000))
        cursor = end
    return out


@given(
    iv=st.lists(st.integers(min_value=0, max_value=2**40), max_size=41).map(tuple), t0=st.integers(0, 2**62)
)
def test_unpacked_intervals_and_their_end_are_those_of_the_plain_loop(iv: tuple[int, ...], t0: int) -> None:
    want = _reference_unpack(iv, t0)
    assert wire.unpack_intervals(iv, t0) == want
    assert wire.intervals_end(iv, t0) == (want[-1][1] if want else None)


def reference_body(msg: wire.Message) -> dict:  # type: ignore[type-arg]
    """The message as the dict-building encoder wrote it (before the %-format one): keys, order, values."""
    body: dict = {"v": msg.v, "pid": msg.pid, "seq": msg.seq, "state": msg.state, "role": msg.role}  # type: ignore[type-arg]
    for key in ("detail", "lib", "mode"):
        if getattr(msg, key):
            body[key] = getattr(msg, key)
    if msg.devices:
        body["devices"] = [{"dev": d, "uuid": u} for d, u in msg.devices]
    if msg.windows:
        body["windows"] = [wire._window_dict(w) for w in msg.windows]
    if msg.steps:
        body["steps"] = [
            {
                "engine": s.engine,
                "n": s.n,
                "wall": s.wall,
                "gpu": s.gpu,
                "tokens": s.tokens,
                "seqs": s.seqs,
                "measured": s.measured,
                "hist": list(s.hist),
                "t0": s.t0,
                "t1": s.t1,
                **{k: getattr(s, k) for k, d in wire._STEPS_LIGHT_DEFAULTS.items() if getattr(s, k) != d},
            }
            for s in msg.steps
        ]
    if msg.sent_dropped:
        body["sent_dropped"] = msg.sent_dropped
    if msg.steps_stale:
        body["steps_stale"] = msg.steps_stale
    if msg.settings_rejected:
        body["settings_rejected"] = msg.settings_rejected
    if msg.silent_ms:
        body["silent_ms"] = msg.silent_ms
    if msg.graphs is not None:
        g = msg.graphs
        body["graphs"] = {"t0": g.t0, "t1": g.t1, "replays": g.replays, "captures": g.captures}
        if g.dev >= 0:
            body["graphs"]["dev"] = g.dev
        if g.uuid:
            body["graphs"]["uuid"] = g.uuid
    return body


small = st.integers(0, 2**40)
texts = st.text(max_size=12)  # quotes, backslashes, control and non-ASCII characters included
steps_st = st.builds(
    wire.Steps,
    engine=texts, n=small, wall=small, gpu=small, tokens=small, seqs=small, measured=st.integers(0, 1),
    hist=st.lists(small, max_size=wire.STEP_BUCKET_COUNT).map(tuple), t0=small, t1=small,
    graph=st.sampled_from([0, 3]), eager=st.sampled_from([0, 1]), run_ns=st.sampled_from([0, 10**12]),
    wait_ns=st.just(0), running=st.sampled_from([-1, 0, 8]), waiting=st.sampled_from([-1, 2]),
    max_seqs=st.sampled_from([0, 256]), dp=st.sampled_from([-1, 1]), owner=st.sampled_from([0, 4141]),
)  # fmt: skip
messages = st.builds(
    wire.Message,
    pid=small, state=st.sampled_from(wire.STATES), seq=small, role=st.sampled_from(wire.ROLES), detail=texts,
    lib=texts, mode=texts, devices=st.lists(st.tuples(st.integers(0, 9), texts), max_size=2).map(tuple),
    steps=st.lists(steps_st, max_size=3).map(tuple), sent_dropped=small, steps_stale=small,
    settings_rejected=st.integers(0, 9),
    silent_ms=st.integers(0, wire.MAX_SILENT_MS),
    graphs=st.none() | st.builds(wire.GraphCounts, t0=small, t1=small, replays=small, captures=small,
                                 dev=st.integers(-1, 3), uuid=texts),
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(messages)
def test_the_encoder_writes_what_the_dict_encoder_wrote(msg: wire.Message) -> None:
    data = wire.encode(msg)
    assert json.loads(data) == reference_body(msg)
    assert list(json.loads(data)) == list(reference_body(msg))  # the keys in the same order


def test_a_message_that_cannot_encode_is_a_wire_error_not_a_crash() -> None:
    import pytest

    for bad in (wire.Steps(engine="vllm", n=1, wall=math.nan), wire.Steps(engine="vllm", n=None, wall=1)):  # type: ignore[arg-type]
        with pytest.raises(wire.WireError):
            wire.encode(wire.Message(pid=1, state="running", steps=(bad,)))


# --- the plain path against the checked one -----------------------------------------------------

EDGE_VALUES: list[object] = [
    None,
    0,
    1,
    -1,
    1.0,
    255,
    256,
    2**31,
    2**31 + 1,
    64,
    65,
    wire.MAX_INT,
    wire.MAX_INT + 1,
    "",
    "running",
    "vllm_worker",
    "other",
    "x" * 40,
    "y" * 300,
    "bad\x00text",
    [],
    [0] * wire.IDLE_GAP_BUCKET_COUNT,
    [1] * wire.IDLE_GAP_BUCKET_COUNT,
    [0, 1],
    [0, 1, 2],
    [0, -1],
    [0, 1.5],
    [0, None],
    [0, "1"],
    [0, [1]],
    [wire.MAX_INT, wire.MAX_INT],
    [0, 10**12],
    {},
    {"dev": 0},
    True,
    [0, True],
]
EDGES = st.sampled_from(EDGE_VALUES)
PLACES = ["", "windows.0", "steps.0", "devices.0", "graphs"]
KEYS = [
    "v",
    "pid",
    "seq",
    "state",
    "role",
    "detail",
    "lib",
    "mode",
    "devices",
    "windows",
    "steps",
    "sent_dropped",
    "steps_stale",
    "settings_rejected",
    "silent_ms",
    "graphs",
    "dev",
    "uuid",
    "t0",
    "t1",
    "busy",
    "graph_busy",
    "kernels",
    "dropped",
    "gaps",
    "gap_sum",
    "iv",
    "slack",
    "n",
    "hist",
    # a steps object's other keys (the light agent's among them)
    "engine",
    "wall",
    "gpu",
    "tokens",
    "seqs",
    "measured",
    "graph",
    "eager",
    "run_ns",
    "wait_ns",
    "running",
    "waiting",
    "max_seqs",
    "dp",
    "owner",
    # graph counts' own
    "replays",
    "captures",
]


def outcome(data: bytes) -> str:
    """Return what decoding gives: the message's repr, or the error's text."""
    try:
        return repr(wire.decode(data))
    except wire.WireError as exc:
        return f"WireError: {exc}"


def checked_outcome(data: bytes) -> str:
    """Return what decoding gives through the key-by-key checks alone (the plain path left out)."""
    plain = wire._message_plain
    wire._message_plain = lambda body: None  # type: ignore[assignment]
    try:
        return outcome(data)
    finally:
        wire._message_plain = plain


@settings(max_examples=600, deadline=None)
@given(st.sampled_from(PLACES), st.sampled_from(KEYS), EDGES | json_values, st.booleans())
def test_the_plain_path_decodes_as_the_checked_path(where: str, key: str, value: object, drop: bool) -> None:
    data = changed(where, key, value, drop)
    assert outcome(data) == checked_outcome(data)


def test_every_edge_value_at_every_key_decodes_as_the_checked_path() -> None:
    for where in PLACES:
        for key in KEYS:
            for value in [*EDGE_VALUES, "drop"]:
                data = changed(where, key, value, value == "drop")
                assert outcome(data) == checked_outcome(data), (where, key, value)


def changed(where: str, key: str, value: object, drop: bool) -> bytes:
    """Return the VALID message as the agent encodes it, with one key set to a value, or removed."""
    body = json.loads(json.dumps(VALID))
    target = body
    for part in filter(None, where.split(".")):
        target = target[part] if isinstance(target, dict) else target[int(part)]
    if drop:
        target.pop(key, None)
    else:
        target[key] = value
    return json.dumps(body, allow_nan=True, separators=(",", ":")).encode()


def test_the_plain_path_takes_the_agents_datagram() -> None:
    msg = wire.Message(
        pid=7,
        state="running",
        seq=3,
        role="vllm_worker",
        devices=((0, "GPU-x"),),
        windows=(wire.Window(dev=0, t0=WALL, t1=WALL + 500 * MS, busy=100 * MS, kernels=9, iv=(0, 100_000)),),
    )
    body = json.loads(wire.encode(msg))
    got = wire._message_plain(body)
    assert got == msg and repr(got) == repr(msg)
    assert list(vars(got)) == list(vars(msg)) and list(vars(got.windows[0])) == list(vars(msg.windows[0]))


def test_the_plain_path_takes_the_light_agents_datagrams() -> None:
    """An engine core's steps and a worker's step modes and replays, as the light agent sends them each tick."""
    hist = (0, 0, 25) + (0,) * (wire.STEP_BUCKET_COUNT - 3)
    core = wire.Steps(
        engine="vllm",
        n=25,
        wall=500 * MS,
        tokens=200,
        seqs=200,
        hist=hist,
        t0=WALL,
        t1=WALL + 500 * MS,
        run_ns=4 * 10**9,
        wait_ns=11 * 10**9,
        running=8,
        waiting=22,
        max_seqs=256,
        dp=0,
    )
    modes = wire.Steps(engine="vllm", n=0, wall=0, graph=25, owner=1234)
    graphs = wire.GraphCounts(t0=WALL, t1=WALL + 500 * MS, replays=25, captures=67, dev=0, uuid="GPU-x")
    for msg in (
        wire.Message(
            pid=1234, state="running", seq=9, role="vllm_engine", mode="light", steps=(core,), silent_ms=1250
        ),
        wire.Message(
            pid=1240,
            state="running",
            seq=9,
            role="vllm_worker",
            mode="light",
            devices=((0, "GPU-x"),),
            steps=(modes,),
            graphs=graphs,
            silent_ms=1250,
        ),
    ):
        body = json.loads(wire.encode(msg))
        (steps,) = body["steps"]
        assert wire._steps_plain(steps) == msg.steps[0]  # the steps too take the plain path
        got = wire._message_plain(body)
        assert got == msg and repr(got) == repr(msg)
        assert got is not None and list(vars(got.steps[0])) == list(vars(msg.steps[0]))


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, wire.MAX_INT),
    st.integers(0, wire.MAX_INT),
    st.integers(0, wire.MAX_SETTINGS_REJECTED),
    st.integers(0, wire.MAX_SILENT_MS),
)
def test_what_an_agent_says_of_itself_round_trips_through_both_paths(
    sent_dropped: int, steps_stale: int, settings_rejected: int, silent_ms: int
) -> None:
    msg = wire.Message(
        pid=4242,
        state="running",
        role="vllm_engine",
        mode="light",
        sent_dropped=sent_dropped,
        steps_stale=steps_stale,
        settings_rejected=settings_rejected,
        silent_ms=silent_ms,
    )
    data = wire.encode(msg)
    assert wire.decode(data) == msg
    assert wire._message_plain(json.loads(data)) == msg  # the plain path takes it
    assert outcome(data) == checked_outcome(data) == repr(msg)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(max_value=-1)
    | st.integers(min_value=wire.MAX_INT + 1)
    | st.floats(allow_nan=True)
    | st.booleans()
    | st.text(max_size=4)
    | st.lists(st.integers(0, 9), max_size=2)
    | st.none()
)
def test_a_bad_stale_steps_count_is_refused_as_a_bad_sent_dropped_is(value: object) -> None:
    body = {"v": 1, "pid": 7, "state": "running", "mode": "light"}
    stale = outcome(json.dumps({**body, "steps_stale": value}, allow_nan=True).encode())
    dropped = outcome(json.dumps({**body, "sent_dropped": value}, allow_nan=True).encode())
    assert stale.startswith("WireError: ") and stale == dropped.replace("sent_dropped", "steps_stale")
