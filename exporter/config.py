"""Configuration: one frozen object built from defaults, a TOML file, BOUNDWATCH_* variables and flags.

Later layers win: defaults < `--config FILE` (TOML) < environment < command-line flags.
Every default runs anywhere: no GPU, no engine, no root.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import tomllib
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from exporter.wire import default_agent_socket  # shared with the in-process agent

DEFAULT_PORT = 9482  # 9400 is dcgm-exporter's, 9401 and 9835 are other GPU exporters'.
ENV_PREFIX = "BOUNDWATCH_"
MAX_SLOW_READ_SECONDS = 300.0  # engine.slow_read_seconds: token counters older than this are of little use
MAX_GPM_EVERY_TICKS = 20  # nvml.gpm_every_ticks: older GPM ratios would lag the verdict by seconds


class ConfigError(ValueError):
    """The configuration is invalid; `problems` holds one line per bad key (where it came from, and why)."""

    def __init__(self, problems: str | Sequence[str]) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("; ".join(self.problems))


@dataclass(frozen=True)
class NvmlConfig:
    """NVML source settings."""

    enabled: bool = True
    timeout_seconds: float = 2.0
    energy_every_seconds: float = 10.0  # one energy read costs ~2.4 ms (p99 24 ms) on the H200
    gpm: bool = True
    # GPM is read every this many ticks (1-20) and its ratios kept in between: nvmlGpmMetricsGet
    # costs 2-2.5 ms of CPU per busy GPU on the H200, most of a tick's NVML time
    gpm_every_ticks: int = 1
    # GPM GRAPHICS_UTIL, the verdict's busy share, is the whole of nvmlGpmMetricsGet's cost (~2.2 ms of
    # CPU per GPU per 0.5 s tick on the H200; the other GPM metrics ~1 us each). Off, the busy share is
    # utilization.gpu, one 200 ms sample per tick: right on average but up to 0.6 off per tick where
    # load comes in bursts, and 9 of 23 H200 lab recordings replay below 95% right (bench/README.md)
    gpm_graphics: bool = True
    # On a busy GPU, GRAPHICS_UTIL is read only where the verdict could turn on it: every 8th read, when
    # SM_UTIL or its estimate (SM_UTIL times the last graphics / SM ratio) moved more than 0.05, or when
    # the estimate is within 0.10 of one of the verdict's edges; else the estimate stands in (marked on /metrics). On the
    # H200 lab's recordings that reads 35-46% of the GPU ticks with no verdict changed (bench/README.md,
    # session 22); live on the H200 in all three agent modes every scenario stayed right in 100% of its
    # ticks, and the daemon beside an engine went 1.30-1.37% -> 1.00-1.03% of a core (session 26).
    # Off: read on every tick an SM ran
    graphics_estimate: bool = True


@dataclass(frozen=True)
class HostConfig:
    """Host, /proc and cgroup source settings."""

    enabled: bool = True
    proc_root: str = "/proc"
    cgroup_root: str = "/sys/fs/cgroup"
    # no effect: the host is read on the event loop, with no thread to time out (sources/host.py);
    # still accepted, so that a configuration written for an older boundwatch loads
    timeout_seconds: float = 2.0


MAX_HISTORY_SECONDS = 3_600.0  # snapshots are kept in memory (compacted): an hour of 0.5 s ticks is 7,200


@dataclass(frozen=True)
class EngineConfig:
    """Engine (vLLM / SGLang) source settings."""

    enabled: bool = True
    urls: tuple[str, ...] = ()  # explicit /metrics URLs; discovered engines are added
    discover: bool = True
    read_multiproc_files: bool = True  # read PROMETHEUS_MULTIPROC_DIR directly instead of HTTP when local
    page_filter: bool = True  # ask an engine's page over HTTP for only the samples read (`name[]`)
    timeout_seconds: float = 2.0  # a saturated API server answers late; the tick does not wait for it
    api_server_saturated: float = 0.9  # busiest-thread CPU share that counts as saturated
    max_page_bytes: int = 8 * 1024 * 1024  # per read of one page: the rest is left unread (truncated)
    max_page_lines: int = 50_000  # per read of one page
    max_label_chars: int = 128  # label values (and the model name) are cut to this length
    # While an agent reports an engine's scheduler counts, its API server's page is read only this
    # often (for the token counters and the model name); 0 reads it every tick regardless.
    slow_read_seconds: float = 10.0


@dataclass(frozen=True)
class AgentFeedConfig:
    """Where in-process agents send their windows."""

    enabled: bool = True
    socket: str = field(default_factory=default_agent_socket)
    stale_seconds: float = 5.0
    # Group of the socket (and of a directory the daemon creates); "": `boundwatch` if it exists.
    socket_group: str = ""
    # Senders allowed besides root and the daemon's own user (names or uids).
    allowed_uids: tuple[str, ...] = ()
    # Groups whose members may send (names or gids); empty: the socket's group.
    allowed_groups: tuple[str, ...] = ()


@dataclass(frozen=True)
class VerdictConfig:
    """Thresholds of the host-bound / GPU-bound classifier (docs/verdict.md, exporter/analysis/verdict.py).

    Timing: at 0.5 s ticks the busy share of the latest tick (GPM/NVML, measured with the engine
    queue) and a 2-tick hold make a change of load show within 0.5-1.6 s; reasons use 1.5 s.
    """

    window_seconds: float = 1.5  # evidence for reasons (CPU, throttling, graph share, steps, rates)
    busy_window_seconds: float = 0.5  # busy share averaged for the thresholds (the latest tick)
    busy_source: str = (
        "fresh"  # fresh: GPM/NVML of the same tick as the engine queue; best: CUPTI first (late)
    )
    busy_high: float = 0.85  # at or above: GPU-bound when work is pending
    busy_low: float = 0.70  # below: host-bound when work is pending; between: the previous verdict
    # While work waits (in the engine's queue or a full batch, a saturated API server, behind a quota)
    # a GPU-bound GPU is busy: a gpu verdict holds only down to this busy share, not busy_low
    # (docs/verdict.md); taken within [busy_low, busy_high], so thresholds set lower keep working
    queued_busy_low: float = 0.83
    idle_busy: float = 0.02  # with no engine source: below this busy share the GPU counts as idle
    api_server_saturated: float = 0.90  # busiest API-server thread, cores (1.0 = one core all the time)
    throttled_share: float = 0.05  # share of quota periods throttled (or throttled s per s)
    graph_share_low: float = 0.5  # share of busy time inside CUDA graphs below which decode ran eager
    step_gpu_share_low: float = 0.5  # GPU time per step over step wall time below which steps are host-heavy
    waiting_empty: float = 0.5  # mean waiting requests at or below: the engine's queue is empty
    admission_fill: float = 0.9  # running below this share of the batch limit, queue empty: admission stalls
    hold_ticks: int = 2  # a new verdict must be the raw verdict this many ticks in a row before it shows
    max_batch: int | None = (
        None  # configured max_num_seqs (else the engine's own figure), for admission_stalled
    )
    # Work offered: the engine's running/waiting at any tick this recent (counter and CPU evidence
    # takes the newest tick alone). 1.0 s = the newest two readings at 0.5 s ticks: with the 2-tick
    # hold, a load that stops shows idle within 1.0-1.6 s.
    offered_window_seconds: float = 1.0
    # Eager decode measured by GPM/NVML: launch gaps of tiny eager kernels read as busy (H200: GPM
    # 0.85-0.94 where CUPTI's union read 0.61), so a GPU-bound verdict needs this bar (docs/verdict.md).
    eager_busy_high: float = 0.97
    eager_busy_low: float = 0.95  # eager decode, GPM/NVML figure below this: host-bound

    def __post_init__(self) -> None:
        if not 0 < self.eager_busy_low <= self.eager_busy_high <= 1:
            raise ConfigError("verdict eager thresholds need 0 < eager_busy_low <= eager_busy_high <= 1")
        if self.offered_window_seconds <= 0:
            raise ConfigError("verdict.offered_window_seconds must be positive")


@dataclass(frozen=True)
class RooflineConfig:
    """Inputs of the step-time floor."""

    weight_bytes_per_step: float | None = None
    hbm_bandwidth_bytes_per_second: float | None = None  # None: use the probe's measurement


@dataclass(frozen=True)
class ProbeConfig:
    """The scheduled self-test probe: runs in a subprocess only while every GPU and engine is idle."""

    enabled: bool = False
    interval_seconds: float = 3600.0  # at least this long between two runs
    idle_seconds: float = 60.0  # no engine work and busy <= idle_busy_max for this long before a run
    idle_busy_max: float = 0.02  # busy ratio that still counts as idle
    timeout_seconds: float = 180.0  # the subprocess is killed after this long
    duty: tuple[float, ...] = (0.5,)  # duty-cycle phases of a scheduled run
    phase_seconds: float = 3.0  # measured seconds per phase
    check_self: bool = True  # compare the phases with this sidecar's own /metrics

    def __post_init__(self) -> None:
        try:
            duty = tuple(float(d) for d in self.duty)  # env and TOML give strings
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"probe.duty: expected busy fractions, got {self.duty!r}") from exc
        object.__setattr__(self, "duty", duty)
        if any(not 0 < d < 1 for d in duty):
            raise ConfigError(f"probe.duty: busy fractions must be in (0, 1), got {duty}")
        if self.interval_seconds <= 0 or self.idle_seconds < 0 or self.timeout_seconds <= 0:
            raise ConfigError("probe: interval_seconds and timeout_seconds must be > 0, idle_seconds >= 0")
        if not 0 <= self.idle_busy_max < 1:
            raise ConfigError(f"probe.idle_busy_max must be in [0, 1), got {self.idle_busy_max}")


@dataclass(frozen=True)
class WebConfig:
    """HTTP listener."""

    address: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    basic_auth_file: str | None = None  # lines of "user:bcrypt-hash" (htpasswd -nB) or "user:sha256-hex"
    config_file: str | None = None  # Prometheus exporter-toolkit web config (--web.config.file): TLS + users
    max_connections: int = 4096  # open at once; beyond, 503 and close (capped below RLIMIT_NOFILE)
    header_timeout_seconds: float = 10.0  # a request line and its headers must arrive within this
    idle_timeout_seconds: float = 75.0  # a kept-alive connection with no request is closed after this
    body_timeout_seconds: float = 10.0  # an unread request body is drained at most this long
    auth_failure_burst: int = 10  # wrong credentials allowed at once from one address...
    auth_failures_per_second: float = 0.5  # ...and refilled at this rate; beyond, 429 without a check
    auth_checks_at_once: int = 2  # bcrypt checks running in worker threads at once


_Check = Callable[[bool, str, str], None]  # Config.problems' check(ok, key, message)


@dataclass(frozen=True)
class Config:
    """The whole configuration."""

    tick_seconds: float = 0.5
    history_seconds: float = 120.0
    log_level: str = "info"
    log_format: str = "auto"  # auto | json | console
    web: WebConfig = field(default_factory=WebConfig)
    nvml: NvmlConfig = field(default_factory=NvmlConfig)
    host: HostConfig = field(default_factory=HostConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    agent: AgentFeedConfig = field(default_factory=AgentFeedConfig)
    verdict: VerdictConfig = field(default_factory=VerdictConfig)
    roofline: RooflineConfig = field(default_factory=RooflineConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)

    def validate(self) -> Config:
        """Return self, or raise ConfigError naming every bad key."""
        problems = self.problems()
        if problems:
            raise ConfigError([f"{key}: {message}" for key, message in problems])
        return self

    def problems(self) -> list[tuple[str, str]]:
        """Return (key, message) for every value out of its range or inconsistent with another."""
        out: list[tuple[str, str]] = []

        def check(ok: bool, key: str, message: str) -> None:
            if not ok:
                out.append((key, message))

        check(
            0.05 <= self.tick_seconds <= 60, "tick_seconds", f"must be in [0.05, 60], got {self.tick_seconds}"
        )
        check(
            self.tick_seconds <= self.history_seconds <= MAX_HISTORY_SECONDS,
            "history_seconds",
            f"must be at least tick_seconds and at most {MAX_HISTORY_SECONDS:g} (an hour), got {self.history_seconds}",
        )
        check(
            self.log_level.lower() in {"debug", "info", "warning", "error"},
            "log_level",
            f"must be debug, info, warning or error, got {self.log_level!r}",
        )
        check(
            self.log_format in {"auto", "json", "console"},
            "log_format",
            f"must be auto, json or console, got {self.log_format!r}",
        )
        self._web_problems(check, out)
        self._verdict_problems(check)
        self._engine_problems(check)
        for key, value in _leaves(self):
            if key.endswith("timeout_seconds") and isinstance(value, float):
                check(value > 0, key, f"must be > 0, got {value}")
        return out

    def _web_problems(self, check: _Check, out: list[tuple[str, str]]) -> None:
        """The listener's keys (web.*), the web config file's own problems included."""
        w = self.web
        check(0 <= w.port <= 65535, "web.port", f"must be 0-65535, got {w.port}")
        check(bool(w.address.strip()), "web.address", "must not be empty")
        check(
            (w.tls_cert_file is None) == (w.tls_key_file is None),
            "web.tls_cert_file",
            "web.tls_cert_file and web.tls_key_file go together",
        )
        if w.config_file:
            check(
                not (w.tls_cert_file or w.tls_key_file or w.basic_auth_file),
                "web.config_file",
                "set TLS and users in the web config file or with web.tls_* / web.basic_auth_file, not both",
            )
            from exporter import webconfig

            try:
                webconfig.load(w.config_file)
            except webconfig.WebConfigError as exc:
                out.extend(("web.config_file", problem) for problem in exc.problems)
        elif w.basic_auth_file:
            from exporter import webconfig

            try:
                webconfig.load_users_file(w.basic_auth_file)
            except webconfig.WebConfigError as exc:
                out.extend(("web.basic_auth_file", problem) for problem in exc.problems)
        for name in ("max_connections", "auth_failure_burst", "auth_checks_at_once"):
            check(getattr(w, name) >= 1, f"web.{name}", f"must be at least 1, got {getattr(w, name)}")
        check(w.auth_failures_per_second > 0, "web.auth_failures_per_second", "must be > 0")

    def _verdict_problems(self, check: _Check) -> None:
        """The verdict's thresholds and windows, and how often GPM is read."""
        v = self.verdict
        check(
            0 < v.busy_low <= v.busy_high <= 1,
            "verdict.busy_low",
            "verdict thresholds need 0 < busy_low <= busy_high <= 1",
        )
        check(
            0 < v.queued_busy_low <= 1,
            "verdict.queued_busy_low",
            f"must be in (0, 1], got {v.queued_busy_low}",
        )
        check(
            v.window_seconds > 0 and v.busy_window_seconds > 0,
            "verdict.window_seconds",
            "verdict windows must be positive (a window shorter than a tick is one tick)",
        )
        check(
            v.busy_source in {"fresh", "best"},
            "verdict.busy_source",
            f"must be fresh or best, got {v.busy_source!r}",
        )
        check(v.hold_ticks >= 1, "verdict.hold_ticks", "must be at least 1")
        check(
            1 <= self.nvml.gpm_every_ticks <= MAX_GPM_EVERY_TICKS,
            "nvml.gpm_every_ticks",
            f"must be between 1 and {MAX_GPM_EVERY_TICKS}, got {self.nvml.gpm_every_ticks}",
        )

    def _engine_problems(self, check: _Check) -> None:
        """The engine source's page bounds, slow-read period and URLs."""
        e = self.engine
        check(
            e.max_page_bytes >= 1024,
            "engine.max_page_bytes",
            f"must be at least 1024, got {e.max_page_bytes}",
        )
        check(e.max_page_lines >= 10, "engine.max_page_lines", f"must be at least 10, got {e.max_page_lines}")
        check(
            e.max_label_chars >= 8, "engine.max_label_chars", f"must be at least 8, got {e.max_label_chars}"
        )
        check(
            0 <= e.slow_read_seconds <= MAX_SLOW_READ_SECONDS,
            "engine.slow_read_seconds",
            f"must be between 0 and {MAX_SLOW_READ_SECONDS:g}, got {e.slow_read_seconds}",
        )
        for url in self.engine.urls:
            check(
                url.startswith(("http://", "https://", "file://", "/")),
                "engine.urls",
                f"{url!r} is not an http(s) URL, file:// URL or path",
            )

    def as_dict(self) -> dict[str, Any]:
        """Return the configuration as plain data (for --check-config and the status page)."""
        return dataclasses.asdict(self)


