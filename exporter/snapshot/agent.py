"""What the in-process agents reported for one tick: raw per-process windows, and their union per GPU.

The agent feed hands out each process's windows as received (`AgentReading.windows`);
`exporter.analysis.agent_union` merges them per GPU into `AgentReading.activity`, carrying what
the next tick's union needs in `AgentReading.union`, so `replay` recomputes the union too.
"""

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
class AgentWindow:
    """One agent process's window on one GPU as received (bounded by the feed, not merged)."""

    pid: int
    t0: int  # window start, CLOCK_REALTIME ns (windows align across processes)
    t1: int
    busy_ns: int  # the process's own busy union
    graph_busy_ns: int = 0
    kernels: int = 0
    memcpys: int = 0
    memsets: int = 0
    graphs: int = 0
    dropped: int = 0
    gap_counts: tuple[int, ...] = field(default=())  # the process's own idle gaps (exporter.wire.Window.gaps)
    gap_sum_ns: int = 0
    iv: tuple[int, ...] = field(default=())  # busy intervals, packed (exporter.wire.pack_intervals)
    slack_ns: int = 0  # idle ns the packing filled


@dataclass(frozen=True)
class GpuWindows:
    """One GPU's windows that every running process sent (or that waited long enough), and its agents."""

    gpu: int  # the feed's stable index of the GPU's key (its UUID, else the CUDA ordinal)
    uuid: str  # as the agents report it ('' when none)
    running: int = 0  # agents running on this GPU now
    windows: tuple[AgentWindow, ...] = field(default=())  # ready to merge this tick, any order


@dataclass(frozen=True)
class UnionState:
    """What the union on one GPU carries to the next tick (computed by exporter.analysis.agent_union)."""

    gpu: int  # as in GpuWindows
    uuid: str
    last_end_ns: int | None = None  # where merged activity last ended (idle gaps across windows)
    last_window_busy_ns: int = 0  # the newest merged window, kept while the agents live
    last_window_ns: int = 0


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
    stale_steps: int = 0  # step records the light agent dropped as too old to send (a long stop)
    settings_rejected: int = 0  # its settings out of bounds, defaults used (the detail names them)
    # the GPU a light agent's graph counts name (its process's CUDA device): a light agent sends no
    # windows, so `uuid` stays ''; this places the agent's metrics and, where NVML's process lists and
    # CUDA_VISIBLE_DEVICES cannot, its engine (pipeline.place_engine)
    graphs_uuid: str = ""

    @property
    def device_uuid(self) -> str:
        """Return the UUID of the agent's GPU: its windows' device, else the one its graph counts name ('')."""
        return self.uuid or self.graphs_uuid


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
    graph_steps: int = (
        0  # steps that ran in a CUDA graph (vLLM FULL/PIECEWISE, SGLang can_run_graph, replays seen)
    )
    eager_steps: int = 0  # steps that ran without a CUDA graph
    running: float | None = None  # the scheduler's running requests after the newest step
    waiting: float | None = None  # the scheduler's waiting requests after the newest step
    running_seconds: float = 0.0  # running requests integrated over the steps' span (request-seconds)
    waiting_seconds: float = 0.0  # waiting requests integrated likewise
    max_num_seqs: int | None = (
        None  # the engine's batch limit (vLLM max_num_seqs, SGLang max running requests)
    )
    dp_rank: int | None = None  # data-parallel rank of the engine core, where it has one


@dataclass(frozen=True)
class GraphUse:
    """CUDA-graph use seen by the light agent (Python hooks, no CUPTI) in one process since the last tick."""

    pid: int  # the agent process (never a label)
    gpu: int  # CUDA ordinal of the process's device as the agent reports it, -1 when unknown (resolve uuid)
    observed_ns: int  # wall time these counts cover
    replays: int = 0  # torch.cuda.CUDAGraph.replay calls (pieces, not steps, under vLLM PIECEWISE)
    captures: int = 0  # graphs captured in the process so far (cumulative)
    uuid: str = ""  # the device's GPU UUID, '' until CUDA is initialised in the process
    # the wall time (unix ns) these counts cover, first to last: the messages' [t0, t1], or a quiet
    # agent's ticks; 0 in recordings made before it was kept. What replays over the page's steps
    # compares: steps at a time no count covers yet are not known to have replayed nothing.
    since_ns: int = 0
    until_ns: int = 0


@dataclass(frozen=True)
class AgentReading:
    """Everything the agents reported since the last tick (activity and union: computed in analysis)."""

    activity: tuple[GpuActivity, ...] = field(default=())  # merged per GPU (older recordings: by the feed)
    agents: tuple[AgentState, ...] = field(default=())
    steps: tuple[EngineSteps, ...] = field(default=())
    graphs: tuple[GraphUse, ...] = field(default=())
    messages: int = 0
    bad_messages: int = 0
    refused: tuple[tuple[str, int], ...] = field(default=())  # (reason, count), every reason
    windows: tuple[GpuWindows, ...] = field(default=())  # raw, per GPU: what the union merges
    union: tuple[UnionState, ...] = field(default=())  # carried from tick to tick by the union
