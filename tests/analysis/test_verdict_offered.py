"""Work offered before the engine, the light agent's graph and scheduler figures, the eager bar (issue 9).

Figures from the H200 lab of issue 9 and seed 000: one API server tokenising 60-90k-token prompts
at a full core while the engine's queue reads 0-1; a 0.2-core quota on 4 API servers at 0.05 cores
each; the fix (4 API servers at 0.8-0.9 cores, busy 0.93); eager decode where GPM read 0.85-0.94
and CUPTI 0.61.
"""

from __future__ import annotations

import dataclasses

import pytest

from exporter.analysis import pipeline
from exporter.analysis import verdict as v
from exporter.config import Config, VerdictConfig
from exporter.snapshot import Snapshot
from exporter.snapshot.agent import AgentReading, EngineSteps
from exporter.snapshot.host import CgroupCpu
from exporter.snapshot.totals import GpuVerdict
from tests.fakes.verdict_scenes import Recorder, Scene, series


def last(snaps: list[Snapshot], cfg: Config | None = None, gpu: int = 0) -> v.Verdict:
    """Replay a series through the classifier tick by tick and return the newest verdict of a GPU."""
    out = v.replay(snaps, cfg or Config())
    return next(x for x in out[-1].verdicts if x.gpu == gpu)


def reported(snaps: list[Snapshot], cfg: Config | None = None) -> list[v.Verdict]:
    """Return the reported GPU-0 verdict at every tick."""
    return [next(x for x in s.verdicts if x.gpu == 0) for s in v.replay(snaps, cfg or Config())]


# One API server saturated by tokenising (seed 000): busy 0.45, the engine's queue empty at every tick.
API_BOUND = Scene(busy=0.45, busy_source="gpm", running=0, waiting=0, api_cpu=1.0, graph_share=None)
# The same through the API servers' 0.2-core quota: 4 servers at 0.05 cores each, throttled.
QUOTA_BOUND = Scene(
    busy=0.23,
    busy_source="gpm",
    running=0,
    waiting=0,
    api_servers=4,
    api_cpu=0.05,
    api_process_cpu=0.05,
    api_cgroup="/boundwatch-lab-quota",
    quota_cores=0.2,
    throttled_share=0.9,
    graph_share=None,
)
NOTHING = Scene(busy=0.0, busy_source="gpm", running=0, waiting=0, api_cpu=0.02, graph_share=None)


# --- demand before the engine ---------------------------------------------------------------


def test_empty_queue_beside_a_saturated_api_server_is_host_bound() -> None:
    got = last(series(API_BOUND, 3.0))
    assert got.verdict == "host"
    assert got.reasons[0] == "api_server_saturated"
    assert got.get("running") == 0 and got.get("waiting") == 0
    assert got.get("offered_by") == "api_server"


def test_running_flickering_0_1_beside_a_saturated_api_server_stays_host_bound() -> None:
    rec = Recorder()
    for i in range(12):
        rec.tick(dataclasses.replace(API_BOUND, running=i % 2, gen_tokens_per_s=60.0 * (i % 3 == 0)))
    assert [x.verdict for x in reported(rec.snaps)[2:]] == ["host"] * 10
    assert last(rec.snaps).reasons[0] == "api_server_saturated"


def test_a_single_descheduled_api_server_tick_does_not_read_idle() -> None:
    rec = Recorder()
    rec.run(API_BOUND, 3.0)
    rec.tick(dataclasses.replace(API_BOUND, api_cpu=0.6))  # a neighbour took the core for a tick
    rec.run(API_BOUND, 1.0)
    assert {x.verdict for x in reported(rec.snaps)[2:]} == {"host"}


def test_empty_queue_and_idle_api_servers_is_idle() -> None:
    got = last(series(NOTHING, 3.0))
    assert (got.verdict, got.reasons, got.offered) == ("idle", (), False)
    assert got.get("offered_by") is None


def test_idle_api_servers_in_a_throttled_cgroup_offer_no_work() -> None:
    # A neighbour in the API servers' cgroup runs out of the 1-core quota; the servers use 0.02 cores.
    scene = dataclasses.replace(NOTHING, quota_cores=1.0, throttled_share=0.9, api_process_cpu=0.02)
    assert last(series(scene, 3.0)).verdict == "idle"


