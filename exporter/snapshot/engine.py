"""What an inference engine (vLLM, SGLang) says at one tick, normalised."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from exporter.snapshot.host import CgroupCpu, ProcessCpu, ThreadCpu

# Step-count methods, the values of the `method` label of boundwatch_engine_steps_total:
# agent (exact, counted inside the engine), lower_bound (vLLM page: engine steps are at least this),
# upper_bound (vLLM page, several API servers: steps WITH OUTPUT are at most this; steps without
# output, such as partial prefills, appear on no page), forward_passes (SGLang cuda_graph_passes_total
# of each DP group's reporting rank), dp_attention_steps (SGLang dp_attention_steps_total: every
# DP rank's steps, idle ones included).
STEP_METHODS: tuple[str, ...] = (
    "agent",
    "lower_bound",
    "upper_bound",
    "forward_passes",
    "dp_attention_steps",
)

# What an engine's page (or multiprocess files) lost in one read, the values of the `reason` label
# of boundwatch_engine_page_refused_total: values refused (nan, infinite, negative, too_large: over
# what any engine reports), reads cut at a budget (bytes, lines: the page's or the kept lines';
# files: multiprocess files over the count, each file over the byte budget counting as bytes),
# samples whose label names or values were cut (label), undecodable bytes replaced (undecodable),
# and reads the metrics parser refused whole (unparsable).
PAGE_REFUSED_REASONS: tuple[str, ...] = (
    "nan",
    "infinite",
    "negative",
    "too_large",
    "bytes",
    "lines",
    "files",
    "label",
    "undecodable",
    "unparsable",
)

_SERVER_INDEX = re.compile(r"APIServer_(\d+)")


@dataclass(frozen=True)
class ThreadLoad(ThreadCpu):
    """A thread's CPU over the last tick, and its demand: the share of the tick it ran or waited to run.

    `runnable` (from /proc schedstat: run time + run-queue wait) reads ~1.0 for a thread that would
    take a whole core, even when neighbours or a CPU quota let it run less; None without schedstat.
    """

    runnable: float | None = None


def demand(proc: ProcessCpu) -> float | None:
    """Return the busiest thread's demand in cores: its runnable share where known, else its CPU."""
    loads = [
        t.runnable if isinstance(t, ThreadLoad) and t.runnable is not None else t.cpu for t in proc.threads
    ]
    if loads:
        return max(loads)
    return proc.busiest_thread.cpu if proc.busiest_thread is not None else None


@dataclass(frozen=True)
class StepCount:
    """Engine steps so far, as the engine's own metrics tell them (cumulative).

    method: "output_steps" (vLLM's iteration_tokens_total_count: API servers count only steps
    in which they had output, so `lower` is a whole-number lower bound of engine steps and `upper`,
    when there are several API servers, an upper bound of the steps WITH OUTPUT only; a page never
    gives lower == upper), "forward_passes" (SGLang forward passes of each DP group's reporting
    rank), "dp_attention_steps" (SGLang, every DP rank's steps), "agent" (counted inside the
    engine: the only exact count). `total` is the best single figure (see analysis.dedup.step_count).
    """

    method: str
    total: float | None
    lower: float | None = None
    upper: float | None = None


@dataclass(frozen=True)
class Placement:
    """One process of an engine and where it runs, as the process table tells (never a label).

    `core` is the pid of the engine core it serves (vLLM EngineCore, SGLang scheduler; itself
    for a core, 0 unknown); `visible` its CUDA_VISIBLE_DEVICES at exec; `ordinal` the CUDA
    ordinal it uses among them (its TP rank, from its title), None when the title does not say.
    """

    pid: int
    role: str  # engine_core | worker | scheduler | other
    core: int = 0
    visible: str | None = None
    ordinal: int | None = None
    dp_rank: int | None = None


@dataclass(frozen=True)
class EngineReading:
    """One engine at one tick; None where the engine does not expose a figure.

    `iteration_count_by_pid` holds (API-server pid, cumulative iteration_tokens_total_count)
    read from the engine's PROMETHEUS_MULTIPROC_DIR files; pids never leave the reading as labels.
    """

    name: str
    kind: str  # "vllm" | "sglang"
    model: str = ""
    url: str = ""
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    preemptions_total: float | None = None
    spec_draft_tokens_total: float | None = None
    spec_accepted_tokens_total: float | None = None
    spec_drafts_total: float | None = None
    spec_acceptance: float | None = None  # an engine-computed ratio (SGLang), when it gives one
    steps: StepCount | None = None
    iteration_count: float | None = None  # vLLM iteration_tokens_total_count, summed over API servers
    iteration_tokens_sum: float | None = None  # vLLM iteration_tokens_total_sum (correct with any N)
    iteration_count_by_pid: tuple[tuple[int, float], ...] = field(default=())
    forward_passes: float | None = None  # SGLang cuda_graph_passes_total, every mode, reporting ranks
    graph_passes_total: float | None = None  # SGLang passes with mode *_cuda_graph (decode and prefill)
    eager_passes_total: float | None = None  # SGLang passes with mode *_none
    dp_attention_steps_total: float | None = None  # SGLang dp_attention_steps_total over DP ranks and states
    max_num_seqs: int | None = None
    api_server_count: int | None = None
    api_server_count_source: str = ""  # processes | cmdline | multiproc_files | kv_cache_pids | page
    multiprocess: bool = False
    kv_cache_pid_series: int = 0  # >1: vLLM <= 0.11.0 per-pid kv_cache_usage_perc, collapsed (max)
    data_parallel_engines: int = 1
    source: str = "http"  # http | file | multiproc_files
    api_servers: tuple[ProcessCpu, ...] = field(default=())  # sorted by server index
    cgroups: tuple[CgroupCpu, ...] = field(default=())
    gpus: tuple[int, ...] = field(default=())  # GPU indices this engine drives; () = not placed (yet)
    # how they were found: nvml_pids | placement | agent | cuda_visible_devices | lone_gpu | reading
    gpus_from: str = ""
    placements: tuple[Placement, ...] = field(default=())  # its processes' devices (sources.placement)
    core_gpus: tuple[tuple[int, tuple[int, ...]], ...] = field(default=())  # (core pid, its GPUs)
    pids: tuple[int, ...] = field(default=())  # the engine's processes on this host (never a label)
    cuda_visible_devices: str | None = None  # as the engine's GPU processes were started with, if seen
    scrape_seconds: float | None = None
    page_truncated: bool = False  # this read stopped at the byte or line budget: a partial page
    page_decode_errors: int = 0  # undecodable (non-UTF-8) bytes in this read, replaced
    rejected_values: int = 0  # samples of this read refused: NaN, infinite, negative or implausible
    page_refused: tuple[tuple[str, int], ...] = field(default=())  # this read's losses by reason, nonzero
    error: str = ""  # why this tick's read failed ("" = it did not); figures are then None

    def servers(self) -> tuple[tuple[str, ProcessCpu], ...]:
        """Return (server index label, process) for each API server (index from its title, else position)."""
        out = []
        for pos, proc in enumerate(self.api_servers):
            match = _SERVER_INDEX.search(proc.name) or next(
                (m for m in (_SERVER_INDEX.search(a) for a in proc.cmdline[:1]) if m), None
            )
            out.append((match.group(1) if match else str(pos), proc))
        return tuple(out)
