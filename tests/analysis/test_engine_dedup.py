"""Step de-duplication across API servers: literal cases, and real multiprocess runs with a known truth."""

from __future__ import annotations

from dataclasses import replace

import pytest
import vllm_sim
from prometheus_client import CollectorRegistry, generate_latest, multiprocess

from exporter.analysis.dedup import collapse_pid_series, counter_delta, step_count, step_increments
from exporter.snapshot.engine import EngineReading, StepCount
from exporter.sources.engine_scrape import (
    MultiprocReader,
    read_multiproc_dir,
)
from tests.fakes.engine_reads import reading_from_multiproc, reading_from_page


def vllm(
    count: float, servers: int | None, by_pid: tuple[tuple[int, float], ...] = (), how: str = "processes"
) -> EngineReading:
    return EngineReading(
        name="vllm:8000",
        kind="vllm",
        iteration_count=count,
        api_server_count=servers,
        api_server_count_source=how if servers else "",
        iteration_count_by_pid=by_pid,
    )


def test_one_api_server_bounds_steps_below_by_its_steps_with_output():
    # partial-prefill steps emit no output: the count is a lower bound, never an exact figure
    assert step_increments(vllm(100, 1), vllm(148, 1)) == {"lower_bound": 48}


def test_several_api_servers_give_bounds_from_per_pid_counts():
    prev = vllm(400, 4, ((11, 100), (12, 100), (13, 100), (14, 100)))
    cur = vllm(470, 4, ((11, 130), (12, 110), (13, 120), (14, 110)))
    # true steps >= the busiest server's 30, >= 70/4, <= 70
    assert step_increments(prev, cur) == {"lower_bound": 30, "upper_bound": 70}


def test_several_api_servers_without_files_bound_below_by_count_over_n():
    assert step_increments(vllm(400, 4), vllm(480, 4)) == {"lower_bound": 20, "upper_bound": 80}


def test_lower_bounds_are_whole_steps():
    # 54 observations from 4 servers: at least 13.5, so at least 14 whole steps had output
    assert step_increments(vllm(400, 4), vllm(454, 4)) == {"lower_bound": 14, "upper_bound": 54}
    c = step_count(vllm(454, 4))
    assert (c.lower, c.total, c.upper) == (114, 114, 454)


def test_unknown_server_count_without_files_gives_only_the_upper_bound():
    assert step_increments(vllm(400, None), vllm(480, None)) == {"upper_bound": 80}


def test_a_server_count_from_kv_pid_series_is_not_trusted_for_the_lower_bound():
    # 3 of 4 servers ever got scheduler stats: dividing by 3 would claim more steps than ran.
    assert step_increments(vllm(400, 3, how="kv_cache_pids"), vllm(480, 3, how="kv_cache_pids")) == {
        "upper_bound": 80
    }


def test_agent_count_wins_over_every_estimate():
    assert step_increments(vllm(400, 4), vllm(480, 4), agent_steps=23) == {"agent": 23.0}


def test_first_reading_counts_nothing():
    assert step_increments(None, vllm(480, 1)) == {}


def test_a_restarted_engine_counts_from_zero():
    assert counter_delta(1000, 12) == 12
    assert step_increments(vllm(1000, 1), vllm(12, 1)) == {"lower_bound": 12}


def test_a_server_new_since_the_last_tick_counts_from_zero():
    prev = vllm(200, 2, ((11, 100), (12, 100)))
    cur = vllm(235, 2, ((11, 110), (12, 100), (13, 25)))  # 12 died, 13 replaced it
    assert step_increments(prev, cur)["lower_bound"] == 25


def test_pid_series_collapse_to_one_per_engine_keeping_the_largest():
    series = [({"engine": "0", "pid": str(p)}, v) for p, v in ((271, 0.0), (273, 0.653), (275, 0.0))]
    series.append(({"engine": "1", "pid": "300"}, 0.2))
    collapsed, pids = collapse_pid_series(series)
    assert sorted((labels["engine"], v) for labels, v in collapsed) == [("0", 0.653), ("1", 0.2)]
    assert pids == 3


def test_cumulative_step_count_says_how_it_was_derived_and_never_claims_exact():
    one = step_count(vllm(500, 1))
    assert (one.method, one.total, one.lower, one.upper) == ("output_steps", 500, 500, None)
    bounds = step_count(vllm(500, 4, ((1, 130), (2, 125), (3, 120), (4, 125))))
    assert (bounds.method, bounds.lower, bounds.upper) == ("output_steps", 130, 500)
    unknown = step_count(vllm(500, None))
    assert (unknown.total, unknown.lower, unknown.upper) == (500, None, 500)
    for c in (one, bounds, unknown):
        assert c.lower is None or c.upper is None or c.lower < c.upper


def test_sglang_steps_prefer_dp_attention_steps():
    r = EngineReading(name="sglang", kind="sglang", forward_passes=41, dp_attention_steps_total=51)
    assert step_count(r) == StepCount("dp_attention_steps", 51)
    prev = replace(r, dp_attention_steps_total=40)
    assert step_increments(prev, r) == {"dp_attention_steps": 11}
    plain = replace(r, dp_attention_steps_total=None)
    assert step_count(plain) == StepCount("forward_passes", 41)


