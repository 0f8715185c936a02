"""What an inference engine (vLLM, SGLang) says at one tick, normalised."""

from __future__ import annotations

from dataclasses import dataclass, field

from exporter.snapshot.host import CgroupCpu, ProcessCpu


@dataclass(frozen=True)
class StepCount:
    """Engine steps so far and how they were counted.

    method: "agent" (exact, counted inside the engine), "iteration_count" (vLLM's
    iteration_tokens_total_count with one API server), "bounds" (several API servers: the
    truth lies in [lower, upper]), "sglang_passes" (SGLang forward passes on tp_rank 0).
    """

    method: str
    total: float | None
    lower: float | None = None
    upper: float | None = None


@dataclass(frozen=True)
class EngineReading:
    """One engine at one tick; None where the engine does not expose a figure."""

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
    steps: StepCount | None = None
    max_num_seqs: int | None = None
    api_server_count: int | None = None
    multiprocess: bool = False
    api_servers: tuple[ProcessCpu, ...] = field(default=())
    cgroups: tuple[CgroupCpu, ...] = field(default=())
    gpus: tuple[int, ...] = field(default=())  # NVML indices this engine drives; () = all
    scrape_seconds: float | None = None
