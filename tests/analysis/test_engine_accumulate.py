"""Engine integrals, step counters and saturated seconds per tick, and the engine families rendered."""

from __future__ import annotations

import pytest

from exporter.analysis.engine import accumulate, serve_counts, window_acceptance
from exporter.catalogue import BY_NAME
from exporter.config import Config
from exporter.export import engine as export_engine
from exporter.export.families import render as render_families
from exporter.snapshot import Snapshot
from exporter.snapshot.agent import AgentReading, AgentState, EngineSteps
from exporter.snapshot.engine import EngineReading, ThreadLoad
from exporter.snapshot.host import ProcessCpu, ThreadCpu
from exporter.snapshot.totals import EngineMethod, EngineServer

CFG = Config()


def render(s: Snapshot) -> list:
    return render_families((*export_engine.FAMILIES, *export_engine.INTEGRATED), s)


def server(index: int, pid: int, busiest: float, total: float | None = None) -> ProcessCpu:
    return ProcessCpu(
        pid=pid,
        name=f"VLLM::APIServer_{index}",
        cmdline=(f"VLLM::APIServer_{index}",),
        cpu=busiest if total is None else total,
        busiest_thread=ThreadCpu(pid, "VLLM::APIServer", busiest),
    )


def engine(**kw) -> EngineReading:
    base = {
        "name": "vllm:8000",
        "kind": "vllm",
        "model": "m",
        "api_server_count": 1,
        "api_server_count_source": "page",
    }
    return EngineReading(**{**base, **kw})


def snap(seq: int, dt: float, *engines: EngineReading, agent: AgentReading | None = None) -> Snapshot:
    return Snapshot(seq=seq, at=1e9 + seq, mono=float(seq), interval=0.5, dt=dt, engines=engines, agent=agent)


def test_running_and_waiting_integrate_the_value_held_since_the_previous_tick():
    # The seed: waiting 0 while running sat at 160.
    prev = snap(1, 0.5, engine(running=160, waiting=0))
    cur = snap(2, 0.5, engine(running=164, waiting=2))
    inc = accumulate(cur, CFG, prev).engine
    assert inc.running_request_seconds["vllm:8000"] == 80.0
    assert inc.waiting_request_seconds["vllm:8000"] == 0.0


def test_the_first_tick_and_a_failed_previous_read_add_no_request_seconds():
    assert not accumulate(snap(1, 0.0, engine(running=5)), CFG, None).engine.running_request_seconds
    failed = snap(1, 0.5, engine(error="HTTP 500"))
    assert not accumulate(snap(2, 0.5, engine(running=5)), CFG, failed).engine.running_request_seconds


def test_steps_come_from_the_engine_counters_with_their_method():
    prev = snap(1, 0.5, engine(iteration_count=100))
    inc = accumulate(snap(2, 0.5, engine(iteration_count=124)), CFG, prev).engine
    assert inc.steps[EngineMethod("vllm:8000", "lower_bound")] == 24


def test_the_agents_exact_step_count_replaces_the_estimate():
    prev = snap(1, 0.5, engine(iteration_count=100, api_server_count=4, api_server_count_source="processes"))
    agent = AgentReading(
        steps=(EngineSteps(engine="vllm:8000", steps=7, wall_ns=500_000_000, gpu_busy_ns=1),)
    )
    cur = snap(
        2,
        0.5,
        engine(iteration_count=128, api_server_count=4, api_server_count_source="processes"),
        agent=agent,
    )
    steps = {k.method: v for k, v in accumulate(cur, CFG, prev).engine.steps.items()}
    assert steps == {"agent": 7}


def test_agent_steps_under_the_kind_go_to_the_only_engine_of_that_kind():
    agent = AgentReading(steps=(EngineSteps(engine="vllm", steps=5, wall_ns=1, gpu_busy_ns=1),))
    one = snap(2, 0.5, engine(iteration_count=1), agent=agent)
    assert (
        accumulate(one, CFG, snap(1, 0.5, engine(iteration_count=0))).engine.steps[
            EngineMethod("vllm:8000", "agent")
        ]
        == 5
    )
    two = snap(2, 0.5, engine(iteration_count=1), engine(name="vllm:8001", iteration_count=1), agent=agent)
    steps = accumulate(two, CFG, snap(1, 0.5, engine(iteration_count=0))).engine.steps
    assert not any(k.method == "agent" for k in steps)


