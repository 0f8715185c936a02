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
    last_window_busy_ns: int = 0  # the newest window alone, for the busy-ratio gauge
    last_window_ns: int = 0
    processes: int = 1  # agents whose windows were merged (>1: a cross-process union)


@dataclass(frozen=True)
class AgentState:
    """One agent process as last heard from (no pid is exported; it is kept for merging)."""

    pid: int
    gpu: int  # CUDA ordinal of the agent's first device (-1: none yet); resolve uuid for the NVML index
    state: str  # running | preempted | unavailable | stale
    detail: str = ""
    role: str = ""  # vllm_worker, vllm_engine, sglang_scheduler, generic
    uuid: str = ""
    lib: str = ""  # which libcupti / cupti-python the agent found
    mode: str = ""  # raw|objects [+graph_trace] [+sampling], or steps
    dropped_messages: int = 0  # datagrams the agent could not send


@dataclass(frozen=True)
class EngineSteps:
    """Engine steps counted and timed inside an engine by the agent, since the last tick."""

    engine: str
    steps: int
    wall_ns: int
    gpu_busy_ns: int
    step_wall_ns: tuple[int, ...] = field(default=())  # individual step times, bounded
    step_hist: tuple[int, ...] = field(default=())  # per STEP_BUCKETS_SECONDS (+Inf last), non-cumulative
    tokens: int = 0  # scheduled tokens over the steps
    seqs: int = 0  # scheduled sequences summed over the steps (mean batch = seqs / steps)
    gpu_measured: bool = True  # False: CUPTI ran in other processes (vLLM mp executor), gpu_busy_ns is 0
    # Light-agent figures (no CUPTI needed), counted in the engine's own process:
    pid: int = 0  # the agent process that counted them (joins to EngineReading.pids; never a label)
    graph_steps: int = 0  # steps that ran in a CUDA graph (vLLM FULL/PIECEWISE, SGLang can_run_graph, replays seen)
    eager_steps: int = 0  # steps that ran without a CUDA graph
    running: float | None = None  # the scheduler's running requests after the newest step
    waiting: float | None = None  # the scheduler's waiting requests after the newest step
    running_seconds: float = 0.0  # running requests integrated over the steps' span (request-seconds)
    waiting_seconds: float = 0.0  # waiting requests integrated likewise
    max_num_seqs: int | None = None  # the engine's batch limit (vLLM max_num_seqs, SGLang max running requests)
    dp_rank: int | None = None  # data-parallel rank of the engine core, where it has one


@dataclass(frozen=True)
class GraphUse:
    """CUDA-graph use seen by the light agent (Python hooks, no CUPTI) in one process since the last tick."""

    pid: int  # the agent process (never a label)
    gpu: int  # NVML index of the process's device, -1 when unknown
    observed_ns: int  # wall time these counts cover
    replays: int = 0  # torch.cuda.CUDAGraph.replay calls (pieces, not steps, under vLLM PIECEWISE)
    captures: int = 0  # graphs captured in the process so far (cumulative)


@dataclass(frozen=True)
class AgentReading:
    """Everything the agents reported since the last tick."""

    activity: tuple[GpuActivity, ...] = field(default=())
    agents: tuple[AgentState, ...] = field(default=())
    steps: tuple[EngineSteps, ...] = field(default=())
    graphs: tuple[GraphUse, ...] = field(default=())
    messages: int = 0
    bad_messages: int = 0