def test_a_throttled_sidecar_cgroup_is_not_the_engines() -> None:
    # boundwatch's own cgroup is throttled hard; the engine's processes sit in no quota.
    snaps = series(NOTHING, 3.0)
    snaps = [
        dataclasses.replace(
            s,
            host=dataclasses.replace(
                s.host,  # type: ignore[arg-type]
                own_cgroup=CgroupCpu("/system.slice/boundwatch.service", 0.1, None, i * 0.4, 5 * i, 5 * i),
            ),
        )
        for i, s in enumerate(snaps)
    ]
    assert last(snaps).verdict == "idle"


def test_empty_queue_beside_throttled_api_servers_is_cpu_quota_throttled() -> None:
    got = last(series(QUOTA_BOUND, 3.0))
    assert got.verdict == "host"
    assert got.reasons[0] == "cpu_quota_throttled"
    assert got.get("offered_by") == "cpu_quota"
    assert got.get("api_server_thread_cpu") == pytest.approx(0.05)


def test_counters_read_at_another_cgroup_after_a_quota_moved_are_not_a_delta() -> None:
    """A quota set or lifted can move the cgroup whose cpu.stat counts throttling (an ancestor's binds):
    the readings before and after are two cgroups' counters, not one series, and say nothing."""
    quiet = dataclasses.replace(QUOTA_BOUND, throttled_share=0.0)
    snaps = series(quiet, 3.0)
    assert "cpu_quota_throttled" not in last(snaps).reasons

    def moved(snap: Snapshot) -> Snapshot:  # the slice's counters from here on: far ahead of the leaf's
        engines = tuple(
            dataclasses.replace(
                e,
                cgroups=tuple(
                    dataclasses.replace(
                        c,
                        periods=(c.periods or 0) + 50_000,
                        throttled_periods=(c.throttled_periods or 0) + 40_000,
                        throttled_seconds=(c.throttled_seconds or 0.0) + 900.0,
                        counted_at="/vllm.slice",
                    )
                    for c in e.cgroups
                ),
            )
            for e in snap.engines
        )
        return dataclasses.replace(snap, engines=engines)

    n = len(snaps) - 2
    switched = snaps[:n] + [moved(x) for x in snaps[n:]]
    assert any(c.counted_at for e in switched[-1].engines for c in e.cgroups)
    got = last(switched)
    assert "cpu_quota_throttled" not in got.reasons, got
    assert (got.get("throttled_share") or 0.0) < 0.05


def test_throttling_counted_at_an_ancestor_shows_from_its_second_reading_there() -> None:
    """An ancestor's quota set while the API servers stay in their cgroup: from then on the slice's
    cpu.stat counts the throttling. Its second reading is a series of its own, so the throttling
    shows then, not once the leaf's readings have left the evidence window."""
    quiet = dataclasses.replace(QUOTA_BOUND, throttled_share=0.0)
    snaps = series(quiet, 3.0)
    window = VerdictConfig().window_seconds
    assert len(snaps) > window / 0.5 + 1  # the leaf's readings fill a whole window before the move

    def moved(snap: Snapshot, k: int) -> Snapshot:  # the slice's counters: 50 periods a tick, 45 throttled
        engines = tuple(
            dataclasses.replace(
                e,
                cgroups=tuple(
                    dataclasses.replace(
                        c,
                        periods=80_000 + 50 * k,
                        throttled_periods=60_000 + 45 * k,
                        throttled_seconds=900.0 + 0.4 * k,
                        counted_at="/vllm.slice",
                    )
                    for c in e.cgroups
                ),
            )
            for e in snap.engines
        )
        return dataclasses.replace(snap, engines=engines)

    n = len(snaps) - 2  # the move two ticks before the end: one tick of the slice's own series
    switched = snaps[:n] + [moved(x, k) for k, x in enumerate(snaps[n:])]
    got = v.gather(v.window(switched, window), 0, VerdictConfig())
    assert got.throttled_share == pytest.approx(0.9)
    assert got.throttled_seconds_per_second == pytest.approx(0.8, rel=0.05)
    # at the move itself the slice's one reading is no series yet: nothing is made of the jump
    at_move = v.gather(v.window(switched[: n + 1], window), 0, VerdictConfig())
    assert at_move.throttled_share is None and at_move.throttled_seconds_per_second is None


