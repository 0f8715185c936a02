"""The agent -> sidecar message format: one small versioned JSON object per unix datagram.

Stdlib only: the in-process agent imports this module and nothing else of the sidecar.
A message is one agent's report since its last one:

    {"v": 1, "pid": 4242, "role": "vllm_worker", "state": "running", "detail": "",
     "seq": 17, "lib": "libcupti 13.0 (130001), cupti-python 13.0.1", "mode": "full",
     "devices": [{"dev": 0, "uuid": "GPU-..."}],
     "windows": [{"dev": 0, "t0": ns, "t1": ns, "busy": ns, "graph_busy": ns,
                  "kernels": n, "memcpys": n, "memsets": n, "graphs": n, "dropped": n,
                  "gaps": [n per IDLE_GAP_BUCKETS + Inf], "gap_sum": ns,
                  "iv": [start_us, len_us, gap_us, len_us, ...], "slack": ns}],
     "steps": [{"engine": "vllm", "n": steps, "wall": ns, "gpu": ns, "tokens": n,
                "hist": [n per STEP_BUCKETS + Inf], "t0": ns, "t1": ns,
                "graph": n, "eager": n, "run_ns": n, "wait_ns": n, "running": n, "waiting": n,
                "max_seqs": n, "dp": n, "owner": pid}],
     "graphs": {"t0": ns, "t1": ns, "replays": n, "captures": n, "dev": n, "uuid": "GPU-..."},
     "sent_dropped": n, "steps_stale": n, "silent_ms": ms}

The light-agent keys of "steps" and "graphs", and the message's "steps_stale", are optional: an older
sidecar ignores them, and a message without them decodes to their defaults.

`iv` is the window's busy interval list in microseconds relative to t0, alternating
(offset, length, gap, length, ...), so the sidecar can union several processes sharing a GPU;
when the list would not fit, the shortest gaps are filled first and `slack` says how many ns
of idle time that filled (the sidecar bounds its union with it).
"""

from __future__ import annotations

import itertools
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

VERSION = 1
MAX_DATAGRAM_BYTES = 16 * 1024
MAX_SETTINGS_REJECTED = 64  # more settings than an agent has: a larger count is a bad message
MAX_SILENT_MS = 3_600_000  # an hour: a longer silence is no promise the sidecar can keep
STATES = ("running", "preempted", "unavailable", "stopped", "quiet")  # quiet: alive, nothing to report
ROLES = ("vllm_worker", "vllm_engine", "sglang_scheduler", "generic")
MAX_INTERVALS = 600  # busy intervals per window kept for cross-process unions (~8 KiB at worst)
# Histogram layouts, here only: the agent fills them, the sidecar adds them up, export renders them.
STEP_BUCKETS_SECONDS: tuple[float, ...] = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0)
# Idle gaps shorter than 1 ms are launch jitter; the seed's starving GPU shows up above it.
IDLE_GAP_BUCKETS_SECONDS: tuple[float, ...] = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
IDLE_GAP_BUCKET_COUNT = len(IDLE_GAP_BUCKETS_SECONDS) + 1
STEP_BUCKET_COUNT = len(STEP_BUCKETS_SECONDS) + 1
# Bounds of one message: no field may claim more than a real agent can report.
MAX_INT = 2**62  # every integer on the wire (ns timestamps until 2116)
MAX_ORDINAL = 255  # CUDA device ordinal
MAX_DEVICES = 64  # devices per message
MAX_WINDOWS = 64  # windows per message (agents send 2)
MAX_STEPS = 16  # engines per message
MAX_STEPS_PER_MESSAGE = 1_000_000
MAX_TOKENS_PER_STEP = 1 << 24
MAX_SEQS_PER_STEP = 1 << 20
MIN_RECORD_NS = 10  # at most one activity record per 10 ns of window (100 M/s)
IDLE_GAP_MIN_NS = 1_000_000  # the shortest idle gap the gap histogram counts (1 ms)

F = TypeVar("F")


class WireError(ValueError):
    """A datagram is not a valid agent message (bad JSON, version or field)."""


