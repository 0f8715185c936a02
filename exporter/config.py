"""Configuration: one frozen object built from defaults, a TOML file, BOUNDWATCH_* variables and flags.

Later layers win: defaults < `--config FILE` (TOML) < environment < command-line flags.
Every default runs anywhere: no GPU, no engine, no root.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from exporter.wire import default_agent_socket  # shared with the in-process agent

DEFAULT_PORT = 9482  # 9400 is dcgm-exporter's, 9401 and 9835 are other GPU exporters'.
ENV_PREFIX = "BOUNDWATCH_"


class ConfigError(ValueError):
    """The configuration is invalid; the message says which key and why."""


@dataclass(frozen=True)
class NvmlConfig:
    """NVML source settings."""

    enabled: bool = True
    timeout_seconds: float = 2.0
    energy_every_seconds: float = 10.0  # one energy read costs ~2.4 ms (p99 24 ms) on the H200
    gpm: bool = True


@dataclass(frozen=True)
class HostConfig:
    """Host, /proc and cgroup source settings."""

    enabled: bool = True
    proc_root: str = "/proc"
    cgroup_root: str = "/sys/fs/cgroup"
    timeout_seconds: float = 2.0


@dataclass(frozen=True)
class EngineConfig:
    """Engine (vLLM / SGLang) source settings."""

    enabled: bool = True
    urls: tuple[str, ...] = ()  # explicit /metrics URLs; discovered engines are added
    discover: bool = True
    read_multiproc_files: bool = True  # read PROMETHEUS_MULTIPROC_DIR directly instead of HTTP when local
    timeout_seconds: float = 2.0  # a saturated API server answers late; the tick does not wait for it
    api_server_saturated: float = 0.9  # busiest-thread CPU share that counts as saturated


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
    queue) and a 2-tick hold make a change of load show within 0.5-1.4 s; reasons use 1.5 s.
    """

    window_seconds: float = 1.5  # evidence for reasons (CPU, throttling, graph share, steps, rates)
    busy_window_seconds: float = 0.5  # busy share averaged for the thresholds (the latest tick)
    busy_source: str = (
        "fresh"  # fresh: GPM/NVML of the same tick as the engine queue; best: CUPTI first (late)
    )
    busy_high: float = 0.85  # at or above: GPU-bound when work is pending
    busy_low: float = 0.70  # below: host-bound when work is pending; between: the previous verdict
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
        """Return self, or raise ConfigError naming the first bad key."""
        if not 0.05 <= self.tick_seconds <= 60:
            raise ConfigError(f"tick_seconds must be in [0.05, 60], got {self.tick_seconds}")
        if self.history_seconds < self.tick_seconds:
            raise ConfigError("history_seconds must be at least tick_seconds")
        if self.log_level.lower() not in {"debug", "info", "warning", "error"}:
            raise ConfigError(f"log_level must be debug, info, warning or error, got {self.log_level!r}")
        if self.log_format not in {"auto", "json", "console"}:
            raise ConfigError(f"log_format must be auto, json or console, got {self.log_format!r}")
        if not 0 <= self.web.port <= 65535:
            raise ConfigError(f"web.port must be 0-65535, got {self.web.port}")
        if (self.web.tls_cert_file is None) != (self.web.tls_key_file is None):
            raise ConfigError("web.tls_cert_file and web.tls_key_file go together")
        v = self.verdict
        if not 0 < v.busy_low <= v.busy_high <= 1:
            raise ConfigError("verdict thresholds need 0 < busy_low <= busy_high <= 1")
        if v.window_seconds <= 0 or v.busy_window_seconds <= 0:
            raise ConfigError("verdict windows must be positive (a window shorter than a tick is one tick)")
        if v.busy_source not in {"fresh", "best"}:
            raise ConfigError(f"verdict.busy_source must be fresh or best, got {v.busy_source!r}")
        if v.hold_ticks < 1:
            raise ConfigError("verdict.hold_ticks must be at least 1")
        for url in self.engine.urls:
            if not url.startswith(("http://", "https://", "file://", "/")):
                raise ConfigError(f"engine.urls: {url!r} is not an http(s) URL, file:// URL or path")
        return self

    def as_dict(self) -> dict[str, Any]:
        """Return the configuration as plain data (for --check-config and the status page)."""
        return dataclasses.asdict(self)


def _coerce(value: Any, current: Any, key: str, annotation: str) -> Any:
    """Convert a TOML, env or flag value to the type of the field it sets."""
    if isinstance(value, str):
        if "tuple" in annotation:
            return tuple(part.strip() for part in value.split(",") if part.strip())
        if isinstance(current, bool) or annotation.startswith("bool"):
            lowered = value.strip().lower()
            if lowered in {"1", "true", "yes", "on"}:
                return True
            if lowered in {"0", "false", "no", "off"}:
                return False
            raise ConfigError(f"{key}: expected a boolean, got {value!r}")
        if value.strip().lower() in {"", "none"} and "None" in annotation:
            return None
        try:
            if isinstance(current, int) or annotation.startswith("int"):
                return int(value)
            if isinstance(current, float) or annotation.startswith("float"):
                return float(value)
        except ValueError as exc:
            raise ConfigError(f"{key}: expected a number, got {value!r}") from exc
        return value
    if isinstance(value, list):
        return tuple(value)
    if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _apply(obj: Any, updates: Mapping[str, Any], prefix: str = "") -> Any:
    """Return a copy of a config dataclass with dotted-key updates applied."""
    known = {f.name: f for f in fields(obj)}
    changes: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for key, value in updates.items():
        head, _, rest = key.partition(".")
        if head not in known:
            raise ConfigError(f"unknown configuration key {prefix}{key!r}")
        current = getattr(obj, head)
        if dataclasses.is_dataclass(current):
            if rest:
                nested.setdefault(head, {})[rest] = value
            elif isinstance(value, Mapping):
                nested.setdefault(head, {}).update(value)
            else:
                raise ConfigError(f"{prefix}{key} is a section, not a value")
        else:
            if rest:
                raise ConfigError(f"{prefix}{head} is a value, not a section")
            changes[head] = _coerce(value, current, prefix + key, str(known[head].type))
    for head, sub in nested.items():
        changes[head] = _apply(getattr(obj, head), sub, f"{prefix}{head}.")
    return dataclasses.replace(obj, **changes)


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
    out: dict[str, str] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or name in {"BOUNDWATCH_CONFIG", "BOUNDWATCH_AGENT"}:
            continue
        if name.startswith("BOUNDWATCH_AGENT_") and not name.startswith("BOUNDWATCH_AGENT__"):
            continue  # the in-process agent's own variables (BOUNDWATCH_AGENT_SOCKET, ...)
        key = name[len(ENV_PREFIX) :].lower().replace("__", ".")
        out[key] = value
    return out


def load(
    path: str | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Build the configuration from a TOML file, the environment and flag overrides."""
    cfg = Config()
    environ = os.environ if environ is None else environ
    path = path or environ.get("BOUNDWATCH_CONFIG")
    if path:
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError as exc:
            raise ConfigError(f"config file {path} does not exist") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path}: {exc}") from exc
        cfg = _apply(cfg, _flatten(data))
    cfg = _apply(cfg, env_updates(environ))
    if overrides:
        cfg = _apply(cfg, {k: v for k, v in overrides.items() if v is not None})
    return cfg.validate()