def test_throttled_api_servers_whose_cgroup_is_unknown_still_offer_work() -> None:
    # Only the engine's cgroup is known (no per-server cgroup path): the servers' CPU fills its quota.
    got = last(series(dataclasses.replace(QUOTA_BOUND, api_cgroup=""), 3.0))
    assert (got.verdict, got.reasons[0]) == ("host", "cpu_quota_throttled")


def test_tokens_flowing_with_an_empty_queue_offer_work() -> None:
    # Short requests admitted and finished between two readings: the gauges read 0, the counters move.
    scene = dataclasses.replace(
        NOTHING, busy=0.3, api_cpu=0.4, gen_tokens_per_s=800.0, prompt_tokens_per_s=9000.0
    )
    got = last(series(scene, 3.0))
    assert (got.verdict, got.get("offered_by")) == ("host", "tokens")


def test_the_fix_four_api_servers_busy_093_is_gpu_bound() -> None:
    scene = Scene(
        busy=0.93, busy_source="gpm", running=1.8, waiting=0, api_servers=4, api_cpu=0.85, graph_share=None
    )
    got = last(series(scene, 3.0))
    assert (got.verdict, got.reasons) == ("gpu", ())
    assert got.get("api_servers") == 4


def test_the_fix_with_busy_in_the_band_keeps_gpu_bound_and_claims_no_saturation() -> None:
    rec = Recorder()
    rec.run(
        Scene(busy=0.93, busy_source="gpm", running=1.8, api_servers=4, api_cpu=0.85, graph_share=None), 3.0
    )
    rec.run(
        Scene(busy=0.80, busy_source="gpm", running=1.7, api_servers=4, api_cpu=0.88, graph_share=None), 3.0
    )
    got = last(rec.snaps)
    assert got.verdict == "gpu"
    assert "api_server_saturated" not in v.host_reasons(
        v.gather(v.window(rec.snaps, 1.5), 0, VerdictConfig()), VerdictConfig()
    )


def test_a_stopped_load_shows_idle_within_three_ticks() -> None:
    rec = Recorder()
    rec.run(API_BOUND, 5.0)
    start = len(rec.snaps)
    # The tick that straddles the stop: the server still ran 0.6 of it, its last tokens went out.
    rec.tick(dataclasses.replace(API_BOUND, api_cpu=0.6, gen_tokens_per_s=400.0))
    rec.run(NOTHING, 3.0)
    vs = [x.verdict for x in reported(rec.snaps)]
    first = next(i for i in range(start, len(vs)) if vs[i] == "idle")
    assert first - start + 1 <= 3
    assert set(vs[first:]) == {"idle"}


def test_seed000_signature_running_rising_45_per_second() -> None:
    # 27% busy, waiting 0, running climbing by about 4.5 requests per second, the API server at 1 core.
    rec = Recorder()
    for i in range(8):
        rec.tick(
            Scene(busy=0.27, busy_source="gpm", running=2.25 * i, waiting=0, api_cpu=1.0, graph_share=None)
        )
    got = last(rec.snaps)
    assert (got.verdict, got.reasons[0]) == ("host", "api_server_saturated")
    assert got.get("running_growth_per_second") == pytest.approx(4.5)


# --- host-bound seconds ---------------------------------------------------------------------


def test_host_bound_seconds_count_while_work_waits_before_the_engine() -> None:
    out = v.replay(series(API_BOUND, 2.0), Config())
    assert out[-1].verdicts[0].offered
    inc = v.accumulate(out[-1], Config())
    assert inc.verdict.host_bound_seconds[0] == pytest.approx(0.5 * 0.55)


def test_the_pipeline_integrates_host_bound_seconds_of_an_empty_queue() -> None:
    # 4 s of seed 000 before the engine through the daemon's own tick: 55% of each tick idle.
    history: list[Snapshot] = []
    for raw in series(API_BOUND, 4.0):
        history.append(pipeline.advance(history, raw, Config()))
    host_bound = history[-1].totals.verdict.host_bound_seconds[0]
    host_ticks = sum(1 for s in history[1:] if s.verdicts[0].offered)
    assert host_ticks == len(history) - 1
    assert host_bound == pytest.approx(0.55 * 0.5 * host_ticks)
    assert history[-1].totals.verdict.bound_seconds[GpuVerdict(0, "idle")] == 0.0