# --- loading: every layer's keys are checked against the field types, every problem is reported ---

_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def _leaves(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Yield (dotted key, value) for every value field of a config dataclass."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            yield from _leaves(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", value


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _describe(tp: Any) -> str:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return f"{_describe(inner[0])} or none"
    if typing.get_origin(tp) is tuple:
        item = typing.get_args(tp)[0]
        return "a list of " + {bool: "booleans", int: "integers", float: "numbers"}.get(item, "strings")
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}.get(tp, str(tp))


def parse_value(value: Any, tp: Any, text: bool) -> Any:
    """Return a value converted to a field's type, or raise ValueError; `text` marks env strings."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        if text and isinstance(value, str) and value.strip().lower() in {"", "none"}:
            return None
        return parse_value(value, inner[0], text)
    if typing.get_origin(tp) is tuple:
        item = typing.get_args(tp)[0]
        if text and isinstance(value, str):
            return tuple(parse_value(p.strip(), item, True) for p in value.split(",") if p.strip())
        if not isinstance(value, list | tuple):
            raise ValueError(f"expected {_describe(tp)}")
        return tuple(parse_value(v, item, text) for v in value)
    if text and isinstance(value, str):
        word = value.strip().lower()
        if tp is bool and word in _TRUE | _FALSE:
            return word in _TRUE
        if tp is int and word.lstrip("+-").isdigit():
            return int(word)
        if tp is float:
            try:
                value = float(word)
            except ValueError:
                raise ValueError(f"expected {_describe(tp)}") from None
        elif tp is str:
            return value
    if tp is bool and isinstance(value, bool):
        return value
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp is float and isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise ValueError("expected a finite number")
        return float(value)
    if tp is str and isinstance(value, str):
        return value
    raise ValueError(f"expected {_describe(tp)}")


def _coerce(value: Any, current: Any, key: str, annotation: str) -> Any:
    """Convert an environment string to the type of the value it replaces (kept for older callers)."""
    tp = type(current) if current is not None else str
    try:
        return parse_value(value, tuple[str, ...] if tp is tuple else tp, isinstance(value, str))
    except ValueError as exc:
        raise ConfigError(f"{key}: {exc}, got {value!r}") from None


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def env_updates(environ: Mapping[str, str]) -> dict[str, str]:
    """Map BOUNDWATCH_SECTION__KEY=value (double underscore = dot) to dotted keys."""
    return {key: value for key, (value, _) in _env_layer(environ).items()}


def _env_layer(environ: Mapping[str, str]) -> dict[str, tuple[Any, str]]:
    out: dict[str, tuple[Any, str]] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or name in {"BOUNDWATCH_CONFIG", "BOUNDWATCH_AGENT"}:
            continue
        if name.startswith("BOUNDWATCH_AGENT_") and not name.startswith("BOUNDWATCH_AGENT__"):
            continue  # the in-process agent's own variables (BOUNDWATCH_AGENT_SOCKET, ...)
        out[name[len(ENV_PREFIX) :].lower().replace("__", ".")] = (value, name)
    return out


def _field_type(key: str) -> tuple[Any, str | None]:
    """Return (the field's type, None) for a dotted key, or (None, why it is not a value key)."""
    cls: Any = Config
    parts = key.split(".")
    for i, part in enumerate(parts):
        hints = _hints(cls)
        if part not in hints:
            known = [".".join([*parts[:i], k]) for k in hints]
            near = difflib.get_close_matches(".".join(parts[: i + 1]), known, n=1)
            return None, "unknown configuration key" + (f" (did you mean {near[0]}?)" if near else "")
        tp = hints[part]
        if dataclasses.is_dataclass(tp):
            if i == len(parts) - 1:
                return None, "is a section, not a value"
            cls = tp
        elif i < len(parts) - 1:
            return None, f"{'.'.join(parts[: i + 1])} is a value, not a section"
        else:
            return tp, None
    return None, "unknown configuration key"  # pragma: no cover


def _build(values: Mapping[str, Any], origins: Mapping[str, str], problems: list[str]) -> Config:
    """Return the Config with checked values set; errors raised by a section go to `problems`."""

    def make(cls: Any, prefix: str) -> Any:
        kwargs: dict[str, Any] = {}
        for name, tp in _hints(cls).items():
            key = prefix + name
            if dataclasses.is_dataclass(tp):
                kwargs[name] = make(tp, key + ".")
            elif key in values:
                kwargs[name] = values[key]
        try:
            return cls(**kwargs)
        except ConfigError as exc:
            where = sorted({origins[k] for k in values if k.startswith(prefix)}) or ["default"]
            problems.extend(f"{', '.join(where)}: {p}" for p in exc.problems)
            return cls(**{k: v for k, v in kwargs.items() if dataclasses.is_dataclass(v)})

    return typing.cast(Config, make(Config, ""))


def load(
    path: str | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    override_origins: Mapping[str, str] | None = None,
) -> Config:
    """Build the configuration from a TOML file, the environment and flag overrides.

    Raises ConfigError listing every unknown key, wrong type and out-of-range value, each with
    where it came from (the file, the variable or the flag).
    """
    environ = os.environ if environ is None else environ
    path = path or environ.get("BOUNDWATCH_CONFIG")
    layers: list[dict[str, tuple[Any, str]]] = []
    if path:
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError as exc:
            raise ConfigError(f"config file {path} does not exist") from exc
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"config file {path}: {exc}") from exc
        layers.append({k: (v, path) for k, v in _flatten(data).items()})
    layers.append(_env_layer(environ))
    flag_names = override_origins or {}
    layers.append(
        {k: (v, flag_names.get(k, f"flag {k}")) for k, v in (overrides or {}).items() if v is not None}
    )
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    problems: list[str] = []
    for layer in layers:
        for key, (value, origin) in layer.items():
            tp, why = _field_type(key)
            if tp is None:
                problems.append(f"{origin}: {key}: {why}")
                continue
            try:
                values[key] = parse_value(value, tp, origin.startswith(ENV_PREFIX))
            except ValueError as exc:
                problems.append(f"{origin}: {key} = {value!r}: {exc}")
                continue
            origins[key] = origin
    cfg = _build(values, origins, problems)
    for key, message in cfg.problems():
        problems.append(f"{origins.get(key, 'default')}: {key}: {message}")
    if problems:
        raise ConfigError(problems)
    return cfg
