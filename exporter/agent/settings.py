"""Agent settings from BOUNDWATCH_AGENT_* variables, and which mode the agent runs in.

Stdlib only: the light agent imports this and never the CUPTI modules.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields
from typing import Any

from exporter import wire

MODES = ("light", "cupti")


def mode_from_env() -> str:
    """Return the mode BOUNDWATCH_AGENT asks for: 'cupti' for =cupti, else 'light' (=1, =now, unset)."""
    value = os.environ.get("BOUNDWATCH_AGENT", "").strip().lower()
    return "cupti" if value == "cupti" else "light"


def resolve_mode(mode: str | None, settings: dict[str, Any]) -> str:
    """Return 'light' or 'cupti' from an explicit mode, the legacy cupti=False flag, or the environment."""
    if mode is not None:
        m = str(mode).strip().lower()
        return "cupti" if m == "cupti" else "light"
    if settings.get("cupti") is False:
        return "light"
    return mode_from_env()


ENV = "BOUNDWATCH_AGENT_"


def _env(name: str, default: str) -> str:
    return os.environ.get(ENV + name, default).strip()


def _envf(name: str, default: float) -> float:
    raw = _env(name, str(default))
    if raw.lower() == "never":
        return math.inf  # what UNBOUNDED settings take for "never"; any other setting rejects it
    try:
        return float(raw)
    except ValueError:
        return math.nan  # not a number: from_env's bounds give it its default and name it rejected


def _envi(name: str, default: int) -> int:
    value = _envf(name, default)
    return int(value) if math.isfinite(value) else -1  # -1: below every integer setting's bounds


@dataclass
class Settings:
    """Agent settings, from BOUNDWATCH_AGENT_* variables."""

    socket: str = ""
    role: str = "generic"
    mode: str = "light"  # light: Python hooks only, no CUPTI | cupti: the deep mode (also keeps the hooks)
    window_s: float = 0.5
    flush_s: float = 0.5
    # light hooks on the steps' path are in for this share of each flush_s and out between; counts
    # are scaled to the tick (exporter.agent.switch). 1 keeps them in: every step counted and timed.
    hook_share: float = 0.125
    # on: the engine's own step swaps the sampled hooks and runs the tick inline, so the agent's thread
    # does not wake while the engine steps (exporter.agent.switch) | off: the agent's thread swaps
    inline: str = "on"
    # once the engine's own step drives fast (switch.FAST_STEP_NS), the agent's thread sleeps until no
    # step has driven for this long (then it ticks once and goes quiet): it takes no GIL from an engine
    # that stopped stepping and spins | never (inf, the default): it sleeps until the engine steps again,
    # whose own step then sends what was counted before the stop | 0: it wakes a margin past each
    # missed swap, as for a slow engine
    idle_wake_s: float = math.inf
    # a quiet agent says so again this often (one wake-up of its thread, a GIL take of ~0.1-0.2 ms from
    # the engine's, and one small send), so that a sidecar (re)started while the engine idles finds it
    # before the engine steps again | 0 (the default): no beat; the sidecar reads an agent that went
    # silent while its process lives as quiet (its messages' silent_ms), so only a sidecar started
    # during the idle waits for the first step to learn of the agent
    quiet_beat_s: float = 0.0
    lag_s: float = 1.0
    lag_max_s: float = 3.0  # windows wait up to this long for records that arrive late (core._hold_ns)
    buffer_kib: int = 1024  # raw mode copies a buffer in ~0.1 ms; object mode needs <= 256 KiB
    max_buffers: int = 32  # 32 MiB of host buffers at most
    batch_mib: int = 1  # buffers decoded together (joining larger batches held the GIL for ms)
    max_queued_mib: float = 64.0
    decode: str = "raw"  # raw (ctypes + numpy) | objects (cupti-python record objects) | null (discard)
    kernels: str = "on"  # off: never enable CONCURRENT_KERNEL (graphs, memcpy and memset only)
    kinds: str = "kernel,memcpy,memset,graph"  # activity kinds to collect
    sample_kinds: str = "kernel"  # what sampling switches off: kernel, or all (every kind but GRAPH_TRACE)
    graph_trace: str = "auto"  # auto: on only if CUDA is not initialised yet | on | off
    sampling: str = "off"  # off | auto | on (measured on the H200: see exporter/agent/README.md)
    sample_above: float = 20000.0  # eager kernel records per second that turn auto sampling on
    sample_on_s: float = 1.0
    sample_period_s: float = 10.0
    kernel_trim_ns: int = 680  # CUPTI kernel records are ~680 ns longer than the kernel (H200)
    cupti: bool = True  # core.Agent only: False counts engine steps without CUPTI (use mode="light")
    cupti_attrs: str = ""  # CUPTI activity attributes, 'name=value,...' (device buffer size, pinned memory)
    hw_trace: str = "off"  # on: ask CUPTI for hardware event tracing (Blackwell and later; refused elsewhere)
    rejected: tuple[str, ...] = ()  # settings that were out of BOUNDS (or not numbers): their defaults serve

    @classmethod
    def from_env(cls, **overrides: Any) -> Settings:
        """Return settings from the environment, with keyword overrides."""
        s = cls(
            socket=_env("SOCKET", "") or wire.default_agent_socket(),
            role=_env("ROLE", "generic"),
            mode=mode_from_env(),
            window_s=_envf("WINDOW_S", 0.5),
            flush_s=_envf("FLUSH_S", 0.5),
            hook_share=_envf("HOOK_SHARE", 0.125),
            inline=_env("INLINE", "on"),
            idle_wake_s=_envf("IDLE_WAKE_S", math.inf),
            quiet_beat_s=_envf("QUIET_BEAT_S", 0.0),
            lag_s=_envf("LAG_S", 1.0),
            lag_max_s=_envf("LAG_MAX_S", 3.0),
            buffer_kib=_envi("BUFFER_KIB", 1024),
            max_buffers=_envi("MAX_BUFFERS", 32),
            kernels=_env("KERNELS", "on"),
            kinds=_env("KINDS", "kernel,memcpy,memset,graph"),
            sample_kinds=_env("SAMPLE_KINDS", "kernel"),
            decode=_env("DECODE", "raw"),
            graph_trace=_env("GRAPH_TRACE", "auto"),
            sampling=_env("SAMPLING", "off"),
            sample_above=_envf("SAMPLE_ABOVE", 20000.0),
            sample_on_s=_envf("SAMPLE_ON_S", 1.0),
            sample_period_s=_envf("SAMPLE_PERIOD_S", 10.0),
            kernel_trim_ns=_envi("KERNEL_TRIM_NS", 680),
            cupti_attrs=_env("CUPTI_ATTRS", ""),
            hw_trace=_env("HW_TRACE", "off"),
        )
        for key, value in overrides.items():
            if value is not None:
                setattr(s, key, value)
        s.rejected = tuple(_bound(s))
        return s

    def rejected_detail(self) -> str:
        """Return the agent's detail line for rejected settings ('' when none were)."""
        if not self.rejected:
            return ""
        return ("settings out of bounds, defaults used: " + ",".join(self.rejected))[:400]