def test_no_host_bound_seconds_when_nothing_is_offered() -> None:
    out = v.replay(series(NOTHING, 2.0), Config())
    inc = v.accumulate(out[-1], Config())
    assert inc.verdict.host_bound_seconds[0] == 0.0


# --- eager decode: the bar for GPM/NVML figures ---------------------------------------------

EAGER = Scene(
    busy=0.90,
    busy_source="gpm",
    running=8,
    waiting=22,
    api_cpu=0.55,
    graph_share=None,
    light=True,
    eager_steps=40,
    step_tokens=320,
    step_seqs=320,
)


def test_eager_decode_at_gpm_090_is_cuda_graph_fallback() -> None:
    got = last(series(EAGER, 3.0))
    assert (got.verdict, got.reasons) == ("host", ("cuda_graph_fallback",))
    assert got.get("graph_step_share") == 0.0
    assert got.get("graph_step_method") == "modes"


def test_graph_decode_at_gpm_090_is_gpu_bound() -> None:
    got = last(series(dataclasses.replace(EAGER, eager_steps=0, graph_steps=40), 3.0))
    assert (got.verdict, got.reasons) == ("gpu", ())
    assert got.get("graph_step_share") == 1.0


@pytest.mark.parametrize("gpm", [0.85, 0.90, 0.94])
def test_eager_decode_across_the_field_gpm_range_is_host_bound(gpm: float) -> None:
    got = last(series(dataclasses.replace(EAGER, busy=gpm), 3.0))
    assert (got.verdict, got.reasons) == ("host", ("cuda_graph_fallback",))


def test_eager_decode_that_fills_the_gpu_is_gpu_bound() -> None:
    assert last(series(dataclasses.replace(EAGER, busy=0.99), 3.0)).verdict == "gpu"


def test_eager_prefill_chunks_are_no_fallback() -> None:
    # 8192-token prefill chunks beyond the capture sizes run eager by design: 8192 tokens per sequence.
    scene = dataclasses.replace(EAGER, eager_steps=20, step_tokens=20 * 8192, step_seqs=20)
    got = last(series(scene, 3.0))
    assert got.verdict == "gpu"
    assert got.get("step_tokens_per_seq") == 8192


def test_eager_from_replays_a_captured_process_that_replays_nothing() -> None:
    # No step modes: the process captured 35 graphs at start, and replays none while 25 steps a tick run.
    scene = dataclasses.replace(EAGER, eager_steps=0, steps_per_tick=25, replays=0, captures=35)
    got = last(series(scene, 3.0))
    assert (got.verdict, got.reasons) == ("host", ("cuda_graph_fallback",))
    assert got.get("graph_step_method") == "replays"


def test_replays_per_step_read_graph_decode() -> None:
    # vLLM PIECEWISE: several replays a step; the share is capped at 1.
    scene = dataclasses.replace(EAGER, eager_steps=0, steps_per_tick=25, replays=25 * 17, captures=35)
    got = last(series(scene, 3.0))
    assert got.verdict == "gpu"
    assert got.get("graph_step_share") == 1.0


def test_replays_against_page_steps_without_agent_steps() -> None:
    # GraphUse without EngineSteps: the page's step counter (25 steps a tick, 20 ms) is the denominator.
    snaps = series(dataclasses.replace(EAGER, eager_steps=0, steps_per_tick=25, replays=0, captures=35), 3.0)
    snaps = [
        dataclasses.replace(s, agent=dataclasses.replace(s.agent, steps=()))  # type: ignore[arg-type]
        for s in snaps
    ]
    got = last(snaps)
    assert got.get("graph_step_method") == "replays"
    assert got.verdict == "host"