def agent_socket_choice(run_dir: str = "/run/boundwatch") -> tuple[str, str]:
    """Return the agent socket path and why it was chosen (the sidecar's and every agent's rule).

    1. `run_dir/agent.sock` when it exists and this user may send to it (the systemd unit's
       RuntimeDirectory; engine users join its group);
    2. `run_dir/agent.sock` when this user may create it, or `run_dir` itself (the sidecar; root);
    3. a private per-user directory (XDG_RUNTIME_DIR, else the temp dir), which only a sidecar
       running as the same user reaches.
    """
    run = Path(run_dir)  # os.path's tests: Path's raise PermissionError for a directory we may not enter
    sock = run / "agent.sock"
    uid = os.getuid()
    if os.path.exists(sock) and os.access(sock, os.W_OK):
        return str(sock), f"{sock} exists and this user (uid {uid}) may send to it"
    if os.path.isdir(run) and os.access(run, os.W_OK | os.X_OK):
        return str(sock), f"{run} is writable by this user (uid {uid}): the sidecar's place"
    if not os.path.lexists(run) and os.access(run.parent, os.W_OK | os.X_OK):
        return str(sock), f"{run} does not exist and this user (uid {uid}) may create it: the sidecar's place"
    if os.path.isdir(run) and not os.access(run, os.X_OK):
        why = f"uid {uid} may not enter {run} (join its group, as the sidecar's unit says)"
    elif os.path.exists(sock):
        why = f"{sock} exists but uid {uid} may not send to it (join its group)"
    elif os.path.isdir(run):
        why = f"{run} exists but holds no agent.sock (is the sidecar running?)"
    else:
        why = f"{run} does not exist (no sidecar installed as a service)"
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) if runtime and os.access(runtime, os.W_OK) else Path(tempfile.gettempdir())
    return str(base / f"boundwatch-{os.getuid()}" / "agent.sock"), why + "; using a private per-user path"


def default_agent_socket(run_dir: str = "/run/boundwatch") -> str:
    """Return the agent socket path: run_dir/agent.sock when usable, else a private per-user dir."""
    return agent_socket_choice(run_dir)[0]


@dataclass(frozen=True)
class Window:
    """One device's activity over one closed window, as measured by one agent."""

    dev: int  # CUDA device ordinal inside the agent's process
    t0: int  # window start, CLOCK_REALTIME ns (CUPTI's clock)
    t1: int  # window end, ns
    busy: int  # union of kernel, memcpy, memset and graph intervals, ns
    graph_busy: int = 0  # union of graph-launch spans, ns
    kernels: int = 0
    memcpys: int = 0
    memsets: int = 0
    graphs: int = 0
    dropped: int = 0
    gaps: tuple[int, ...] = ()  # idle gaps > 1 ms per bucket (non-cumulative, +Inf last)
    gap_sum: int = 0  # ns
    iv: tuple[int, ...] = ()  # busy intervals, us, (offset, len, gap, len, ...)
    slack: int = 0  # idle ns filled in iv to make it fit


@dataclass(frozen=True)
class Steps:
    """Engine steps one agent counted and timed since its last message."""

    engine: str
    n: int
    wall: int  # ns, sum of step wall times
    gpu: int = 0  # ns of GPU busy time inside the steps (0 when CUPTI is elsewhere)
    tokens: int = 0  # scheduled tokens over the steps
    seqs: int = 0  # scheduled sequences summed over the steps (batch size x steps)
    measured: int = 0  # 1 when this process's CUPTI saw the GPU work (gpu is meaningful), else 0
    hist: tuple[int, ...] = ()  # step wall times per STEP_BUCKETS (non-cumulative, +Inf last)
    t0: int = 0
    t1: int = 0
    # light-agent keys (absent in older agents' messages; older sidecars ignore them)
    graph: int = 0  # steps that ran in a CUDA graph (vLLM FULL/PIECEWISE, SGLang can_run_graph)
    eager: int = 0  # steps that ran without one
    run_ns: int = 0  # running requests x ns between steps (left rule): request-nanoseconds
    wait_ns: int = 0  # waiting requests likewise
    running: int = -1  # the scheduler's running requests after the newest step (-1: not read)
    waiting: int = -1
    max_seqs: int = 0  # the engine's batch limit (0: unknown)
    dp: int = -1  # data-parallel rank (-1: none)
    owner: int = 0  # pid of the engine core these steps belong to (0: the message's own pid)


@dataclass(frozen=True)
class GraphCounts:
    """torch.cuda.CUDAGraph use one process saw through the light hooks, over [t0, t1]."""

    t0: int  # CLOCK_REALTIME ns
    t1: int
    replays: int = 0  # replay() calls in the window
    captures: int = 0  # captures completed in the process so far (cumulative)
    dev: int = -1  # CUDA ordinal of the process's device (-1: unknown)
    uuid: str = ""


@dataclass(frozen=True)
class Message:
    """One agent's report."""

    pid: int
    state: str
    seq: int = 0
    role: str = "generic"
    detail: str = ""
    lib: str = ""
    mode: str = ""
    devices: tuple[tuple[int, str], ...] = ()  # (CUDA ordinal, GPU UUID)
    windows: tuple[Window, ...] = ()
    steps: tuple[Steps, ...] = ()
    sent_dropped: int = 0  # messages this agent could not send since it started
    steps_stale: int = 0  # step records the light agent dropped since it started, too old to send
    settings_rejected: int = 0  # its BOUNDWATCH_AGENT_* settings out of bounds (their defaults serve)
    graphs: GraphCounts | None = None  # light hooks' counts (key "graphs"; absent from older agents)
    # a light agent silent this long while its process runs has nothing to report (its engine stopped
    # stepping: its thread does not wake to say so); 0: silence says nothing (older agents, CUPTI)
    silent_ms: int = 0
    v: int = field(default=VERSION)

    def uuid_of(self, dev: int) -> str:
        """Return the GPU UUID the agent reported for a CUDA ordinal, or ''."""
        for ordinal, uuid in self.devices:
            if ordinal == dev:
                return uuid
        return ""