def test_a_saturated_api_server_accrues_the_tick_and_an_idle_one_does_not():
    servers = (server(0, 4101, 0.99), server(1, 4102, 0.12))
    cur = snap(2, 0.5, engine(api_servers=servers, api_server_count=2, api_server_count_source="processes"))
    inc = accumulate(cur, CFG, snap(1, 0.5, engine())).engine.api_server_saturated_seconds
    assert inc[EngineServer("vllm:8000", "0")] == 0.5
    assert inc[EngineServer("vllm:8000", "1")] == 0.0


def test_a_server_starved_of_cpu_but_always_runnable_counts_as_saturated():
    starved = ProcessCpu(
        pid=4101,
        name="VLLM::APIServer_0",
        cmdline=("VLLM::APIServer_0",),
        cpu=0.55,
        busiest_thread=ThreadLoad(4101, "VLLM::APIServer", 0.55, runnable=0.97),
        threads=(
            ThreadLoad(4101, "VLLM::APIServer", 0.55, runnable=0.97),
            ThreadLoad(4102, "idle", 0.0, 0.0),
        ),
    )
    cur = snap(2, 0.5, engine(api_servers=(starved,), api_server_count=1))
    inc = accumulate(cur, CFG, snap(1, 0.5, engine())).engine.api_server_saturated_seconds
    assert inc[EngineServer("vllm:8000", "0")] == 0.5


def test_acceptance_is_the_ratio_of_counter_deltas_over_the_window():
    assert window_acceptance([(0.0, 100, 400), (5.0, 160, 480), (10.0, 220, 560)]) == pytest.approx(120 / 160)
    assert window_acceptance([(0.0, 100, 400)]) is None
    assert window_acceptance([(0.0, 100, 400), (1.0, 100, 400)]) is None  # no drafts proposed


def samples(families):
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


def test_render_labels_servers_by_index_never_by_pid_and_uses_catalogue_names():
    servers = (server(0, 4101, 0.99, total=1.4), server(1, 4102, 0.1))
    e = engine(
        running=160,
        waiting=0,
        kv_cache_usage=0.4,
        generation_tokens_total=5e6,
        api_servers=servers,
        api_server_count=2,
        scrape_seconds=0.003,
        spec_acceptance=0.7,
    )
    families = list(render(snap(1, 0.5, e)))
    assert {f.name for f in families} <= set(BY_NAME) | {n.removesuffix("_total") for n in BY_NAME}
    got = samples(families)
    assert got[("boundwatch_api_server_cpu_ratio", (("engine", "vllm:8000"), ("server", "0")))] == 0.99
    assert got[("boundwatch_api_server_process_cpu_ratio", (("engine", "vllm:8000"), ("server", "0")))] == 1.4
    assert got[("boundwatch_engine_requests_running", (("engine", "vllm:8000"),))] == 160
    assert got[("boundwatch_engine_generation_tokens_total", (("engine", "vllm:8000"),))] == 5e6
    assert got[("boundwatch_engine_info", (("engine", "vllm:8000"), ("kind", "vllm"), ("model", "m")))] == 1
    assert not any("4101" in str(k) for k in got)


def test_render_drops_stale_figures_of_a_failed_read():
    got = samples(render(snap(1, 0.5, engine(running=None, error="HTTP 500"))))
    assert not any(k[0] == "boundwatch_engine_requests_running" for k in got)
    assert got[("boundwatch_engine_info", (("engine", "vllm:8000"), ("kind", "vllm"), ("model", "m")))] == 1


# --- running / waiting served by the agent's counts (analysis.engine.serve_counts) -------------


def core(pid: int, running: float | None, waiting: float | None, dp: int | None = None, **kw) -> EngineSteps:
    return EngineSteps(
        engine="vllm", steps=kw.pop("steps", 5), wall_ns=1, gpu_busy_ns=0, pid=pid, dp_rank=dp,
        running=running, waiting=waiting, **kw,
    )  # fmt: skip


def live(*pids: int, state: str = "running") -> tuple[AgentState, ...]:
    return tuple(AgentState(pid=p, gpu=0, state=state) for p in pids)


def served(prev: Snapshot | None, cur: Snapshot) -> Snapshot:
    return serve_counts(cur, prev)