def _burst(snaps: list[Snapshot], k: int, steps: float, replays: int, cover: tuple[float, float]) -> Snapshot:
    """Return tick k with the page's step counter at `steps`, and graph counts covering `cover` (s after tick k-1)."""
    s, at0 = snaps[k], snaps[k - 1].at
    e = s.engines[0]
    use = dataclasses.replace(
        s.agent.graphs[0],  # type: ignore[union-attr]
        replays=replays,
        since_ns=int((at0 + cover[0]) * 1e9),
        until_ns=int((at0 + cover[1]) * 1e9),
    )
    return dataclasses.replace(
        s,
        engines=(dataclasses.replace(e, steps=dataclasses.replace(e.steps, total=steps)),),  # type: ignore[arg-type]
        agent=dataclasses.replace(s.agent, steps=(), graphs=(use,)),  # type: ignore[arg-type]
    )


def test_a_burst_whose_replays_are_not_sent_yet_is_no_fallback() -> None:
    """A graph engine stepping in short bursts (held back by its API servers) sends a burst's replays with the next.

    The page shows the burst's 25 steps at once; the agent's message went out at the burst's first
    call (its counts cover all of the tick but its last 30 ms), then nothing came but the quiet agent's zeros.
    Those steps are not known to have replayed nothing: no graph share, no cuda_graph_fallback. Once
    the next burst's first call sends them, the share reads whole. (bench/scenarios quota_api_servers
    on the CPU path read a false fallback in 1-2 of 14 ticks before.)
    """
    scene = dataclasses.replace(EAGER, busy=0.3, eager_steps=0, steps_per_tick=25, replays=0, captures=35)
    snaps = series(scene, 3.0)
    n = len(snaps)
    base = snaps[0].engines[0].steps.total  # type: ignore[union-attr]
    quiet = [_burst(snaps, k, base, 0, (0.0, 0.5)) for k in range(1, n - 3)]  # idle, quiet zeros each tick
    burst = _burst(
        snaps, n - 3, base + 25, 0, (0.0, 0.47)
    )  # sent at the burst's first call, 30 ms before the tick
    after = [_burst(snaps, k, base + 25, 0, (0.0, 0.5)) for k in (n - 2, n - 1)]  # quiet zeros again
    held = [snaps[0], *quiet, burst, *after]
    got = last(held)
    assert "cuda_graph_fallback" not in got.reasons and got.get("graph_step_share") is None
    # the next burst's first call sends the 25 replays, covering the ticks since the first message
    sent = _burst(snaps, n - 1, base + 25, 25, (-1.45, 0.05))
    got = last([*held[:-1], sent])
    assert got.get("graph_step_share") == 1.0 and "cuda_graph_fallback" not in got.reasons
    # a second process on the GPU whose quiet agent covers the burst's tick does not cover the first's
    other = dataclasses.replace(burst.agent.graphs[0], pid=21, since_ns=int(snaps[n - 4].at * 1e9))  # type: ignore[union-attr]
    other = dataclasses.replace(other, until_ns=int(burst.at * 1e9))
    two = dataclasses.replace(
        burst, agent=dataclasses.replace(burst.agent, graphs=(*burst.agent.graphs, other))
    )  # type: ignore[union-attr]
    got = last([snaps[0], *quiet, two, *after])
    assert "cuda_graph_fallback" not in got.reasons and got.get("graph_step_share") is None
    # and an engine that steps on while its quiet agent counts no replay at all still reads eager
    eager = [_burst(snaps, k, base + 25 * k, 0, (0.0, 0.5)) for k in range(1, n)]
    got = last([snaps[0], *eager])
    assert got.get("graph_step_share") == 0.0 and "cuda_graph_fallback" in got.reasons


def test_no_graphs_ever_captured_says_nothing_about_fallback() -> None:
    # Hooks in a process that runs no GPU work (vLLM's EngineCore beside its workers) see 0 captures.
    scene = dataclasses.replace(EAGER, eager_steps=0, steps_per_tick=25, replays=0, captures=0)
    got = last(series(scene, 3.0))
    assert got.verdict == "gpu"
    assert got.get("graph_step_share") is None


def test_cupti_busy_of_eager_decode_keeps_the_usual_thresholds() -> None:
    # With CUPTI the decisive figure (0.61) is exact: host by the usual bar, still cuda_graph_fallback.
    scene = dataclasses.replace(EAGER, busy=0.61, busy_source="cupti", nvml=False)
    got = last(series(scene, 3.0))
    assert (got.verdict, got.busy_source, got.reasons) == ("host", "cupti", ("cuda_graph_fallback",))