def _window_dict(w: Window) -> dict[str, Any]:
    d: dict[str, Any] = {"dev": w.dev, "t0": w.t0, "t1": w.t1, "busy": w.busy}
    for key in ("graph_busy", "kernels", "memcpys", "memsets", "graphs", "dropped", "gap_sum", "slack"):
        value = getattr(w, key)
        if value:
            d[key] = value
    if any(w.gaps):
        d["gaps"] = list(w.gaps)
    if w.iv:
        d["iv"] = list(w.iv)
    return d


_STEPS_LIGHT_DEFAULTS = {
    "graph": 0,
    "eager": 0,
    "run_ns": 0,
    "wait_ns": 0,
    "running": -1,
    "waiting": -1,
    "max_seqs": 0,
    "dp": -1,
    "owner": 0,
}
_LIGHT_DEFAULT_VALUES = tuple(_STEPS_LIGHT_DEFAULTS.values())

# The agent encodes on the engine's own thread (exporter.agent.light), where code that runs twice a
# second finds every cache cold: one %-format per record touches far less than building dicts for
# json.dumps (a light message 3x faster hot, 4x cold on the development VM). Same keys, same order,
# the same JSON text for every string (json.dumps); integers as %d.
_STEPS_JSON = (
    '{"engine":%s,"n":%d,"wall":%d,"gpu":%d,"tokens":%d,"seqs":%d,"measured":%d,"hist":[%s],"t0":%d,"t1":%d'
)
_STEPS_LIGHT_JSON = tuple(f',"{key}":%d' for key in _STEPS_LIGHT_DEFAULTS)  # each only when not its default
_MESSAGE_JSON = '{"v":%d,"pid":%d,"seq":%d,"state":%s,"role":%s'
_DROPPED_JSON = ',"sent_dropped":%d'
_STALE_JSON = ',"steps_stale":%d'
_REJECTED_JSON = ',"settings_rejected":%d'
_SILENT_JSON = ',"silent_ms":%d'
_GRAPHS_JSON = '{"t0":%d,"t1":%d,"replays":%d,"captures":%d%s}'
_GRAPHS_DEV_JSON = ',"dev":%d'
_JSON_STRINGS: dict[str, str] = {}  # the strings an agent repeats (engine, role, state, mode, uuid, lib)
MAX_JSON_STRINGS = 256


def _js(text: str) -> str:
    """Return text as a JSON string (json.dumps), remembered for the next message."""
    out = _JSON_STRINGS.get(text)
    if out is None:
        out = json.dumps(text)
        if len(_JSON_STRINGS) < MAX_JSON_STRINGS:
            _JSON_STRINGS[text] = out
    return out


def _steps_json(s: Steps) -> str:
    """Return one Steps record as JSON; each light-agent key only where it differs from its default."""
    head = _STEPS_JSON % (
        _js(s.engine), s.n, s.wall, s.gpu, s.tokens, s.seqs, s.measured, ",".join(map(str, s.hist)), s.t0, s.t1,
    )  # fmt: skip
    light = (s.graph, s.eager, s.run_ns, s.wait_ns, s.running, s.waiting, s.max_seqs, s.dp, s.owner)
    if light == _LIGHT_DEFAULT_VALUES:
        return head + "}"
    keys, defaults = _STEPS_LIGHT_JSON, _LIGHT_DEFAULT_VALUES
    return head + "".join([keys[i] % v for i, v in enumerate(light) if v != defaults[i]]) + "}"


def _graphs_json(g: GraphCounts) -> str:
    tail = (_GRAPHS_DEV_JSON % g.dev if g.dev >= 0 else "") + (',"uuid":' + _js(g.uuid) if g.uuid else "")
    return _GRAPHS_JSON % (g.t0, g.t1, g.replays, g.captures, tail)