def test_each_data_parallel_core_keeps_its_newest_counts_while_its_agent_lives():
    e = engine(pids=(10, 11, 12), running=99.0, waiting=9.0)
    one = served(
        None,
        snap(
            1, 0.5, e, agent=AgentReading(agents=live(11, 12), steps=(core(11, 4, 1, 0), core(12, 6, 0, 1)))
        ),
    )
    assert (one.engines[0].counts_source, one.engines[0].running, one.engines[0].waiting) == (
        "agent",
        10.0,
        1.0,
    )
    # rank 1 steps on; rank 0 sends nothing this tick: its counts are held, not dropped nor taken from the page
    two = served(one, snap(2, 0.5, e, agent=AgentReading(agents=live(11, 12), steps=(core(12, 2, 3, 1),))))
    assert (two.engines[0].running, two.engines[0].waiting) == (4.0 + 2.0, 1.0 + 3.0)
    # rank 0's agent goes stale: only rank 1's counts remain
    three = served(two, snap(3, 0.5, e, agent=AgentReading(agents=(*live(11, state="stale"), *live(12)))))
    assert (three.engines[0].running, three.engines[0].waiting) == (2.0, 3.0)
    # rank 1 steps without counts (its scheduler can no longer be read): the page serves again
    four = served(
        three, snap(4, 0.5, e, agent=AgentReading(agents=live(11, 12), steps=(core(12, None, None, 1),)))
    )
    assert (four.engines[0].counts_source, four.engines[0].running) == ("page", 99.0)


def test_sglang_tensor_parallel_schedulers_count_their_shared_batch_once_across_ticks():
    e = engine(name="sglang:30000", kind="sglang", pids=(20, 21, 22))
    tp = AgentReading(agents=live(21, 22), steps=(core(21, 8, 2, 0), core(22, 8, 2, 0)))
    one = served(None, snap(1, 0.5, e, agent=tp))
    assert (one.engines[0].running, one.engines[0].waiting) == (8.0, 2.0)
    # only the second TP scheduler reports this tick: it replaces the batch's counts, never adds to them
    two = served(one, snap(2, 0.5, e, agent=AgentReading(agents=live(21, 22), steps=(core(22, 5, 0, 0),))))
    assert (two.engines[0].running, two.engines[0].waiting) == (5.0, 0.0)
    # both agents say they stopped (their process exits): the page serves again
    gone = served(two, snap(3, 0.5, e, agent=AgentReading(agents=live(21, 22, state="stopped"))))
    assert (gone.engines[0].counts_source, gone.engines[0].running) == ("page", None)


def test_a_page_carried_between_slow_reads_serves_no_counts_of_its_own():
    carried = engine(running=99.0, waiting=9.0, page_read=False, page_age_seconds=4.5)
    out = served(None, snap(1, 0.5, carried, agent=AgentReading()))
    assert (out.engines[0].counts_source, out.engines[0].running, out.engines[0].waiting) == (
        "page",
        None,
        None,
    )


def test_agent_request_seconds_replace_the_pages_and_a_change_of_source_adds_nothing_twice():
    page = served(None, snap(1, 0.5, engine(pids=(10, 11), running=50.0, waiting=5.0), agent=AgentReading()))
    steps = (core(11, 3, 1, running_seconds=1.25, waiting_seconds=0.5),)
    agent = served(
        page,
        snap(2, 0.5, engine(pids=(10, 11), running=50.0), agent=AgentReading(agents=live(11), steps=steps)),
    )
    inc = accumulate(agent, CFG, page).engine
    # the page's 50 held over the tick would add 25: the agent's steps add what they integrated
    assert inc.running_request_seconds["vllm:8000"] == 1.25
    assert inc.waiting_request_seconds["vllm:8000"] == 0.5
    back = served(agent, snap(3, 0.5, engine(pids=(10, 11), running=50.0), agent=AgentReading()))
    assert back.engines[0].counts_source == "page"
    assert "vllm:8000" not in accumulate(back, CFG, agent).engine.running_request_seconds


def test_only_counts_from_the_engines_own_processes_replace_its_page():
    # joined by name alone (an engine configured by URL, no process table): the page keeps serving
    by_name = served(
        None, snap(1, 0.5, engine(running=50.0), agent=AgentReading(agents=live(11), steps=(core(11, 3, 1),)))
    )
    assert (by_name.engines[0].counts_source, by_name.engines[0].running) == ("page", 50.0)
    by_pid = served(
        None,
        snap(
            1,
            0.5,
            engine(running=50.0, pids=(10, 11)),
            agent=AgentReading(agents=live(11), steps=(core(11, 3, 1),)),
        ),
    )
    assert (by_pid.engines[0].counts_source, by_pid.engines[0].running) == ("agent", 3.0)
