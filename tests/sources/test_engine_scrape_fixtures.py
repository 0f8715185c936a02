"""Real pages users pasted, and a page from a real multiprocess run, normalised into readings."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from engine_fixtures import PAGES

from exporter.analysis import dedup, engine_page
from exporter.sources.engine_scrape import looks_multiprocess, parse_page, prefilter_page
from tests.fakes.engine_reads import reading_from_multiproc, reading_from_page


def page(name: str) -> str:
    return (PAGES / name).read_text()


def test_vllm_010_single_server_page_reads_kv_usage_model_and_one_api_server():
    r = reading_from_page(page("vllm-0.10.0-single-glm45-fragment.prom"))
    assert (r.kind, r.model) == ("vllm", "zai-org/GLM-4.5")
    assert r.kv_cache_usage == pytest.approx(9.75010481363281e-06)
    assert r.multiprocess is False  # *_created samples: a single-process registry
    assert (r.api_server_count, r.api_server_count_source) == (1, "page")
    assert r.running is None and r.steps is None  # the fragment has neither


def test_vllm_011_eight_api_servers_kv_series_collapse_to_the_live_one():
    r = reading_from_page(page("vllm-0.11-multiapi8-kvcache-pid.prom"))
    assert r.kv_cache_usage == pytest.approx(0.6530455880475035)  # 7 stale 0.0 series, 1 current
    assert r.kv_cache_pid_series == 8
    assert (r.api_server_count, r.api_server_count_source) == (8, "kv_cache_pids")
    assert r.multiprocess is True


def test_sglang_docs_page_reads_scheduler_state_and_token_totals():
    r = reading_from_page(page("sglang-docs-production-metrics.prom"))
    assert (r.kind, r.model) == ("sglang", "meta-llama/Llama-3.1-8B-Instruct")
    assert (r.running, r.waiting) == (162.0, 2826.0)
    assert r.kv_cache_usage == pytest.approx(0.28)
    assert r.prompt_tokens_total == 8.128902e06
    assert r.generation_tokens_total == 7.557572e06


def test_generated_multiprocess_page_shows_the_double_count_and_its_bounds():
    truth = json.loads((PAGES / "vllm-sim-0.11-asc4.truth.json").read_text())
    r = reading_from_page(page("vllm-sim-0.11-asc4.prom"))
    assert (
        r.iteration_count == truth["observations"] == 4 * truth["steps_with_output"]
    )  # every server, every step
    assert r.generation_tokens_total == truth["generation_tokens"]  # per-request counters are not doubled
    assert r.prompt_tokens_total == truth["prompt_tokens"]
    assert (r.running, r.waiting) == (truth["running"], truth["waiting"])
    assert r.api_server_count == 4
    assert r.steps is not None and r.steps.method == "output_steps"
    # N came from the kv pid series, which may miss servers: no lower bound, the total is the raw count.
    assert (r.steps.lower, r.steps.total, r.steps.upper) == (
        None,
        truth["observations"],
        truth["observations"],
    )
    # Once the process table says 4 API servers, count / 4 bounds it below, here exactly.
    known = dedup.step_count(replace(r, api_server_count_source="processes"))
    assert known is not None and known.total == known.lower == truth["steps_with_output"]


@pytest.mark.parametrize("name", sorted(p.name for p in PAGES.glob("*.prom")))
def test_prefiltered_parse_reads_the_same_as_a_full_parse(name):
    text = page(name)
    full = engine_page.normalise(parse_page(text, prefilter=False), multiprocess=looks_multiprocess(text))
    cut = engine_page.normalise(parse_page(text, prefilter=True), multiprocess=looks_multiprocess(text))
    assert full == cut


def test_prefilter_keeps_a_wanted_name_but_not_a_longer_name_it_prefixes():
    text = (
        'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0\n'
        'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 9.0\n'
    )
    kept = prefilter_page(text)
    assert "vllm:num_requests_waiting{" in kept
    assert "by_reason" not in kept


def test_renamed_kv_metric_is_read_under_its_old_name():
    text = (
        "# TYPE vllm:gpu_cache_usage_perc gauge\n"
        'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.42\n'
        'vllm:num_requests_running{engine="0",model_name="m"} 7.0\n'
    )
    assert reading_from_page(text).kv_cache_usage == pytest.approx(0.42)


def test_data_parallel_engines_are_summed_for_requests_and_maxed_for_kv_usage():
    text = "".join(
        f'vllm:num_requests_running{{engine="{e}",model_name="m"}} {run}\n'
        f'vllm:num_requests_waiting{{engine="{e}",model_name="m"}} {wait}\n'
        f'vllm:kv_cache_usage_perc{{engine="{e}",model_name="m"}} {kv}\n'
        for e, run, wait, kv in (("0", 10, 1, 0.5), ("1", 30, 4, 0.8))
    )
    r = reading_from_page(text)
    assert (r.running, r.waiting, r.kv_cache_usage, r.data_parallel_engines) == (40.0, 5.0, 0.8, 2)


def test_sglang_ranks_other_than_tp0_are_not_counted_twice():
    text = "".join(
        f'sglang:num_running_reqs{{dp_rank="{dp}",model_name="m",pp_rank="0",tp_rank="{tp}"}} {run}\n'
        f'sglang:cuda_graph_passes_total{{dp_rank="{dp}",mode="decode_cuda_graph",model_name="m",pp_rank="0",tp_rank="{tp}"}} 100\n'
        for dp, run in (("0", 5), ("1", 7))
        for tp in ("0", "1")
    )
    r = reading_from_page(text)
    assert r.running == 12.0  # dp ranks summed, tp rank 1 dropped
    assert r.forward_passes == 200.0
    assert r.steps is not None and r.steps.method == "forward_passes"


def test_a_page_without_engine_metrics_is_an_error():
    with pytest.raises(ValueError, match="no vllm"):
        reading_from_page("# TYPE up gauge\nup 1\n")


def test_sglang_multiprocess_files_and_page_agree_and_count_tp_rank_zero_once(tmp_path):
    import vllm_sim
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess

    vllm_sim.run_sglang(str(tmp_path), tp=2, dp=2)
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, str(tmp_path))
    from_page = reading_from_page(generate_latest(registry).decode())
    from_files = reading_from_multiproc(str(tmp_path))
    for r in (from_page, from_files):
        assert r.kind == "sglang"
        assert (r.running, r.waiting) == (10 + 11, 0 + 3)  # DP ranks summed, TP rank 1 not counted again
        assert r.forward_passes == 1000 + 2000
        assert (r.prompt_tokens_total, r.generation_tokens_total) == (5000, 700)
        assert r.kv_cache_usage == pytest.approx(0.35)
        assert r.data_parallel_engines == 2


# Pages written by SGLang 0.5.23's own SchedulerMetricsCollector in multiprocess mode, one forked
# process per scheduler rank, scheduling scripted (tests/fakes/engine/make_sglang_pages.py).
SGLANG_PAGES = ("tp2", "dp2-replicas", "dpattn-dp2-tp4", "priority")


def sglang_page(name: str) -> tuple[str, dict]:
    stem = f"sglang-0.5.23-{name}"
    return page(f"{stem}.prom"), json.loads((PAGES / f"{stem}.truth.json").read_text())


@pytest.mark.parametrize("name", SGLANG_PAGES)
def test_sglang_own_collector_pages_read_right(name):
    text, truth = sglang_page(name)
    r = reading_from_page(text)
    assert (r.kind, r.model) == ("sglang", "tiny-llama")
    assert (r.running, r.waiting) == (truth["running"], truth["waiting"])
    assert r.kv_cache_usage == pytest.approx(truth["token_usage_max"])
    assert (r.graph_passes_total, r.eager_passes_total) == (truth["graph_passes"], truth["eager_passes"])
    assert r.forward_passes == truth["graph_passes"] + truth["eager_passes"]
    assert r.spec_acceptance is None  # speculation off: spec_accept_rate 0 is not 0% acceptance
    assert r.data_parallel_engines == truth["dp"]


def test_sglang_dp_attention_reads_every_dp_group_from_its_reporting_rank():
    text, truth = sglang_page("dpattn-dp2-tp4")
    assert 'dp_rank="1"' in text and 'tp_rank="2"' in text  # group 1 reports from global tp_rank 2
    r = reading_from_page(text)
    assert r.running == truth["running"] and r.running > 0
    assert r.dp_attention_steps_total == truth["dp_attention_steps"] == 2 * truth["steps"]
    assert r.steps is not None and (r.steps.method, r.steps.total) == ("dp_attention_steps", 120)
    # keeping tp_rank "0" alone would read DP group 0 only
    group0 = "".join(
        line + "\n" for line in text.splitlines() if 'dp_rank="0"' in line or not line.startswith("sglang:")
    )
    assert reading_from_page(group0).running < r.running


def test_sglang_priority_totals_are_not_added_to_their_breakdown():
    text, truth = sglang_page("priority")
    assert 'priority=""' in text and 'priority="1"' in text
    r = reading_from_page(text)
    assert (r.running, r.waiting) == (truth["running"], truth["waiting"])
    assert truth["running"] > 0


def test_sglang_spec_acceptance_is_read_when_speculation_ran():
    text = (
        'sglang:num_running_reqs{model_name="m",tp_rank="0"} 1\n'
        'sglang:spec_accept_rate{model_name="m",tp_rank="0"} 0.0\n'
        'sglang:spec_accept_length{model_name="m",tp_rank="0"} 1.0\n'
    )
    assert reading_from_page(text).spec_acceptance == 0.0  # speculation on, nothing accepted: a real 0
    on = text.replace("0.0\n", "0.62\n", 1).replace("1.0\n", "2.9\n")
    assert reading_from_page(on).spec_acceptance == pytest.approx(0.62)


def test_sglang_ranks_with_bad_labels_are_dropped():
    text = (
        'sglang:num_running_reqs{model_name="m",tp_rank="0"} 3\n'
        'sglang:num_running_reqs{model_name="m",tp_rank="x"} 100\n'
        'sglang:num_running_reqs{model_name="m",tp_rank="-1"} 100\n'
    )
    assert reading_from_page(text).running == 3


def test_vllm_multiprocess_page_of_unknown_mode_claims_no_api_server_count():
    # vLLM 0.11.2+: kv_cache_usage_perc has one series even with several API servers, so a page whose
    # registry mode cannot be told says nothing about the server count (and so claims no exact steps)
    text = 'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\nvllm:iteration_tokens_total_count{engine="0",model_name="m"} 90\n'
    r = engine_page.normalise(parse_page(text), multiprocess=None)
    assert r.api_server_count is None
    steps = dedup.step_count(r)
    assert steps is not None and steps.lower is None and steps.upper == 90