def encode(msg: Message) -> bytes:
    """Return the datagram for a message; raise WireError when it exceeds MAX_DATAGRAM_BYTES or a field is no integer."""
    try:
        parts = [_MESSAGE_JSON % (msg.v, msg.pid, msg.seq, _js(msg.state), _js(msg.role))]
        if msg.detail:
            parts.append(',"detail":' + _js(msg.detail))
        if msg.lib:
            parts.append(',"lib":' + _js(msg.lib))
        if msg.mode:
            parts.append(',"mode":' + _js(msg.mode))
        if msg.devices:
            devices = [{"dev": d, "uuid": u} for d, u in msg.devices]
            parts.append(',"devices":' + json.dumps(devices, separators=(",", ":")))
        if msg.windows:
            windows = [_window_dict(w) for w in msg.windows]
            parts.append(',"windows":' + json.dumps(windows, separators=(",", ":")))
        if msg.steps:
            parts.append(',"steps":[' + ",".join([_steps_json(s) for s in msg.steps]) + "]")
        if msg.sent_dropped:
            parts.append(_DROPPED_JSON % msg.sent_dropped)
        if msg.steps_stale:
            parts.append(_STALE_JSON % msg.steps_stale)
        if msg.settings_rejected:
            parts.append(_REJECTED_JSON % msg.settings_rejected)
        if msg.silent_ms:
            parts.append(_SILENT_JSON % msg.silent_ms)
        if msg.graphs is not None:
            parts.append(',"graphs":' + _graphs_json(msg.graphs))
    except (TypeError, ValueError) as exc:  # a float NaN, a None: the sidecar would refuse it anyway
        raise WireError(f"message does not encode: {exc}") from exc
    parts.append("}")
    data = "".join(parts).encode()
    if len(data) > MAX_DATAGRAM_BYTES:
        raise WireError(f"message is {len(data)} bytes, over {MAX_DATAGRAM_BYTES}")
    return data


def _int(d: Mapping[str, Any], key: str, default: int | None = None, lo: int = 0, hi: int = MAX_INT) -> int:
    value = d.get(key, default)
    if type(value) is int and lo <= value <= hi:  # the common case first: no bool, in range
        return value
    if value is None:
        raise WireError(f"missing {key}")
    if not isinstance(value, int) or isinstance(value, bool):
        raise WireError(f"{key} is not an integer")
    if value < lo:
        raise WireError(f"{key} is negative" if lo == 0 else f"{key} is below {lo}")
    if value > hi:
        raise WireError(f"{key} is over {hi}")
    return value


def _str(d: Mapping[str, Any], key: str, default: str = "", limit: int = 512) -> str:
    value = d.get(key, default)
    if type(value) is str and len(value) <= limit and value.isprintable():  # the common case first
        return value
    if not isinstance(value, str):
        raise WireError(f"{key} is not a string")
    value = value[:limit]
    if not value.isprintable():  # control characters and lone surrogates never reach a label or log
        value = "".join(c if c.isprintable() else "?" for c in value)
        value = value.encode("utf-8", "replace").decode("utf-8")
    return value


def _ints(
    d: Mapping[str, Any], key: str, length: int | None = None, limit: int = 2 * MAX_INTERVALS
) -> tuple[int, ...]:
    value = d.get(key, [])
    if not isinstance(value, list):
        raise WireError(f"{key} is not a list of integers")
    if len(value) > limit:
        raise WireError(f"{key} has {len(value)} entries, over {limit}")
    if value and set(map(type, value)) != {int}:  # one pass in C: no bool, float or str slips in
        raise WireError(f"{key} is not a list of integers")
    # none negative, then: the largest is over MAX_INT only where their sum is (a sum is cheaper than a max)
    if value and (min(value) < 0 or (sum(value) > MAX_INT and max(value) > MAX_INT)):
        raise WireError(f"{key} holds a negative or too large value")
    if length is not None and value and len(value) != length:
        raise WireError(f"{key} has {len(value)} entries, expected {length}")
    return tuple(value)


def _list(d: Mapping[str, Any], key: str, limit: int) -> list[Any]:
    value = d.get(key, [])
    if not isinstance(value, list):
        raise WireError(f"{key} is not a list")
    if len(value) > limit:
        raise WireError(f"{key} has {len(value)} entries, over {limit}")
    return value


def _frozen(cls: type[F], values: dict[str, Any]) -> F:
    """Return a frozen dataclass with its fields set from `values` (every field, in field order).

    The same object as `cls(**values)`, without the frozen __init__'s one object.__setattr__ per
    field; only for values already checked, each field present.
    """
    obj = object.__new__(cls)
    obj.__dict__.update(values)
    return obj


_ONLY_INT = {int}


def _window(d: Any) -> Window:
    if not isinstance(d, dict):
        raise WireError("window is not an object")
    get = d.get
    ints: tuple[Any, ...] = (
        get("dev"),
        get("t0"),
        get("t1"),
        get("busy"),
        get("graph_busy", 0),
        get("kernels", 0),
        get("memcpys", 0),
        get("memsets", 0),
        get("graphs", 0),
        get("dropped", 0),
        get("gap_sum", 0),
        get("slack", 0),
    )
    # Every integer key checked in one pass in C (no bool, None or float, none negative or too
    # large): then each _int would return it as it is. Else the key by key path says what is wrong.
    if (
        set(map(type, ints)) == _ONLY_INT
        and min(ints) >= 0
        and max(ints) <= MAX_INT
        and ints[0] <= MAX_ORDINAL
    ):
        w = _frozen(Window, _window_fields(ints, _ints(d, "gaps", IDLE_GAP_BUCKET_COUNT), _ints(d, "iv")))
    else:
        w = _window_by_key(d)
    return _window_bounded(w)