def run_with_ticks(tmp_path, n_servers, concurrency, steps=240, every=20):
    """Run the simulated engine, reading its files and its page at each checkpoint ("tick")."""
    mp_dir = tmp_path / "mp"
    mp_dir.mkdir()
    file_readings, page_readings = [], []
    reader = MultiprocReader(str(mp_dir))  # kept across ticks, as the source keeps it

    def tick(_i):
        kept = reading_from_multiproc(reader, name="vllm:8000")
        assert kept == reading_from_multiproc(str(mp_dir), name="vllm:8000")  # the index never goes stale
        file_readings.append(kept)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, str(mp_dir))
        page_readings.append(reading_from_page(generate_latest(registry).decode(), name="vllm:8000"))

    truth, pids = vllm_sim.run_engine(
        str(mp_dir), n_servers, steps, concurrency, checkpoint_every=every, on_checkpoint=tick, seed=n_servers
    )
    return truth, pids, file_readings, page_readings


def summed(readings, method):
    total, prev = 0.0, None
    for r in readings:
        total += step_increments(prev, r).get(method, 0.0)
        prev = r
    return total


def test_four_busy_api_servers_double_count_and_the_per_pid_bound_is_exact(tmp_path):
    truth, pids, files, pages = run_with_ticks(tmp_path, n_servers=4, concurrency=32)
    first = truth.checkpoints[0]["steps_with_output"]
    true_steps = truth.steps_with_output - first  # the first reading is the baseline
    upper, lower = summed(files, "upper_bound"), summed(files, "lower_bound")
    # vLLM's own count: every server had output in every step, so it reads 4x the truth.
    assert pages[-1].iteration_count == truth.observations == 4 * truth.steps_with_output
    assert upper == 4 * true_steps
    assert lower == true_steps  # the busiest server saw every step
    assert sorted(pid for pid, _ in files[-1].iteration_count_by_pid) == sorted(pids)
    # From the page alone the lower bound is count / N once N is known (from the process table).
    known = [replace(p, api_server_count=4, api_server_count_source="processes") for p in pages]
    assert summed(known, "lower_bound") == true_steps
    assert summed(pages, "lower_bound") <= true_steps


def test_one_request_at_a_time_makes_the_count_exact_and_bounds_hold(tmp_path):
    truth, _, files, pages = run_with_ticks(tmp_path, n_servers=3, concurrency=1)
    true_steps = truth.steps_with_output - truth.checkpoints[0]["steps_with_output"]
    assert truth.observations == truth.steps_with_output  # one server had output per step
    assert summed(files, "upper_bound") == true_steps
    assert summed(files, "lower_bound") <= true_steps
    assert summed(pages, "lower_bound") <= true_steps <= summed(pages, "upper_bound")


def test_page_lower_bounds_hold_for_engine_steps_with_steps_without_output(tmp_path):
    truth, _, files, _ = run_with_ticks(tmp_path, n_servers=1, concurrency=1)
    assert truth.steps > truth.steps_with_output  # some steps had no output: the count is not exact
    marks = truth.checkpoints
    for k in range(1, len(files)):
        inc = step_increments(files[k - 1], files[k])
        engine = marks[k]["steps"] - marks[k - 1]["steps"]
        assert set(inc) == {"lower_bound"} and inc["lower_bound"] <= engine
        assert inc["lower_bound"] == int(inc["lower_bound"])


@pytest.mark.parametrize("n_servers,concurrency", [(2, 3), (4, 6), (8, 64)])
def test_bounds_contain_the_truth_at_every_tick(tmp_path, n_servers, concurrency):
    truth, _, files, _ = run_with_ticks(tmp_path, n_servers, concurrency, steps=160, every=16)
    marks = truth.checkpoints
    for k in range(1, len(files)):
        inc = step_increments(files[k - 1], files[k])
        steps = marks[k]["steps_with_output"] - marks[k - 1]["steps_with_output"]
        assert inc["lower_bound"] <= steps <= inc["upper_bound"], (k, inc, steps)


def test_file_reading_matches_what_the_page_of_any_api_server_shows(tmp_path):
    truth, _, files, pages = run_with_ticks(tmp_path, n_servers=4, concurrency=12, steps=60, every=20)
    for f, p, mark in zip(files, pages, truth.checkpoints, strict=True):
        for field in (
            "running",
            "waiting",
            "prompt_tokens_total",
            "generation_tokens_total",
            "iteration_count",
        ):
            assert getattr(f, field) == getattr(p, field), field
        assert (f.running, f.waiting) == (mark["running"], mark["waiting"])
        # 0.11 kv_cache_usage_perc has one series per pid; the files tell which pid is current.
        assert f.kv_cache_usage == pytest.approx(mark["kv"])
        assert f.api_server_count == 4 and f.api_server_count_source == "multiproc_files"


def test_reading_files_skips_other_families_and_sums_counters_over_processes(tmp_path):
    truth, _, _, _ = run_with_ticks(tmp_path, n_servers=2, concurrency=4, steps=40, every=40)
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, str(tmp_path / "mp"))
    assert "vllm:request_success_total" in generate_latest(registry).decode()  # in the files...
    samples, per_pid = read_multiproc_dir(str(tmp_path / "mp"))
    names = {s.name for s in samples}
    assert "vllm:request_success_total" not in names  # ...but not read
    assert {"vllm:generation_tokens_total", "vllm:iteration_tokens_total_count"} <= names
    assert sum(c for _, c in per_pid) == truth.observations


def test_a_file_replaced_by_a_new_process_is_indexed_again(tmp_path):
    vllm_sim.run_engine(str(tmp_path), n_servers=2, steps=30, concurrency=4)
    reader = MultiprocReader(str(tmp_path))
    before = reader.read()
    for f in tmp_path.glob("*.db"):  # the engine restarted with the same dir: files start over
        f.unlink()
    truth, _ = vllm_sim.run_engine(str(tmp_path), n_servers=2, steps=10, concurrency=4, seed=3)
    after = reading_from_multiproc(reader)
    assert after.iteration_count == truth.observations
    assert after.generation_tokens_total == truth.generation_tokens
    assert before != reader.read()
