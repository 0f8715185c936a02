"""The metric catalogue: every name boundwatch exports, with its type, help and labels.

Each entry is a module constant (`catalogue.GPU_POWER_WATTS`) that export code names, so a
misspelt one fails at import and in mypy, not at a scrape; no name is defined twice (checked at
import). README tables, dashboards and alert rules are checked against this table by tests, and
`family()` builds every metric family from it, so a name cannot drift from its definition.
Names follow Prometheus naming: `boundwatch_` prefix, base units, `_total` on counters,
ratios 0-1 with `_ratio`, bounded label values only (no pid, no hostname, no request id).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)

Kind = Literal["gauge", "counter", "histogram", "info"]


@dataclass(frozen=True)
class MetricSpec:
    """One exported metric family."""

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    area: str = "self"

    @property
    def exposed_names(self) -> tuple[str, ...]:
        """Return the sample names this family exposes in the text format."""
        if self.kind == "histogram":
            return (f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")
        if self.kind == "info":
            return (f"{self.name}_info",) if not self.name.endswith("_info") else (self.name,)
        return (self.name,)


_DEFINED: list[MetricSpec] = []


def _m(name: str, kind: Kind, help_: str, labels: Sequence[str] = (), area: str = "self") -> MetricSpec:
    if any(s.name == name for s in _DEFINED):
        raise ValueError(f"metric {name} is defined twice in the catalogue")
    if not name.startswith("boundwatch_") or (kind == "counter") != name.endswith("_total"):
        raise ValueError(f"metric {name}: boundwatch_ prefix, and _total on counters only")
    _DEFINED.append(MetricSpec(name, kind, help_, tuple(labels), area))
    return _DEFINED[-1]


# --- the exporter itself ---------------------------------------------------------------
BUILD_INFO = _m("boundwatch_build_info", "gauge", "Build information; always 1.", ["version", "python"])
SOURCE_UP = _m(
    "boundwatch_source_up",
    "gauge",
    "Whether the last read of a source succeeded (1) or not (0).",
    ["source"],
)
SOURCE_ERRORS_TOTAL = _m("boundwatch_source_errors_total", "counter", "Failed reads of a source.", ["source"])
SOURCE_OVER_BOUND = _m(
    "boundwatch_source_over_bound",
    "gauge",
    "What a source found at its last read beyond its bounds and left unread: for engine, processes that look "
    "like engines past the 32 read at once (those started last), and an engine's API servers past 64, "
    "processes past 512 and cgroups past 16, its command line cut at 64 KiB or 1,024 words and its "
    "processes' environments cut at 256 KiB (what was cut is not read); 0 normally.",
    ["source"],
)
SOURCE_DURATION_SECONDS = _m(
    "boundwatch_source_duration_seconds", "gauge", "Wall time of the last read of a source.", ["source"]
)
TICKS_TOTAL = _m("boundwatch_ticks_total", "counter", "Sampling ticks completed.")
TICK_INTERVAL_SECONDS = _m(
    "boundwatch_tick_interval_seconds", "gauge", "Configured time between sampling ticks."
)
SNAPSHOT_AGE_SECONDS = _m(
    "boundwatch_snapshot_age_seconds", "gauge", "Age of the snapshot this scrape rendered."
)
HTTP_CONNECTIONS = _m("boundwatch_http_connections", "gauge", "HTTP connections open now.")
HTTP_REFUSED_TOTAL = _m(
    "boundwatch_http_refused_total",
    "counter",
    "HTTP connections and requests refused, by cause: connection_limit, header_timeout, "
    "tls_handshake, idle_evicted (an idle kept-alive connection closed at the cap for a new one), "
    "write_timeout (a client that stopped reading its answer), bad_request (malformed HTTP), "
    "auth_failed, auth_rate_limited.",
    ["cause"],
)
RENDER_ERRORS_TOTAL = _m(
    "boundwatch_render_errors_total",
    "counter",
    "Scrapes in which a metric family failed to render and was left out (the other families were served).",
    ["family"],
)
# --- GPU, from NVML --------------------------------------------------------------------
GPU_INFO = _m(
    "boundwatch_gpu_info", "gauge", "GPU identity; always 1.", ["gpu", "uuid", "name", "driver"], "gpu"
)
GPU_POWER_WATTS = _m("boundwatch_gpu_power_watts", "gauge", "Power draw.", ["gpu"], "gpu")
GPU_POWER_LIMIT_WATTS = _m(
    "boundwatch_gpu_power_limit_watts", "gauge", "Enforced power limit.", ["gpu"], "gpu"
)
GPU_ENERGY_JOULES_TOTAL = _m(
    "boundwatch_gpu_energy_joules_total",
    "counter",
    "Energy consumed since the driver loaded.",
    ["gpu"],
    "gpu",
)
GPU_SM_CLOCK_HERTZ = _m("boundwatch_gpu_sm_clock_hertz", "gauge", "Current SM clock.", ["gpu"], "gpu")
GPU_SM_CLOCK_MAX_HERTZ = _m("boundwatch_gpu_sm_clock_max_hertz", "gauge", "Maximum SM clock.", ["gpu"], "gpu")
GPU_CLOCK_EVENT_REASON = _m(
    "boundwatch_gpu_clock_event_reason",
    "gauge",
    "Whether a clock-event (throttle) reason is active (1) or not (0).",
    ["gpu", "reason"],
    "gpu",
)
GPU_UTILIZATION_RATIO = _m(
    "boundwatch_gpu_utilization_ratio",
    "gauge",
    "NVML utilization.gpu: share of the last sample period with any kernel running (counts a 1-SM kernel as busy).",
    ["gpu"],
    "gpu",
)
GPU_GRAPHICS_ACTIVE_RATIO = _m(
    "boundwatch_gpu_graphics_active_ratio",
    "gauge",
    "GPM GRAPHICS_UTIL: graphics engine active (on a busy GPU estimated from SM_UTIL on ticks where no verdict "
    "could turn on it; see boundwatch_gpu_graphics_active_estimated).",
    ["gpu"],
    "gpu",
)
GPU_GRAPHICS_ACTIVE_ESTIMATED = _m(
    "boundwatch_gpu_graphics_active_estimated",
    "gauge",
    "1 where this tick's GPM GRAPHICS_UTIL is estimated (SM_UTIL times the graphics / SM ratio of its last read), "
    "0 where it was read.",
    ["gpu"],
    "gpu",
)
GPU_SM_ACTIVE_RATIO = _m(
    "boundwatch_gpu_sm_active_ratio",
    "gauge",
    "GPM SM_UTIL: SMs with at least one warp resident.",
    ["gpu"],
    "gpu",
)
GPU_SM_OCCUPANCY_RATIO = _m(
    "boundwatch_gpu_sm_occupancy_ratio",
    "gauge",
    "GPM SM_OCCUPANCY: resident warps over the maximum.",
    ["gpu"],
    "gpu",
)
GPU_TENSOR_ACTIVE_RATIO = _m(
    "boundwatch_gpu_tensor_active_ratio",
    "gauge",
    "GPM ANY_TENSOR_UTIL: tensor pipes active.",
    ["gpu"],
    "gpu",
)
GPU_DRAM_ACTIVE_RATIO = _m(
    "boundwatch_gpu_dram_active_ratio",
    "gauge",
    "GPM DRAM_BW_UTIL: memory bandwidth used.",
    ["gpu"],
    "gpu",
)
GPU_MEMORY_USED_BYTES = _m(
    "boundwatch_gpu_memory_used_bytes", "gauge", "Device memory in use.", ["gpu"], "gpu"
)
GPU_MEMORY_TOTAL_BYTES = _m(
    "boundwatch_gpu_memory_total_bytes", "gauge", "Device memory in total.", ["gpu"], "gpu"
)
# --- GPU busy time: CUPTI where an agent runs, else GPM, else NVML ---------------------
GPU_BUSY_RATIO = _m(
    "boundwatch_gpu_busy_ratio",
    "gauge",
    "Busy share of the GPU over the last window, from the best source available (label source).",
    ["gpu", "source"],
    "busy",
)
GPU_BUSY_SECONDS_TOTAL = _m(
    "boundwatch_gpu_busy_seconds_total",
    "counter",
    "GPU busy time by source: cupti = union of kernel, memcpy, memset and graph intervals; gpm / nvml = "
    "ratio integrated over ticks.",
    ["gpu", "source"],
    "busy",
)
GPU_OBSERVED_SECONDS_TOTAL = _m(
    "boundwatch_gpu_observed_seconds_total",
    "counter",
    "Wall time that boundwatch_gpu_busy_seconds_total covers, by source (divide rates for a busy ratio).",
    ["gpu", "source"],
    "busy",
)
GPU_GRAPH_BUSY_SECONDS_TOTAL = _m(
    "boundwatch_gpu_graph_busy_seconds_total",
    "counter",
    "GPU time inside CUDA-graph launches (span of each graph launch, so an upper bound).",
    ["gpu"],
    "busy",
)
GPU_IDLE_GAP_SECONDS = _m(
    "boundwatch_gpu_idle_gap_seconds",
    "histogram",
    "Idle gaps between GPU activity longer than 1 ms, from CUPTI.",
    ["gpu"],
    "busy",
)
GPU_ACTIVITY_RECORDS_TOTAL = _m(
    "boundwatch_gpu_activity_records_total",
    "counter",
    "CUPTI activity records processed by kind (kernel, memcpy, memset, graph).",
    ["gpu", "kind"],
    "busy",
)
AGENT_DROPPED_RECORDS_TOTAL = _m(
    "boundwatch_agent_dropped_records_total",
    "counter",
    "CUPTI records the agents dropped.",
    ["gpu"],
    "busy",
)
AGENTS = _m(
    "boundwatch_agents",
    "gauge",
    "In-process agents reporting, by state (running, quiet: alive with nothing to report, preempted, unavailable, stale).",
    ["gpu", "state"],
    "busy",
)
AGENT_SETTINGS_REJECTED = _m(
    "boundwatch_agent_settings_rejected",
    "gauge",
    "BOUNDWATCH_AGENT_* settings the in-process agents found out of bounds or not a number (their "
    "defaults serve; the agent's detail names them), summed over the agents on each GPU.",
    ["gpu"],
    "busy",
)
AGENT_UNSENT_MESSAGES = _m(
    "boundwatch_agent_unsent_messages",
    "gauge",
    "Messages the in-process agents could not send since each started (the sidecar's socket queue "
    "full, or no sidecar listening), summed over the agents on each GPU; they drop rather than block.",
    ["gpu"],
    "busy",
)
AGENT_STALE_STEPS = _m(
    "boundwatch_agent_stale_steps",
    "gauge",
    "Engine step records (an engine core's steps over one agent tick) the light agents counted before a "
    "stop of over 300 s and dropped as stale when the engine stepped again (the sidecar would refuse "
    "them), summed over the agents on each GPU (the label empty for agents whose process has no CUDA "
    "device, as vLLM's EngineCore).",
    ["gpu"],
    "busy",
)
AGENT_MESSAGES_TOTAL = _m(
    "boundwatch_agent_messages_total", "counter", "Agent messages received.", [], "busy"
)
AGENT_BAD_MESSAGES_TOTAL = _m(
    "boundwatch_agent_bad_messages_total",
    "counter",
    "Agent messages rejected (bad version or format).",
    [],
    "busy",
)
AGENT_REFUSED_TOTAL = _m(
    "boundwatch_agent_refused_total",
    "counter",
    "Agent datagrams, windows, step records or graph counts refused, by reason: peer (sender not allowed), "
    "agents, devices, gpus or engines (over a bound), clock (end far from now: a window, steps, or graph "
    "counts, whose coverage is then unknown), overlap (replayed or "
    "overlapping), limits (over a physical limit, or an agent's step records past 64 a tick), backlog "
    "(too many windows waiting), inbox "
    "(datagrams dropped while the event loop did not read them).",
    ["reason"],
    "busy",
)
# --- engine (vLLM / SGLang) ------------------------------------------------------------
ENGINE_INFO = _m(
    "boundwatch_engine_info",
    "gauge",
    "Engine identity; always 1. The model is the one its page names, held while the same processes "
    "serve until a new name has read the same for 30 s.",
    ["engine", "kind", "model"],
    "engine",
)
ENGINE_UP = _m(
    "boundwatch_engine_up",
    "gauge",
    "Whether the last read of an engine's metrics succeeded (1) or not (0); its figures are dropped while 0.",
    ["engine"],
    "engine",
)
ENGINE_REQUESTS_RUNNING = _m(
    "boundwatch_engine_requests_running",
    "gauge",
    "Requests the engine scheduler is running.",
    ["engine"],
    "engine",
)
ENGINE_REQUESTS_WAITING = _m(
    "boundwatch_engine_requests_waiting",
    "gauge",
    "Requests waiting in the engine scheduler.",
    ["engine"],
    "engine",
)
ENGINE_RUNNING_REQUEST_SECONDS_TOTAL = _m(
    "boundwatch_engine_running_request_seconds_total",
    "counter",
    "Running requests integrated over time; rate() is the mean number running.",
    ["engine"],
    "engine",
)
ENGINE_WAITING_REQUEST_SECONDS_TOTAL = _m(
    "boundwatch_engine_waiting_request_seconds_total",
    "counter",
    "Waiting requests integrated over time; rate() is the mean number waiting.",
    ["engine"],
    "engine",
)
ENGINE_KV_CACHE_USAGE_RATIO = _m(
    "boundwatch_engine_kv_cache_usage_ratio", "gauge", "KV-cache usage.", ["engine"], "engine"
)
ENGINE_PROMPT_TOKENS_TOTAL = _m(
    "boundwatch_engine_prompt_tokens_total", "counter", "Prompt tokens processed.", ["engine"], "engine"
)
ENGINE_GENERATION_TOKENS_TOTAL = _m(
    "boundwatch_engine_generation_tokens_total",
    "counter",
    "Generation tokens produced.",
    ["engine"],
    "engine",
)
ENGINE_PREEMPTIONS_TOTAL = _m(
    "boundwatch_engine_preemptions_total",
    "counter",
    "Requests preempted (vLLM) or retracted (SGLang).",
    ["engine"],
    "engine",
)
ENGINE_STEPS_TOTAL = _m(
    "boundwatch_engine_steps_total",
    "counter",
    "Engine steps; method says how they were counted (agent = exact, from inside the engine; "
    "lower_bound = at least this many, from vLLM's iteration_tokens_total, which counts only steps "
    "with output; upper_bound = at most this many steps with output, with several API servers; "
    "forward_passes = SGLang's cuda_graph_passes_total of each DP group; dp_attention_steps = "
    "SGLang's dp_attention_steps_total, every DP rank).",
    ["engine", "method"],
    "engine",
)
ENGINE_STEP_SECONDS = _m(
    "boundwatch_engine_step_seconds",
    "histogram",
    "Wall time of engine steps, timed inside the engine by the agent.",
    ["engine"],
    "engine",
)
ENGINE_STEP_GPU_SECONDS_TOTAL = _m(
    "boundwatch_engine_step_gpu_seconds_total",
    "counter",
    "GPU busy time inside engine steps, from the agent.",
    ["engine"],
    "engine",
)
ENGINE_API_SERVERS = _m(
    "boundwatch_engine_api_servers",
    "gauge",
    "API-server processes feeding the engine.",
    ["engine"],
    "engine",
)
ENGINE_SPEC_DECODE_ACCEPTANCE_RATIO = _m(
    "boundwatch_engine_spec_decode_acceptance_ratio",
    "gauge",
    "Accepted over proposed draft tokens, over the last window.",
    ["engine"],
    "engine",
)
API_SERVER_CPU_RATIO = _m(
    "boundwatch_api_server_cpu_ratio",
    "gauge",
    "CPU of the busiest thread of an API-server process over the last tick (1 = one core saturated).",
    ["engine", "server"],
    "engine",
)
API_SERVER_PROCESS_CPU_RATIO = _m(
    "boundwatch_api_server_process_cpu_ratio",
    "gauge",
    "CPU of an API-server process, all threads, over the last tick, in cores.",
    ["engine", "server"],
    "engine",
)
API_SERVER_SATURATED_SECONDS_TOTAL = _m(
    "boundwatch_api_server_saturated_seconds_total",
    "counter",
    "Time during which an API server's busiest thread was saturated.",
    ["engine", "server"],
    "engine",
)
ENGINE_PAGE_REFUSED_TOTAL = _m(
    "boundwatch_engine_page_refused_total",
    "counter",
    "What reads of an engine's page or multiprocess files lost, by reason: nan, infinite, negative, "
    "too_large (values refused, never used); bytes, lines (reads cut at the byte or line budget), "
    "files (multiprocess files over the count budget, or not regular files); label (samples whose labels were cut); "
    "undecodable (bytes that were not UTF-8, replaced); unparsable (reads the parser refused whole); "
    "model (reads naming another model while the same processes serve, held 30 s before it is served).",
    ["engine", "reason"],
    "engine",
)
ENGINE_FLAGS_REFUSED = _m(
    "boundwatch_engine_flags_refused",
    "gauge",
    "Values of the engine's CUDA-graph flags on its command line that could not be read (bad JSON, a bad "
    "number) and were ignored; 0 when every one was read.",
    ["engine"],
    "engine",
)
ENGINE_SCRAPE_DURATION_SECONDS = _m(
    "boundwatch_engine_scrape_duration_seconds",
    "gauge",
    "Wall time of the last engine metrics read.",
    ["engine"],
    "engine",
)
ENGINE_COUNTS_SOURCE = _m(
    "boundwatch_engine_counts_source",
    "gauge",
    "Where the engine's running and waiting requests (and their request-seconds) come from, one-hot over "
    "agent (the engine cores' scheduler counts, sent by the in-process agent) and page (the engine's "
    "metrics page).",
    ["engine", "source"],
    "engine",
)
ENGINE_PAGE_AGE_SECONDS = _m(
    "boundwatch_engine_page_age_seconds",
    "gauge",
    "Age of the page figures served (tokens, KV cache, model): 0 when read this tick; while an agent "
    "counts the engine its page is read every engine.slow_read_seconds.",
    ["engine"],
    "engine",
)
# --- host and cgroups ------------------------------------------------------------------
HOST_CPUS = _m("boundwatch_host_cpus", "gauge", "Logical CPUs on the host.", [], "host")
HOST_CPU_RATIO = _m(
    "boundwatch_host_cpu_ratio", "gauge", "Host CPU busy over the last tick, 0-1 of all CPUs.", [], "host"
)
CGROUP_CPU_QUOTA_CORES = _m(
    "boundwatch_cgroup_cpu_quota_cores",
    "gauge",
    "Effective CPU quota of a cgroup in cores, the smallest on its path to the root (absent when unlimited).",
    ["cgroup"],
    "host",
)
CGROUP_CPU_USAGE_SECONDS_TOTAL = _m(
    "boundwatch_cgroup_cpu_usage_seconds_total",
    "counter",
    "CPU time used by a cgroup.",
    ["cgroup"],
    "host",
)
CGROUP_CPU_THROTTLED_SECONDS_TOTAL = _m(
    "boundwatch_cgroup_cpu_throttled_seconds_total",
    "counter",
    "Time a cgroup's tasks were throttled by its effective CPU quota (counted where that quota is set: an ancestor's where it binds).",
    ["cgroup"],
    "host",
)
CGROUP_CPU_THROTTLED_PERIODS_TOTAL = _m(
    "boundwatch_cgroup_cpu_throttled_periods_total",
    "counter",
    "Quota periods in which a cgroup was throttled (counted where its effective quota is set).",
    ["cgroup"],
    "host",
)
CGROUP_CPU_PERIODS_TOTAL = _m(
    "boundwatch_cgroup_cpu_periods_total",
    "counter",
    "Quota periods elapsed for a cgroup (counted where its effective quota is set).",
    ["cgroup"],
    "host",
)
# --- the verdict -----------------------------------------------------------------------
BOUND = _m(
    "boundwatch_bound",
    "gauge",
    "Current verdict per GPU, one-hot over idle, gpu, host and unknown.",
    ["gpu", "verdict"],
    "verdict",
)
BOUND_REASON = _m(
    "boundwatch_bound_reason",
    "gauge",
    "Reasons behind a host-bound or unknown verdict, one series per reason (1 = applies).",
    ["gpu", "reason"],
    "verdict",
)
BOUND_BUSY_RATIO = _m(
    "boundwatch_bound_busy_ratio",
    "gauge",
    "The busy share the verdict held against its thresholds this tick, and its source (cupti, gpm, nvml): "
    "may differ from boundwatch_gpu_busy_ratio, which shows the best figure (CUPTI, 1-2 s late).",
    ["gpu", "source"],
    "verdict",
)
BOUND_GRAPH_STEP_RATIO = _m(
    "boundwatch_bound_graph_step_ratio",
    "gauge",
    "Share of the engine's steps on this GPU that ran inside a CUDA graph over the verdict's window, "
    "as the light agent counts them (each step's graph mode, else graph replays per step); absent "
    "without a light agent's steps. Below verdict.graph_share_low while host-bound: cuda_graph_fallback.",
    ["gpu"],
    "verdict",
)
BOUND_SECONDS_TOTAL = _m(
    "boundwatch_bound_seconds_total",
    "counter",
    "Time spent in each verdict.",
    ["gpu", "verdict"],
    "verdict",
)
HOST_BOUND_SECONDS_TOTAL = _m(
    "boundwatch_host_bound_seconds_total",
    "counter",
    "GPU idle time while work was offered to its engine: requests running or waiting, tokens flowing, "
    "or requests held before it by a saturated or throttled API server (rate() is the share the host cost).",
    ["gpu"],
    "verdict",
)
ROOFLINE_STEP_FLOOR_SECONDS = _m(
    "boundwatch_roofline_step_floor_seconds",
    "gauge",
    "Floor step time: weight bytes read per step over measured HBM bandwidth.",
    ["gpu"],
    "verdict",
)
ROOFLINE_ACHIEVED_RATIO = _m(
    "boundwatch_roofline_achieved_ratio",
    "gauge",
    "Floor step time over achieved step time (1 = at the weight-streaming floor).",
    ["gpu"],
    "verdict",
)
# --- the Triton self-test probe --------------------------------------------------------
PROBE_HBM_BANDWIDTH_BYTES_PER_SECOND = _m(
    "boundwatch_probe_hbm_bandwidth_bytes_per_second",
    "gauge",
    "HBM streaming bandwidth the probe measured (bytes read plus written).",
    ["gpu"],
    "probe",
)
PROBE_HBM_BANDWIDTH_RATIO = _m(
    "boundwatch_probe_hbm_bandwidth_ratio",
    "gauge",
    "Measured HBM bandwidth over the device's nominal figure.",
    ["gpu"],
    "probe",
)
PROBE_DUTY_ERROR_RATIO = _m(
    "boundwatch_probe_duty_error_ratio",
    "gauge",
    "Reported minus known busy fraction in the probe's duty-cycle self-test.",
    ["gpu", "source"],
    "probe",
)
PROBE_SUCCESS = _m(
    "boundwatch_probe_success",
    "gauge",
    "Whether the last probe passed (1) or failed (0).",
    ["gpu"],
    "probe",
)
PROBE_LAST_RUN_TIMESTAMP_SECONDS = _m(
    "boundwatch_probe_last_run_timestamp_seconds",
    "gauge",
    "Unix time of the last probe run.",
    ["gpu"],
    "probe",
)
# --- appended ----------------------------------------------------------------------------
DEMO = _m(
    "boundwatch_demo",
    "gauge",
    "1 when every figure is synthetic data from `boundwatch demo`, never on a real host.",
)
SELF_CGROUP_INFO = _m(
    "boundwatch_self_cgroup_info",
    "gauge",
    "The cgroup boundwatch itself runs in (its cgroup_cpu_* series are the sidecar's own); always 1.",
    ["cgroup"],
    "host",
)
# --- engine placement (which GPUs each engine drives) -----------------------------------
ENGINE_GPU_INFO = _m(
    "boundwatch_engine_gpu_info",
    "gauge",
    "A GPU the engine drives, and how that was found (nvml_pids, placement, agent, cuda_visible_devices, lone_gpu, reading); always 1.",
    ["engine", "gpu", "placed_by"],
    "engine",
)
ENGINE_GPUS = _m(
    "boundwatch_engine_gpus",
    "gauge",
    "GPUs the engine drives; 0 when it could be placed on none (its GPUs then read no_gpu_mapping).",
    ["engine"],
    "engine",
)

METRICS: tuple[MetricSpec, ...] = tuple(_DEFINED)

BY_NAME: dict[str, MetricSpec] = {spec.name: spec for spec in METRICS}


def spec(name: str) -> MetricSpec:
    """Return the catalogue entry for a metric name, or raise KeyError."""
    return BY_NAME[name]


def family(
    s: MetricSpec,
) -> GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily | InfoMetricFamily:
    """Build an empty metric family for a catalogue entry."""
    labels = list(s.labels)
    if s.kind == "gauge":
        return GaugeMetricFamily(s.name, s.help, labels=labels)
    if s.kind == "counter":
        return CounterMetricFamily(s.name, s.help, labels=labels)
    if s.kind == "histogram":
        return HistogramMetricFamily(s.name, s.help, labels=labels)
    return InfoMetricFamily(s.name, s.help, labels=labels)


def gauge(s: MetricSpec) -> GaugeMetricFamily:
    """Build an empty gauge family for a catalogued gauge."""
    fam = family(s)
    assert isinstance(fam, GaugeMetricFamily), s.name
    return fam


def counter(s: MetricSpec) -> CounterMetricFamily:
    """Build an empty counter family for a catalogued counter."""
    fam = family(s)
    assert isinstance(fam, CounterMetricFamily), s.name
    return fam


def histogram(s: MetricSpec) -> HistogramMetricFamily:
    """Build an empty histogram family for a catalogued histogram."""
    fam = family(s)
    assert isinstance(fam, HistogramMetricFamily), s.name
    return fam


def number(s: MetricSpec) -> GaugeMetricFamily | CounterMetricFamily:
    """Build an empty gauge or counter family: one number per series."""
    fam = family(s)
    assert isinstance(fam, GaugeMetricFamily | CounterMetricFamily), s.name
    return fam