def _window_fields(ints: tuple[int, ...], gaps: tuple[int, ...], iv: tuple[int, ...]) -> dict[str, Any]:
    """Return a Window's fields in field order from its checked integers (as `_window` reads them) and lists."""
    dev, t0, t1, busy, graph_busy, kernels, memcpys, memsets, graphs, dropped, gap_sum, slack = ints
    return {
        "dev": dev,
        "t0": t0,
        "t1": t1,
        "busy": busy,
        "graph_busy": graph_busy,
        "kernels": kernels,
        "memcpys": memcpys,
        "memsets": memsets,
        "graphs": graphs,
        "dropped": dropped,
        "gaps": gaps,
        "gap_sum": gap_sum,
        "iv": iv,
        "slack": slack,
    }


def _window_by_key(d: dict[str, Any]) -> Window:
    """Return a window checked key by key, raising the first bad key's error."""
    return Window(
        dev=_int(d, "dev", hi=MAX_ORDINAL),
        t0=_int(d, "t0"),
        t1=_int(d, "t1"),
        busy=_int(d, "busy"),
        graph_busy=_int(d, "graph_busy", 0),
        kernels=_int(d, "kernels", 0),
        memcpys=_int(d, "memcpys", 0),
        memsets=_int(d, "memsets", 0),
        graphs=_int(d, "graphs", 0),
        dropped=_int(d, "dropped", 0),
        gaps=_ints(d, "gaps", IDLE_GAP_BUCKET_COUNT),
        gap_sum=_int(d, "gap_sum", 0),
        iv=_ints(d, "iv"),
        slack=_int(d, "slack", 0),
    )


def _window_bounded(w: Window) -> Window:
    """Return a window whose figures fit its span, or raise what does not."""
    span = w.t1 - w.t0
    if span <= 0:
        raise WireError("window ends before it starts")
    if max(w.busy, w.graph_busy, w.slack) > span:  # gap_sum may not: a gap can start windows earlier
        raise WireError("window busy, graph or slack time exceeds its span")
    if w.kernels + w.memcpys + w.memsets + w.graphs + w.dropped > span // MIN_RECORD_NS + 1:
        raise WireError("window claims more activity records than its span can hold")
    if sum(w.gaps) > span // IDLE_GAP_MIN_NS + 1:
        raise WireError("window claims more idle gaps than its span can hold")
    if len(w.iv) % 2:
        raise WireError("iv has an odd number of entries")
    if sum(w.iv) > span // 1000 + 1:
        raise WireError("iv reaches past the window's end")
    return w


def _steps(d: Any) -> Steps:
    if not isinstance(d, dict):
        raise WireError("steps is not an object")
    n = _int(d, "n", hi=MAX_STEPS_PER_MESSAGE)
    s = Steps(
        engine=_str(d, "engine", limit=64) or "unknown",
        n=n,
        wall=_int(d, "wall"),
        gpu=_int(d, "gpu", 0),
        tokens=_int(d, "tokens", 0, hi=n * MAX_TOKENS_PER_STEP),
        seqs=_int(d, "seqs", 0, hi=n * MAX_SEQS_PER_STEP),
        measured=1 if _int(d, "measured", 0) else 0,
        hist=_ints(d, "hist", STEP_BUCKET_COUNT),
        t0=_int(d, "t0", 0),
        t1=_int(d, "t1", 0),
        **_steps_light(d),
    )
    if s.t1 < s.t0:
        raise WireError("steps end before they start")
    if s.hist and sum(s.hist) != s.n:
        raise WireError("steps histogram does not count n steps")
    if s.gpu > s.wall * MAX_DEVICES:
        raise WireError("steps claim more GPU time than their devices can hold")
    return s


def _no_constant(name: str) -> Any:
    raise WireError(f"{name} is not a number on the wire")


_DECODER = json.JSONDecoder(parse_constant=_no_constant)  # NaN and Infinity refused


def _count(d: Mapping[str, Any], key: str, default: int) -> int:
    """Return an optional non-negative integer key, or default when it is absent."""
    value = d.get(key)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise WireError(f"{key} is not a non-negative integer")
    return value


def _steps_light(d: Mapping[str, Any]) -> dict[str, int]:
    """Return the light-agent keys of a steps object (defaults where an older agent sent none)."""
    return {k: _count(d, k, default) for k, default in _STEPS_LIGHT_DEFAULTS.items()}


