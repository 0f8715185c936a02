"""CUDA-graph coverage read from engines' command lines, as vLLM and SGLang spell the flags."""

import pytest

from exporter.snapshot.engine import GraphConfig
from exporter.sources.engine_flags import graph_config

SERVE = ["vllm", "serve", "deepseek-ai/DeepSeek-V4-Flash", "--max-num-seqs", "64"]


@pytest.mark.parametrize(
    ("extra", "want"),
    [
        ([], None),  # vLLM's default capture size depends on the version: not guessed
        (["--enforce-eager"], GraphConfig(off=True, source="--enforce-eager")),
        (["-O", '{"cudagraph_mode": "NONE"}'], GraphConfig(off=True, source="cudagraph_mode=NONE")),
        # seed 000: the capture size set to max_num_seqs, with speculative depth 1
        (
            ["-O", '{"max_cudagraph_capture_size": 64}', "--speculative-config",
             '{"method": "mtp", "num_speculative_tokens": 1}'],
            GraphConfig(capture_limit=64, spec_tokens=1, source="max_cudagraph_capture_size"),
        ),
        (["-O.max_cudagraph_capture_size=128"], GraphConfig(capture_limit=128, source="max_cudagraph_capture_size")),
        (["--compilation-config", '{"cudagraph_capture_sizes": [1, 2, 4, 8, 16]}'],
         GraphConfig(capture_limit=16, source="cudagraph_capture_sizes")),
        (["--max-cudagraph-capture-size=256"], GraphConfig(capture_limit=256, source="--max-cudagraph-capture-size")),
        (["--cuda-graph-sizes", "8", "16", "32", "--port", "8001"],
         GraphConfig(capture_limit=32, source="--cuda-graph-sizes")),
        # malformed or hostile values are ignored, never raised
        (["-O", "{not json", "--cuda-graph-sizes", "-5"], GraphConfig(refused=1)),
        (["--max-cudagraph-capture-size", "9" * 5000], GraphConfig(refused=1)),
        (["-O", "[64]", "--cuda-graph-sizes", "8", "x", "32"],
         GraphConfig(capture_limit=32, source="--cuda-graph-sizes", refused=2)),
    ],
)  # fmt: skip
def test_vllm_flags(extra: list[str], want: GraphConfig | None) -> None:
    assert graph_config("vllm", [*SERVE, *extra]) == want


def test_sglang_flags() -> None:
    base = ["python3", "-m", "sglang.launch_server", "--enable-metrics"]
    assert graph_config("sglang", [*base, "--disable-cuda-graph"]) == GraphConfig(
        off=True, source="--disable-cuda-graph"
    )
    got = graph_config("sglang", [*base, "--cuda-graph-max-bs", "32", "--speculative-num-draft-tokens", "4"])
    assert got == GraphConfig(
        capture_limit=32, limit_in_tokens=False, spec_tokens=3, source="--cuda-graph-max-bs"
    )
    assert got is not None and not got.eager_at(32) and got.eager_at(33)  # SGLang counts sequences
    assert graph_config("sglang", base) is None


def test_capture_limit_counts_tokens_with_speculation() -> None:
    seed = GraphConfig(capture_limit=64, spec_tokens=1)
    assert not seed.eager_at(32) and seed.eager_at(33)  # 33 sequences x 2 tokens > 64
    assert GraphConfig(off=True).eager_at(1)
    assert not GraphConfig().eager_at(10_000)  # nothing known: no claim
