"""What the in-process CUPTI agents reported, merged per GPU, for one tick."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GpuActivity:
    """GPU activity per device over the windows that closed since the last tick.

    busy_ns is the union of kernel, memcpy, memset and graph intervals of every process on
    the GPU; observed_ns the wall time those windows cover. idle_gap_counts are per bucket
    (not cumulative) over `exporter.catalogue.IDLE_GAP_BUCKETS_SECONDS` plus +Inf.
    """

    gpu: int  # NVML index
    uuid: str
    observed_ns: int
    busy_ns: int
    graph_busy_ns: int = 0
    kernels: int = 0
    memcpys: int = 0
    memsets: int = 0
    graphs: int = 0
    dropped: int = 0
    idle_gap_counts: tuple[int, ...] = field(default=())
    idle_gap_sum_ns: int = 0


@dataclass(frozen=True)
class AgentState:
    """One agent process as last heard from (no pid is exported; it is kept for merging)."""

    pid: int
    gpu: int
    state: str  # running | preempted | unavailable | stale
    detail: str = ""
    role: str = ""  # vllm_worker, sglang_scheduler, generic


@dataclass(frozen=True)
class EngineSteps:
    """Engine steps counted and timed inside an engine by the agent, since the last tick."""

    engine: str
    steps: int
    wall_ns: int
    gpu_busy_ns: int
    step_wall_ns: tuple[int, ...] = field(default=())  # individual step times, bounded


@dataclass(frozen=True)
class AgentReading:
    """Everything the agents reported since the last tick."""

    activity: tuple[GpuActivity, ...] = field(default=())
    agents: tuple[AgentState, ...] = field(default=())
    steps: tuple[EngineSteps, ...] = field(default=())
    messages: int = 0
    bad_messages: int = 0