def _graph_counts(body: Mapping[str, Any]) -> GraphCounts | None:
    """Return the message's light-hook graph counts, None when it has none."""
    d = body.get("graphs")
    if d is None:
        return None
    if not isinstance(d, dict):
        raise WireError("graphs is not an object")
    g = GraphCounts(
        t0=_count(d, "t0", 0),
        t1=_count(d, "t1", 0),
        replays=_count(d, "replays", 0),
        captures=_count(d, "captures", 0),
        dev=_count(d, "dev", -1),
        uuid=_str(d, "uuid", limit=96),
    )
    if g.t1 < g.t0:
        raise WireError("graphs window ends before it starts")
    return g


def decode(data: bytes) -> Message:
    """Return the message in a datagram, or raise WireError (and only WireError) saying what is wrong."""
    if len(data) > MAX_DATAGRAM_BYTES:
        raise WireError("datagram too large")
    plain = False
    try:
        if type(data) is bytes:  # as json.loads does, without building a decoder per datagram
            encoding = json.detect_encoding(data)
            # UTF-8 without the text `true` or `false` holds no JSON bool anywhere (a literal has no
            # escaped form): then a list of numbers that sums to an int holds ints only (`_plain_sum`)
            plain = encoding == "utf-8" and b"true" not in data and b"false" not in data
            body = _DECODER.decode(data.decode(encoding, "surrogatepass"))
        else:
            body = json.loads(data, parse_constant=_no_constant)
    except WireError:
        raise
    except (
        ValueError,
        RecursionError,
        TypeError,
    ) as exc:  # bad JSON or UTF-8, a 4,300-digit int, deep nesting
        raise WireError(f"not JSON: {type(exc).__name__}: {str(exc)[:200]}") from None
    try:
        msg = _message_plain(body) if plain else None
        return msg if msg is not None else _message(body)
    except WireError:
        raise
    except (ValueError, TypeError, RecursionError, OverflowError) as exc:  # a check this module forgot
        raise WireError(f"invalid message: {type(exc).__name__}: {str(exc)[:200]}") from None


_ONLY_STR = {str}


def _plain_sum(value: Any, limit: int) -> int | None:
    """Return the sum of a bool-free list of at most `limit` non-negative ints, or None if it is anything else.

    One pass in C: a str, None, list or object in the list fails the sum, a float makes it a float.
    """
    if type(value) is not list or len(value) > limit:
        return None
    try:
        total = sum(value)
    except TypeError:
        return None
    if type(total) is not int or (value and min(value) < 0):
        return None
    return total


def _message_plain(body: Any) -> Message | None:
    """Return the message of a bool-free body whose every value has the usual shape and bounds, else None.

    The Message `_message` returns for such a body, its checks made a group of fields at a time;
    anything else (a value missing, of another type or out of bounds, a string to cut or mend, an
    unknown role) is left to `_message`, which decodes it or says what is wrong.
    """
    if type(body) is not dict:
        return None
    get = body.get
    ints: tuple[Any, ...] = (
        get("v"),
        get("pid"),
        get("seq", 0),
        get("sent_dropped", 0),
        get("steps_stale", 0),
        get("settings_rejected", 0),
        get("silent_ms", 0),
    )
    if (
        set(map(type, ints)) != _ONLY_INT
        or ints[0] != VERSION
        or min(ints) < 0
        or max(ints) > MAX_INT
        or ints[1] > 2**31
        or ints[5] > MAX_SETTINGS_REJECTED
        or ints[6] > MAX_SILENT_MS
    ):
        return None
    strs = (get("state"), get("role", "generic"), get("detail", ""), get("lib", ""), get("mode", ""))
    state, role, detail, lib, mode = strs
    if (
        set(map(type, strs)) != _ONLY_STR  # first: the checks after it are a str's
        or state not in STATES
        or role not in ROLES
        or len(detail) > 256
        or len(lib) > 256
        or len(mode) > 32
        or not (detail + lib + mode).isprintable()
    ):
        return None
    devices = _devices_plain(get("devices", []))
    windows_raw, steps_raw = get("windows", []), get("steps", [])
    if (
        devices is None
        or type(windows_raw) is not list
        or len(windows_raw) > MAX_WINDOWS
        or type(steps_raw) is not list
        or len(steps_raw) > MAX_STEPS
    ):
        return None
    windows = [_window_plain(w) for w in windows_raw]
    if None in windows:
        return None
    try:  # small: the usual steps at once, the rest checked as `_message` checks them
        steps = tuple([_steps_plain(s) or _steps(s) for s in steps_raw])
        graphs = _graph_counts_plain(get("graphs")) or _graph_counts(body)
    except Exception:
        return None
    return _frozen(
        Message,
        {
            "pid": ints[1],
            "state": state,
            "seq": ints[2],
            "role": role,
            "detail": detail,
            "lib": lib,
            "mode": mode,
            "devices": devices,
            "windows": tuple(windows),
            "steps": steps,
            "sent_dropped": ints[3],
            "steps_stale": ints[4],
            "settings_rejected": ints[5],
            "graphs": graphs,
            "silent_ms": ints[6],
            "v": VERSION,
        },
    )