# What a numeric setting may be (inclusive); a value outside, or not a finite number, gets its default,
# so a typo in the engine's environment cannot make the agent spin, stall or take unbounded memory.
BOUNDS: dict[str, tuple[float, float]] = {
    "window_s": (0.05, 60.0),
    "flush_s": (0.05, 60.0),
    "hook_share": (0.01, 1.0),
    "idle_wake_s": (0.0, 3600.0),  # or inf: never (UNBOUNDED)
    "quiet_beat_s": (0.0, 86400.0),
    "lag_s": (0.0, 60.0),
    "lag_max_s": (0.0, 600.0),
    "buffer_kib": (8, 65536),
    "max_buffers": (1, 1024),
    "batch_mib": (1, 256),
    "max_queued_mib": (1.0, 4096.0),
    "sample_above": (0.0, 1e9),
    "sample_on_s": (0.01, 3600.0),
    "sample_period_s": (0.1, 86400.0),
    "kernel_trim_ns": (0, 100_000),
}


# numeric settings that may also be infinite: "never" (or "inf")
UNBOUNDED: frozenset[str] = frozenset({"idle_wake_s"})

# settings that take one of a few words: another value gets the default, counted as rejected
CHOICES: dict[str, tuple[str, ...]] = {"inline": ("on", "off")}


def _bound(s: Settings) -> list[str]:
    """Reset each numeric setting outside BOUNDS, or word outside CHOICES, to its default; return the names reset."""
    reset = []
    for name, allowed in CHOICES.items():
        if getattr(s, name) not in allowed:
            setattr(s, name, next(f.default for f in fields(s) if f.name == name))
            reset.append(name)
    for f in fields(s):
        if f.name not in BOUNDS:
            continue
        lo, hi = BOUNDS[f.name]
        value = getattr(s, f.name)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if f.name in UNBOUNDED and value == math.inf:
            continue
        if not (ok and lo <= value <= hi):
            setattr(s, f.name, f.default)
            reset.append(f.name)
    return reset
