"""What an inference engine (vLLM, SGLang) says at one tick, normalised."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

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

# Where an engine's running / waiting come from: its agent's scheduler counts, or its page.
COUNTS_SOURCES: tuple[str, ...] = ("agent", "page")

# What an engine's page (or multiprocess files) lost in one read, the values of the `reason` label
# of boundwatch_engine_page_refused_total: values refused (nan, infinite, negative, too_large: over
# what any engine reports), reads cut at a budget (bytes, lines: the page's or the kept lines';
# files: multiprocess files over the count, each file over the byte budget counting as bytes),
# samples whose label names or values were cut (label), undecodable bytes replaced (undecodable),
# reads the metrics parser refused whole (unparsable), and reads whose model name differed from the
# one served and was held back (model: analysis.engine_page.hold_models).
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
    "model",
)


def refused_tuple(refused: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    """Return the nonzero counts of a read's losses in PAGE_REFUSED_REASONS order."""
    return tuple((r, int(refused[r])) for r in PAGE_REFUSED_REASONS if refused.get(r, 0) > 0)


def refused_plus(page_refused: tuple[tuple[str, int], ...], reason: str) -> tuple[tuple[str, int], ...]:
    """Return a reading's `page_refused` with one more loss for `reason`."""
    lost = dict(page_refused)
    lost[reason] = lost.get(reason, 0) + 1
    return refused_tuple(lost)


def ascii_int(text: str | None, most: int) -> int | None:
    """Return a number written in at most `most` ASCII digits, else None: how a number from outside is read.

    `str.isdigit` also takes digits int() refuses (superscripts), and int() refuses over 4,300
    digits: text that a process, a page or a file writes is read through here, so neither can raise.
    """
    if text is None or not 0 < len(text) <= most or not (text.isascii() and text.isdigit()):
        return None
    return int(text)


# An index of 7 digits or more, or of other than ASCII digits, is no real server's: its position stands.
_SERVER_INDEX = re.compile(r"APIServer_([0-9]{1,6})(?![0-9])")
MAX_ERROR_CHARS = 300  # an error text (a parser quotes the bad line) is cut to this


def cut(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """Return text cut to a length, marked with an ellipsis when cut (EngineReading.error is cut so)."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


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
class GraphConfig:
    """What an engine's command line says about its CUDA graphs (sources.engine_flags).

    `off`: graphs disabled (vLLM --enforce-eager or cudagraph_mode NONE, SGLang --disable-cuda-graph).
    `capture_limit`: the largest captured decode batch, in tokens (vLLM, `limit_in_tokens`) or in
    sequences (SGLang); a decode step above it runs eager. `spec_tokens`: speculative tokens per
    sequence and step (a vLLM step carries sequences x (1 + spec_tokens) tokens).
    """

    off: bool = False
    capture_limit: int | None = None
    limit_in_tokens: bool = True
    spec_tokens: int = 0
    source: str = ""  # the flag or key that said it
    refused: int = 0  # values given to these flags that could not be read (bad JSON, a bad number): ignored

    def eager_at(self, running: float) -> bool:
        """Say whether a decode step with this many running sequences runs without a CUDA graph."""
        if self.off:
            return True
        if self.capture_limit is None or running <= 0:
            return False
        tokens = running * (1 + self.spec_tokens) if self.limit_in_tokens else running
        return tokens > self.capture_limit


@dataclass(frozen=True)
class CoreCounts:
    """One engine core's scheduler counts as its agent last reported them, held until the next report.

    `pid` is the engine core's process (joins to its agent; never a label), `dp_rank` its
    data-parallel rank where it has one.
    """

    pid: int
    dp_rank: int | None
    running: float | None
    waiting: float | None
    max_num_seqs: int | None = None


class PageSample(NamedTuple):
    """One sample of an engine's page or files as read and bounded: name, label pairs, value."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


@dataclass(frozen=True)
class RawPage:
    """What one read of an engine's page (or multiprocess files) gave, before it is normalised.

    `samples` are the wanted samples only (the page cut to the names boundwatch reads, within the
    byte, line and kept-line budgets, values and labels bounded): tens to hundreds per engine.
    `kind` is the kind the engine was known as before the read (multiprocess files), None when the
    samples say; `multiprocess` what the whole page looked like (None: cannot tell);
    `iteration_count_by_pid` each API server's iteration count from the files. `servers` is the
    API-server count the process table gives (count, "processes" | "cmdline"), which beats the
    page's; `lone_server`: the engine's main process serves HTTP itself (one server, when the
    page does not say). analysis.engine_page.read_raw turns it into the reading's figures; only
    the newest Snapshot keeps it (sampling drops it from older ones).
    """

    samples: tuple[PageSample, ...]
    kind: str | None = None
    multiprocess: bool | None = None
    iteration_count_by_pid: tuple[tuple[int, float], ...] = field(default=())
    servers: tuple[int, str] | None = None
    lone_server: bool = False


@dataclass(frozen=True)
class EngineReading:
    """One engine at one tick; None where the engine does not expose a figure.

    `iteration_count_by_pid` holds (API-server pid, cumulative iteration_tokens_total_count)
    read from the engine's PROMETHEUS_MULTIPROC_DIR files; pids never leave the reading as labels.
    """

    name: str
    kind: str  # "vllm" | "sglang"
    model: str = ""
    # A model name read that differs from `model` and is not yet served: (the name, the monotonic time
    # it was first read); served once it has read the same for MODEL_HOLD_SECONDS (hold_models).
    model_pending: tuple[str, float] | None = None
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
    graph_config: GraphConfig | None = None  # from the engine's command line, when it says
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
    # The page's figures (tokens, KV, model...) were read this tick; False: carried from the read
    # `page_age_seconds` ago (while an agent counts the engine, its page is read every
    # engine.slow_read_seconds). A carried figure never counts as movement within a tick.
    page_read: bool = True
    page_age_seconds: float = 0.0
    # Filled by the analysis: where running / waiting come from ("agent": the engine cores' own
    # scheduler counts, held per core in core_counts; "page": the page's gauges).
    counts_source: str = "page"
    core_counts: tuple[CoreCounts, ...] = field(default=())
    page_refused: tuple[tuple[str, int], ...] = field(default=())  # this read's losses by reason, nonzero
    raw: RawPage | None = None  # the read as read, normalised in analysis (the newest Snapshot only)
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