_STEPS_LIGHT_KEYS = tuple(_STEPS_LIGHT_DEFAULTS)


def _steps_plain(d: Any) -> Steps | None:
    """Return a bool-free steps object of the usual shape within every bound `_steps` checks, else None.

    The Steps `_steps` returns for it (an engine name to cut or mend, or absent, is left to `_steps`).
    """
    if type(d) is not dict:
        return None
    get = d.get
    engine, hist = get("engine"), get("hist", [])
    ints: tuple[Any, ...] = (
        get("n"),
        get("wall"),
        get("gpu", 0),
        get("tokens", 0),
        get("seqs", 0),
        get("measured", 0),
        get("t0", 0),
        get("t1", 0),
    )
    if (
        type(engine) is not str
        or not engine
        or len(engine) > 64
        or not engine.isprintable()
        or set(map(type, ints)) != _ONLY_INT
        or min(ints) < 0
        or max(ints) > MAX_INT
    ):
        return None
    n, wall, gpu, tokens, seqs, measured, t0, t1 = ints
    if (
        n > MAX_STEPS_PER_MESSAGE
        or tokens > n * MAX_TOKENS_PER_STEP
        or seqs > n * MAX_SEQS_PER_STEP
        or t1 < t0
        or gpu > wall * MAX_DEVICES
        or type(hist) is not list
        or (hist and (len(hist) != STEP_BUCKET_COUNT or _plain_sum(hist, STEP_BUCKET_COUNT) != n))
    ):
        return None
    light = [get(k) for k in _STEPS_LIGHT_KEYS]  # each absent (or null) takes its default, as `_count` does
    given = [v for v in light if v is not None]
    if given and (set(map(type, given)) != _ONLY_INT or min(given) < 0):
        return None
    values = {
        "engine": engine,
        "n": n,
        "wall": wall,
        "gpu": gpu,
        "tokens": tokens,
        "seqs": seqs,
        "measured": 1 if measured else 0,
        "hist": tuple(hist),
        "t0": t0,
        "t1": t1,
    }
    for k, v, default in zip(_STEPS_LIGHT_KEYS, light, _LIGHT_DEFAULT_VALUES, strict=True):
        values[k] = default if v is None else v
    return _frozen(Steps, values)


def _graph_counts_plain(d: Any) -> GraphCounts | None:
    """Return bool-free graph counts of the usual shape, as `_graph_counts` does, else None (absent too)."""
    if type(d) is not dict:
        return None
    get = d.get
    ints: tuple[Any, ...] = (get("t0", 0), get("t1", 0), get("replays", 0), get("captures", 0), get("dev", 0))
    uuid = get("uuid", "")
    if (
        set(map(type, ints)) != _ONLY_INT
        or min(ints) < 0
        or ints[1] < ints[0]
        or type(uuid) is not str
        or len(uuid) > 96
        or not uuid.isprintable()
    ):
        return None
    t0, t1, replays, captures, dev = ints
    if "dev" not in d:
        dev = -1
    return _frozen(
        GraphCounts, {"t0": t0, "t1": t1, "replays": replays, "captures": captures, "dev": dev, "uuid": uuid}
    )


def _devices_plain(items: Any) -> tuple[tuple[int, str], ...] | None:
    """Return the (ordinal, UUID) pairs of a bool-free devices list of the usual shape, else None."""
    if type(items) is not list or len(items) > MAX_DEVICES:
        return None
    out = []
    for item in items:
        if type(item) is not dict:
            return None
        dev, uuid = item.get("dev"), item.get("uuid", "")
        if type(dev) is not int or type(uuid) is not str:
            return None
        if not 0 <= dev <= MAX_ORDINAL or len(uuid) > 96 or not uuid.isprintable():
            return None
        out.append((dev, uuid))
    return tuple(out)