def test_switch_from_graph_decode_to_eager_within_three_ticks() -> None:
    rec = Recorder()
    rec.run(dataclasses.replace(EAGER, busy=0.99, eager_steps=0, graph_steps=40), 4.0)
    start = len(rec.snaps)
    rec.run(EAGER, 3.0)
    vs = [x.verdict for x in reported(rec.snaps)]
    assert vs[start - 1] == "gpu"
    first = next(i for i in range(start, len(vs)) if vs[i] == "host")
    assert first - start + 1 <= 3


# --- the agent's scheduler counts and batch limit -------------------------------------------


def test_agent_counts_win_over_the_page() -> None:
    # The page still reads an empty queue; the engine's own scheduler says 3 running, 5 waiting.
    scene = dataclasses.replace(
        NOTHING, busy=0.3, light=True, agent_running=3, agent_waiting=5, agent_pid=451
    )
    got = last(series(dataclasses.replace(scene, engine_pids=(449, 451)), 3.0))
    assert (got.get("running"), got.get("waiting"), got.get("counts_source")) == (3, 5, "agent")
    assert got.verdict == "host"


def test_agent_batch_limit_is_preferred_for_admission_stalled() -> None:
    # The page says 64 (so 60 running looks full); the engine's own max_num_seqs is 256.
    base = Scene(busy=0.3, running=60, max_num_seqs=64, api_cpu=0.3, graph_share=None)
    assert "admission_stalled" not in last(series(base, 3.0)).reasons
    with_agent = dataclasses.replace(base, light=True, agent_running=60, agent_max_num_seqs=256)
    got = last(series(with_agent, 3.0))
    assert got.get("max_batch") == 256
    assert "admission_stalled" in got.reasons


def test_batch_limit_from_the_engine_reading() -> None:
    got = last(series(Scene(busy=0.3, running=100, waiting=0, max_num_seqs=256, api_cpu=0.3), 3.0))
    assert got.reasons == ("admission_stalled",)


def _two_engines(snaps: list[Snapshot], steps: EngineSteps) -> list[Snapshot]:
    """Return the snapshots with a second vLLM engine on GPU 1 and one agent step report."""
    out = []
    for s in snaps:
        a = dataclasses.replace(s.engines[0], gpus=(0,), pids=(100, 101))
        b = dataclasses.replace(s.engines[0], name="vllm:8001", gpus=(1,), pids=(200, 201))
        gpu1 = dataclasses.replace(s.gpus[0], index=1, uuid="GPU-1")
        out.append(
            dataclasses.replace(s, engines=(a, b), gpus=(*s.gpus, gpu1), agent=AgentReading(steps=(steps,)))
        )
    return out


def test_agent_steps_join_their_engine_by_pid() -> None:
    snaps = series(NOTHING, 3.0)
    steps = EngineSteps("vllm", 25, 25 * 20_000_000, 0, gpu_measured=False, pid=201, running=7, waiting=2)
    snaps = _two_engines(snaps, steps)
    assert (last(snaps, gpu=1).get("running"), last(snaps, gpu=1).get("counts_source")) == (7, "agent")
    assert last(snaps, gpu=0).get("running") == 0
    assert last(snaps, gpu=0).verdict == "idle"
    assert last(snaps, gpu=0).get("steps_per_second") is None  # GPU 1's steps do not merge into GPU 0


def test_agent_steps_without_a_pid_do_not_guess_between_two_engines() -> None:
    snaps = series(NOTHING, 3.0)
    steps = EngineSteps("vllm", 25, 25 * 20_000_000, 0, gpu_measured=False, running=7, waiting=2)
    snaps = _two_engines(snaps, steps)
    for gpu in (0, 1):
        assert last(snaps, gpu=gpu).get("counts_source") == "page"


def test_config_rejects_an_inverted_eager_band() -> None:
    from exporter.config import ConfigError

    with pytest.raises(ConfigError):
        VerdictConfig(eager_busy_low=0.98, eager_busy_high=0.97)
    with pytest.raises(ConfigError):
        VerdictConfig(offered_window_seconds=0)
