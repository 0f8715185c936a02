"""The sample names of engines' pages that boundwatch reads, and the engine kind they say.

Neutral ground for both sides of a RawPage: the engine source cuts each page down to these names
at the edge (`sources/engine_scrape.py`), analysis reads its figures from them
(`analysis/engine_page.py`). Names and their history are in `research/vllm-metrics.md`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

# The sample names boundwatch reads, by engine. A tuple means "the first name present wins"
# (renames: newest first).
VLLM_RUNNING = ("vllm:num_requests_running",)
VLLM_WAITING = ("vllm:num_requests_waiting",)
# kv_cache_usage_perc: one series per API-server pid up to 0.11.0 (multiprocess mode "all"), one series
# ("mostrecent") from 0.11.2. gpu_cache_usage_perc: deprecated 0.9.2, hidden in 0.11, gone by 0.33.
VLLM_KV = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
VLLM_PROMPT = ("vllm:prompt_tokens_total",)
VLLM_GENERATION = ("vllm:generation_tokens_total",)
VLLM_PREEMPTIONS = ("vllm:num_preemptions_total",)
VLLM_SPEC_DRAFT_TOKENS = ("vllm:spec_decode_num_draft_tokens_total",)
VLLM_SPEC_ACCEPTED = ("vllm:spec_decode_num_accepted_tokens_total",)
VLLM_SPEC_DRAFTS = ("vllm:spec_decode_num_drafts_total",)
VLLM_ITER_COUNT = "vllm:iteration_tokens_total_count"
VLLM_ITER_SUM = "vllm:iteration_tokens_total_sum"

SGLANG_RUNNING = ("sglang:num_running_reqs",)
SGLANG_WAITING = ("sglang:num_queue_reqs",)
SGLANG_KV = ("sglang:token_usage",)
SGLANG_PROMPT = ("sglang:prompt_tokens_total",)
SGLANG_GENERATION = ("sglang:generation_tokens_total",)
SGLANG_PREEMPTIONS = ("sglang:num_retracted_requests_total",)
SGLANG_SPEC_ACCEPT_RATE = ("sglang:spec_accept_rate",)
SGLANG_SPEC_ACCEPT_LENGTH = ("sglang:spec_accept_length",)  # 0 exactly when speculation is off
SGLANG_PASSES = "sglang:cuda_graph_passes_total"  # mode=decode|prefill _cuda_graph|_none
SGLANG_DP_ATTENTION_STEPS = "sglang:dp_attention_steps_total"  # rank_state=active|idle, per DP rank

# Every name above: what the source cuts a page down to before parsing (`sources/engine_scrape.prefilter_page`)
# and the only samples a RawPage holds.
WANTED: tuple[str, ...] = tuple(
    sorted(
        {
            *VLLM_RUNNING,
            *VLLM_WAITING,
            *VLLM_KV,
            *VLLM_PROMPT,
            *VLLM_GENERATION,
            *VLLM_PREEMPTIONS,
            *VLLM_SPEC_DRAFT_TOKENS,
            *VLLM_SPEC_ACCEPTED,
            *VLLM_SPEC_DRAFTS,
            VLLM_ITER_COUNT,
            VLLM_ITER_SUM,
            *SGLANG_RUNNING,
            *SGLANG_WAITING,
            *SGLANG_KV,
            *SGLANG_PROMPT,
            *SGLANG_GENERATION,
            *SGLANG_PREEMPTIONS,
            *SGLANG_SPEC_ACCEPT_RATE,
            *SGLANG_SPEC_ACCEPT_LENGTH,
            SGLANG_PASSES,
            SGLANG_DP_ATTENTION_STEPS,
        }
    )
)


class Named(Protocol):
    """Anything with a sample name (a parsed sample, a PageSample)."""

    @property
    def name(self) -> str: ...


# Each engine kind and the prefix of its sample names: what says a page is an engine's, and which.
KIND_PREFIXES: tuple[tuple[str, str], ...] = (("vllm", "vllm:"), ("sglang", "sglang:"))
PREFIXES: tuple[str, ...] = tuple(p for _, p in KIND_PREFIXES)


def detect_kind(samples: Iterable[Named]) -> str | None:
    """Return "vllm" or "sglang" from the sample names, or None."""
    for s in samples:
        for kind, prefix in KIND_PREFIXES:
            if s.name.startswith(prefix):
                return kind
    return None