def _window_plain(d: Any) -> Window | None:
    """Return a bool-free window of the usual shape within every bound `_window` checks, else None."""
    if type(d) is not dict:
        return None
    get = d.get
    ints: tuple[Any, ...] = (
        get("dev"),
        get("t0"),
        get("t1"),
        get("busy"),
        get("graph_busy", 0),
        get("kernels", 0),
        get("memcpys", 0),
        get("memsets", 0),
        get("graphs", 0),
        get("dropped", 0),
        get("gap_sum", 0),
        get("slack", 0),
    )
    if set(map(type, ints)) != _ONLY_INT or min(ints) < 0 or max(ints) > MAX_INT or ints[0] > MAX_ORDINAL:
        return None
    span = ints[2] - ints[1]
    if span <= 0 or max(ints[3], ints[4], ints[11]) > span or sum(ints[5:10]) > span // MIN_RECORD_NS + 1:
        return None
    gaps, iv = get("gaps", []), get("iv", [])
    gap_total = _plain_sum(gaps, IDLE_GAP_BUCKET_COUNT)
    iv_total = _plain_sum(iv, 2 * MAX_INTERVALS)
    if (
        gap_total is None
        or iv_total is None
        or (gaps and len(gaps) != IDLE_GAP_BUCKET_COUNT)
        or gap_total > span // IDLE_GAP_MIN_NS + 1
        or len(iv) % 2
        or iv_total > span // 1000 + 1
    ):
        return None
    return _frozen(Window, _window_fields(ints, tuple(gaps), tuple(iv)))


def _message(body: Any) -> Message:
    if not isinstance(body, dict):
        raise WireError("message is not an object")
    if body.get("v") != VERSION or isinstance(body.get("v"), bool):
        raise WireError(f"unsupported version {str(body.get('v'))[:32]!r}")
    state = _str(body, "state", limit=32)
    if state not in STATES:
        raise WireError(f"unknown state {state!r}")
    role = _str(body, "role", "generic", limit=32)
    if role not in ROLES:
        role = "generic"
    devices = []
    for item in _list(body, "devices", MAX_DEVICES):
        if not isinstance(item, dict):
            raise WireError("device is not an object")
        devices.append((_int(item, "dev", hi=MAX_ORDINAL), _str(item, "uuid", limit=96)))
    windows_raw = _list(body, "windows", MAX_WINDOWS)
    steps_raw = _list(body, "steps", MAX_STEPS)
    return _frozen(  # every value checked: Message(**these) without its frozen __init__
        Message,
        {
            "pid": _int(body, "pid", hi=2**31),
            "state": state,
            "seq": _int(body, "seq", 0),
            "role": role,
            "detail": _str(body, "detail", limit=256),
            "lib": _str(body, "lib", limit=256),
            "mode": _str(body, "mode", limit=32),
            "devices": tuple(devices),
            "windows": tuple([_window(w) for w in windows_raw]),
            "steps": tuple([_steps(s) for s in steps_raw]),
            "sent_dropped": _int(body, "sent_dropped", 0),
            "steps_stale": _int(body, "steps_stale", 0),
            "settings_rejected": _int(body, "settings_rejected", 0, hi=MAX_SETTINGS_REJECTED),
            "graphs": _graph_counts(body),
            "silent_ms": _int(body, "silent_ms", 0, hi=MAX_SILENT_MS),
            "v": VERSION,
        },
    )


def pack_intervals(
    intervals: list[tuple[int, int]], t0: int, limit: int = MAX_INTERVALS
) -> tuple[tuple[int, ...], int]:
    """Return sorted disjoint ns intervals as (offset, len, gap, len, ...) in us from t0, and the ns filled.

    When there are more than `limit` intervals, the shortest gaps are filled first, so the list
    over-states busy time by at most the returned slack.
    """
    if not intervals:
        return (), 0
    ivs = list(intervals)
    slack = 0
    if len(ivs) > limit:
        gaps = sorted(range(1, len(ivs)), key=lambda i: ivs[i][0] - ivs[i - 1][1])
        fill = set(gaps[: len(ivs) - limit])
        merged: list[tuple[int, int]] = [ivs[0]]
        for i in range(1, len(ivs)):
            if i in fill:
                slack += ivs[i][0] - merged[-1][1]
                merged[-1] = (merged[-1][0], ivs[i][1])
            else:
                merged.append(ivs[i])
        ivs = merged
    out: list[int] = []
    prev_end_us = 0
    for s, e in ivs:
        s_us = max((s - t0) // 1000, prev_end_us)
        e_us = max(s_us, -(-(e - t0) // 1000))  # round the end up so lengths never vanish
        out.append(s_us - prev_end_us)
        out.append(e_us - s_us)
        prev_end_us = e_us
    return tuple(out), slack


def unpack_intervals(iv: tuple[int, ...], t0: int) -> list[tuple[int, int]]:
    """Return the ns intervals of a packed list (inverse of pack_intervals, to 1 us)."""
    edges = list(itertools.accumulate(iv[: len(iv) - len(iv) % 2]))  # us from t0: start, end, start...
    return [(t0 + s * 1000, t0 + e * 1000) for s, e in zip(edges[0::2], edges[1::2], strict=True)]


def intervals_end(iv: tuple[int, ...], t0: int) -> int | None:
    """Return where the last interval of a packed list ends, ns (None for an empty list)."""
    whole = len(iv) - len(iv) % 2
    return t0 + sum(iv[:whole]) * 1000 if whole else None
