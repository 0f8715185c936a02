"""The verdict classifier, with the figures of the field reports (shared/seeds/)."""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest

from exporter.analysis import verdict as v
from exporter.config import Config, RooflineConfig, VerdictConfig
from exporter.sampling import retire
from exporter.snapshot import ProbeSummary, Snapshot
from exporter.snapshot.engine import GraphConfig, RawPage
from exporter.snapshot.totals import EMPTY, GpuVerdict
from tests.fakes.verdict_scenes import SEED, Recorder, Scene, series

CFG = VerdictConfig()


def last_verdict(snaps: list[Snapshot], cfg: Config | None = None) -> v.Verdict:
    """Run the classifier tick by tick over a series and return the last GPU-0 verdict."""
    out = v.replay(snaps, cfg or Config())
    return next(x for x in out[-1].verdicts if x.gpu == 0)


SEED_000 = SEED

CASES = [
    # seed 000: 27% busy, waiting 0, 160 running, one API server tokenising 60-90k-token prompts.
    (
        "seed000_api_server",
        Scene(**SEED_000, api_cpu=0.99),
        "host",
        ("api_server_saturated", "admission_stalled"),
    ),
    # seed 000: the container's fractional default quota throttled it.
    (
        "seed000_quota",
        Scene(**SEED_000, api_cpu=0.45, quota_cores=0.5, throttled_share=0.8),
        "host",
        ("cpu_quota_throttled", "admission_stalled"),
    ),
    (
        "seed000_quota_and_api_server",
        Scene(**SEED_000, api_cpu=0.99, quota_cores=1.5, throttled_share=0.4),
        "host",
        ("cpu_quota_throttled", "api_server_saturated", "admission_stalled"),
    ),
    # seed 000 finding 1: capture size counted in tokens, half the batch ran eager.
    (
        "seed000_graph_fallback",
        Scene(busy=0.5, running=64, max_num_seqs=64, api_cpu=0.3, graph_share=0.3),
        "host",
        ("cuda_graph_fallback",),
    ),
    # seed 000 finding 1 without any agent: the command line says max_cudagraph_capture_size=64 (tokens)
    # with speculative depth 1, and 64 sequences run: 128 tokens a decode step, past the captured graphs.
    (
        "seed000_capture_size_in_tokens_without_an_agent",
        Scene(
            busy=0.5,
            busy_source="gpm",
            running=64,
            max_num_seqs=64,
            api_cpu=0.3,
            graph_share=None,
            graph_config=GraphConfig(capture_limit=64, spec_tokens=1, source="max_cudagraph_capture_size"),
        ),
        "host",
        ("cuda_graph_fallback",),
    ),
    # the same flags at 30 sequences (60 tokens): inside the captured sizes, no fallback to claim
    (
        "capture_size_covers_the_batch",
        Scene(
            busy=0.5,
            busy_source="gpm",
            running=30,
            max_num_seqs=64,
            api_cpu=0.3,
            graph_share=None,
            graph_config=GraphConfig(capture_limit=64, spec_tokens=1, source="max_cudagraph_capture_size"),
        ),
        "host",
        ("admission_stalled",),
    ),
    (
        "enforce_eager_without_an_agent",
        Scene(
            busy=0.9,
            busy_source="gpm",
            running=8,
            waiting=22,
            max_num_seqs=8,
            api_cpu=0.1,
            graph_share=None,
            graph_config=GraphConfig(off=True, source="--enforce-eager"),
        ),
        "host",
        ("cuda_graph_fallback",),
    ),
    # seed 000 finding 3: 72 ms steps with 19 ms of GPU work in each.
    (
        "seed000_step_overhead",
        Scene(busy=0.27, running=64, max_num_seqs=64, api_cpu=0.3, step_ms=72, step_gpu_ms=19),
        "host",
        ("step_overhead",),
    ),
    # seed 002: SMs busy at 340 W of 600 W: stalled on memory latency, a kernel problem: GPU-bound.
    ("seed002_sm_busy_low_power", Scene(busy=0.99, running=32, power_w=340, power_limit_w=600), "gpu", ()),
    ("gpu_bound_decode", Scene(busy=0.97, running=64), "gpu", ()),
    ("idle", Scene(busy=0.0, running=0, waiting=0), "idle", ()),
    ("idle_with_busy_gpu_from_another_process", Scene(busy=0.9, running=0, waiting=0), "idle", ()),
    # Requests wait while none run and the GPU idles: the engine's scheduler holds them (a grammar
    # compiling, KV blocks awaited); the queue alone says so, with or without a batch limit.
    (
        "waiting_only_is_work",
        Scene(busy=0.1, running=0, waiting=5, max_num_seqs=None),
        "host",
        ("scheduler_stalled",),
    ),
    (
        "waiting_only_with_a_limit",
        Scene(busy=0.05, running=0, waiting=5, max_num_seqs=64),
        "host",
        ("scheduler_stalled",),
    ),
    (
        "one_running_beside_a_queue_is_no_stall",
        Scene(busy=0.3, running=1, waiting=5, max_num_seqs=64, graph_share=0.95),
        "host",
        ("step_overhead",),
    ),
    # The batch is full and decodes in graphs, yet the GPU idles: the host time is in the engine's own
    # step (scheduling, sampling), which the queue shows without any agent timing the steps.
    (
        "full_batch_starved_gpu_is_step_overhead",
        Scene(busy=0.4, running=256, max_num_seqs=256, api_cpu=0.3, graph_share=0.95),
        "host",
        ("step_overhead",),
    ),
    # Eager decode (issue 9's lab) without an agent: 8 running, 22 waiting, GPU half idle.
    (
        "queued_work_starved_gpu_is_step_overhead",
        Scene(busy=0.5, running=8, waiting=22, max_num_seqs=8, api_cpu=0.1, graph_share=None),
        "host",
        ("step_overhead",),
    ),
    (
        "host_without_a_known_reason",
        Scene(busy=0.4, running=100, max_num_seqs=None, api_cpu=0.3, graph_share=0.95),
        "host",
        ("unknown",),
    ),
    (
        "engine_but_no_busy_source",
        Scene(busy=None, running=10, graph_share=None),
        "unknown",
        ("no_busy_source",),
    ),
    (
        "nothing_at_all",
        Scene(busy=None, engine=False, graph_share=None),
        "unknown",
        ("no_busy_source", "no_engine_source"),
    ),
    (
        "nvml_only_half_busy",
        Scene(busy=0.5, busy_source="nvml", engine=False, graph_share=None),
        "unknown",
        ("no_engine_source",),
    ),
    ("nvml_only_saturated", Scene(busy=0.97, busy_source="nvml", engine=False, graph_share=None), "gpu", ()),
    ("nvml_only_idle", Scene(busy=0.0, busy_source="nvml", engine=False, graph_share=None), "idle", ()),
    # A plain torch process with the agent and no engine: the busy share decides, no queue to read.
    ("agent_without_engine_starved", Scene(busy=0.3, engine=False, graph_share=0.0), "host", ("unknown",)),
    ("agent_without_engine_busy", Scene(busy=0.95, engine=False, graph_share=0.0), "gpu", ()),
    ("agent_without_engine_idle", Scene(busy=0.0, engine=False, graph_share=0.0), "idle", ()),
    # An engine that drives another GPU says nothing about this one.
    (
        "engine_on_other_gpu",
        Scene(busy=0.5, busy_source="nvml", gpus=(1,), graph_share=None),
        "unknown",
        ("no_engine_source",),
    ),
]


@pytest.mark.parametrize(("name", "scene", "verdict", "reasons"), CASES, ids=[c[0] for c in CASES])
def test_classifies_field_cases(name: str, scene: Scene, verdict: str, reasons: tuple[str, ...]) -> None:
    got = last_verdict(series(scene, 3.0))
    assert (got.verdict, got.reasons) == (verdict, reasons)


def test_fresh_device_busy_beats_late_cupti() -> None:
    # Load just started: GPM sees the GPU busy this tick, CUPTI's newest window is still the idle past.
    scene = Scene(busy=0.05, nvml_busy=0.96, running=64)
    assert last_verdict(series(scene, 2.0)).verdict == "gpu"
    assert last_verdict(series(scene, 2.0)).busy_source == "gpm"
    best = Config(verdict=VerdictConfig(busy_source="best"))
    assert last_verdict(series(scene, 2.0), best).verdict == "host"


def test_cupti_decides_without_nvml() -> None:
    got = last_verdict(series(Scene(**SEED, api_cpu=0.99, nvml=False), 2.0))
    assert (got.verdict, got.busy_source) == ("host", "cupti")


def test_agent_steps_counted_as_vllm_belong_to_the_vllm_engine() -> None:
    got = last_verdict(series(Scene(**SEED, api_cpu=0.3, step_ms=72, step_gpu_ms=19), 2.0))
    assert got.get("step_method") == "agent"


def test_steps_timed_without_their_gpu_time_do_not_claim_step_overhead() -> None:
    # vLLM's multiprocess executor: EngineCore times steps, the GPU runs in worker processes.
    scene = Scene(busy=0.27, running=30, max_num_seqs=64, api_cpu=0.3, step_ms=72, step_gpu_ms=19)
    got = last_verdict(series(dataclasses.replace(scene, step_gpu_measured=False), 3.0))
    assert got.get("step_seconds") == pytest.approx(0.072, rel=0.01)
    assert got.get("step_gpu_seconds") is None
    assert got.reasons == ("admission_stalled",)


def test_requests_waiting_with_none_running_are_no_step_overhead() -> None:
    got = last_verdict(series(Scene(busy=0.1, running=0, waiting=5, max_num_seqs=8, api_cpu=0.1), 3.0))
    assert got.verdict == "host" and "step_overhead" not in got.reasons


def test_seed000_evidence_reads_like_the_report() -> None:
    got = last_verdict(series(Scene(**SEED_000, api_cpu=0.99, step_ms=72, step_gpu_ms=19), 3.0))
    assert got.busy_ratio == pytest.approx(0.27)
    assert got.get("running") == 160
    assert got.get("waiting") == 0
    assert got.get("api_server_thread_cpu") == pytest.approx(0.99)
    assert got.get("step_seconds") == pytest.approx(0.072, rel=0.01)
    assert got.get("step_gpu_share") == pytest.approx(19 / 72, rel=0.01)
    assert "step_overhead" in got.reasons


def test_seed002_power_share_is_evidence_not_a_reason() -> None:
    got = last_verdict(series(Scene(busy=0.99, running=32, power_w=340, power_limit_w=600), 2.0))
    assert got.verdict == "gpu"
    assert got.get("power_share") == pytest.approx(340 / 600)


def test_graph_share_does_not_flag_prefill_only_windows() -> None:
    got = last_verdict(
        series(Scene(busy=0.4, running=8, api_cpu=0.3, graph_share=0.1, gen_tokens_per_s=0), 3.0)
    )
    assert "cuda_graph_fallback" not in got.reasons


def test_admission_stalled_needs_a_batch_limit() -> None:
    got = last_verdict(series(Scene(**{**SEED_000, "max_num_seqs": None}, api_cpu=0.3), 3.0))
    assert got.reasons == ("unknown",)
    cfg = Config(verdict=VerdictConfig(max_batch=256))
    got = last_verdict(series(Scene(**{**SEED_000, "max_num_seqs": None}, api_cpu=0.3), 3.0), cfg)
    assert got.reasons == ("admission_stalled",)


def test_one_descheduled_tick_does_not_hide_a_saturated_api_server() -> None:
    rec = Recorder()
    rec.run(Scene(**SEED, api_cpu=0.98), 3.0)
    rec.tick(Scene(**SEED, api_cpu=0.65))  # a neighbour took the core for a moment
    rec.tick(Scene(**SEED, api_cpu=0.97))
    for n in range(len(rec.snaps) - 2, len(rec.snaps) + 1):
        assert "api_server_saturated" in last_verdict(rec.snaps[:n]).reasons


def test_a_process_moved_into_a_throttled_cgroup_shows_on_its_second_tick() -> None:
    rec = Recorder()
    rec.run(Scene(**SEED, api_cpu=0.5), 3.0)  # no quota: no cgroup listed
    rec.tick(Scene(**SEED, api_cpu=0.2, quota_cores=0.2, throttled_share=1.0))
    assert "cpu_quota_throttled" not in last_verdict(rec.snaps).reasons  # one reading: no delta yet
    rec.tick(Scene(**SEED, api_cpu=0.2, quota_cores=0.2, throttled_share=1.0))
    assert last_verdict(rec.snaps).reasons[0] == "cpu_quota_throttled"


def test_throttling_is_a_delta_not_the_cumulative_count() -> None:
    rec = Recorder()
    rec.run(Scene(busy=0.3, running=100, api_cpu=0.5, quota_cores=1.0, throttled_share=0.9), 5.0)
    rec.run(Scene(busy=0.3, running=100, api_cpu=0.5, quota_cores=1.0, throttled_share=0.0), 3.0)
    got = last_verdict(rec.snaps)
    assert got.get("throttled_share") == 0.0
    assert "cpu_quota_throttled" not in got.reasons


# --- hysteresis -----------------------------------------------------------------------------


def verdicts(snaps: list[Snapshot], cfg: Config | None = None) -> list[str]:
    """Return the reported GPU-0 verdict at every tick."""
    return [next(x for x in s.verdicts if x.gpu == 0).verdict for s in v.replay(snaps, cfg or Config())]


def test_band_keeps_gpu_bound() -> None:
    rec = Recorder()
    rec.run(Scene(busy=0.95), 3.0)
    rec.run(Scene(busy=0.78), 5.0)
    assert verdicts(rec.snaps)[-1] == "gpu"


def test_band_keeps_host_bound() -> None:
    rec = Recorder()
    rec.run(Scene(busy=0.3), 3.0)
    rec.run(Scene(busy=0.78), 5.0)
    assert verdicts(rec.snaps)[-1] == "host"


def test_band_from_a_cold_start_takes_the_nearer_side() -> None:
    assert verdicts(series(Scene(busy=0.80), 2.0))[-1] == "gpu"
    assert verdicts(series(Scene(busy=0.74), 2.0))[-1] == "host"


def test_one_odd_tick_does_not_flap() -> None:
    rec = Recorder()
    rec.run(Scene(busy=0.95), 3.0)
    rec.tick(Scene(busy=0.2))  # a GC pause
    rec.run(Scene(busy=0.95), 3.0)
    assert set(verdicts(rec.snaps)) == {"gpu"}


def test_alternating_ticks_never_flap() -> None:
    rec = Recorder()
    for i in range(40):
        rec.tick(Scene(busy=0.95 if i % 2 else 0.3))
    vs = verdicts(rec.snaps)
    changes = sum(a != b for a, b in itertools.pairwise(vs))
    assert changes <= 1


def test_noise_around_a_threshold_does_not_flap() -> None:
    rnd = random.Random(5)
    rec = Recorder()
    for _ in range(200):
        rec.tick(Scene(busy=min(1.0, max(0.0, rnd.gauss(0.85, 0.05)))))
    vs = verdicts(rec.snaps)
    changes = sum(a != b for a, b in itertools.pairwise(vs))
    assert changes <= 4


@pytest.mark.parametrize(
    ("before", "after", "want"),
    [
        (Scene(busy=0.97), Scene(**SEED_000, api_cpu=0.99), "host"),
        (Scene(**SEED_000, api_cpu=0.99), Scene(busy=0.97), "gpu"),
        (Scene(busy=0.97), Scene(busy=0.0, running=0), "idle"),
        (Scene(busy=0.0, running=0), Scene(busy=0.97), "gpu"),
        (Scene(busy=0.0, running=0), Scene(**SEED_000, api_cpu=0.99), "host"),
    ],
)
def test_switch_shows_within_three_ticks(before: Scene, after: Scene, want: str) -> None:
    rec = Recorder()
    rec.run(before, 5.0)
    start = len(rec.snaps)
    # The tick that straddles the change sees half of each.
    mid = dataclasses.replace(after, busy=((before.busy or 0) + (after.busy or 0)) / 2)
    rec.tick(mid)
    rec.run(after, 3.0)
    vs = verdicts(rec.snaps)
    assert vs[start - 1] != want
    first = next(i for i in range(start, len(vs)) if vs[i] == want)
    assert first - start + 1 <= 3  # counting the straddling tick: at most 1.5 s after the change
    assert all(x == want for x in vs[first:])


def test_a_load_hovering_in_the_band_never_flips() -> None:
    rnd = random.Random(7)
    rec = Recorder()
    rec.run(Scene(busy=0.3), 2.0)
    for _ in range(100):
        rec.tick(Scene(busy=rnd.uniform(0.71, 0.84)))
    assert set(verdicts(rec.snaps)) == {"host"}


def test_a_queue_held_in_the_engine_narrows_the_band_so_a_gpu_idling_a_fifth_of_the_time_reads_host() -> None:
    """The H100 lab of session 34, no agent: eager decode after GPU-bound decode, GPM 0.75-0.80, 23 waiting.

    The wide band kept `gpu` there for the whole scenario; a GPU that idles a fifth of the time
    while requests wait for it is not the bottleneck.
    """
    rec = Recorder()
    rec.run(Scene(busy=0.97, running=8, waiting=20, max_num_seqs=8), 3.0)
    start = len(rec.snaps)
    rec.run(Scene(busy=0.79, running=8, waiting=20, max_num_seqs=8, graph_share=None), 3.0)
    vs = verdicts(rec.snaps)
    assert vs[start - 1] == "gpu"
    first = next(i for i in range(start, len(vs)) if vs[i] == "host")
    assert first - start + 1 <= 2 and set(vs[first:]) == {"host"}
    got = last_verdict(rec.snaps)
    assert got.reasons == ("step_overhead",)
    # the wide band as before (queued_busy_low = busy_low): gpu held throughout
    wide = Config(verdict=VerdictConfig(queued_busy_low=CFG.busy_low))
    assert set(verdicts(rec.snaps, wide)[start:]) == {"gpu"}


@pytest.mark.parametrize(
    "held",
    [
        dict(running=250, waiting=0, max_num_seqs=256),  # a full batch, nothing waiting
        dict(running=64, waiting=30, max_num_seqs=256),  # requests waiting
    ],
    ids=["full_batch", "waiting"],
)
def test_either_way_of_holding_work_narrows_the_band(held: dict) -> None:
    rec = Recorder()
    rec.run(Scene(busy=0.95, **held), 3.0)
    rec.run(Scene(busy=0.78, **held), 3.0)
    assert verdicts(rec.snaps)[-1] == "host"


@pytest.mark.parametrize(
    ("waits", "reason"),
    [
        (dict(running=2, waiting=0, api_cpu=0.99), "api_server_saturated"),  # held before the engine
        (dict(running=64, waiting=0, quota_cores=0.5, throttled_share=0.5), "cpu_quota_throttled"),
    ],
    ids=["api_server", "quota"],
)
def test_work_waiting_before_the_engine_narrows_the_band_too(waits: dict, reason: str) -> None:
    """Seed 000's requests stuck before the engine: a GPU at 0.78 after `gpu` waits on the host there too."""
    rec = Recorder()
    rec.run(Scene(busy=0.95, running=64, waiting=0), 3.0)
    start = len(rec.snaps)
    rec.run(Scene(busy=0.78, **waits), 3.0)
    vs = verdicts(rec.snaps)
    assert vs[start - 1] == "gpu" and vs[-1] == "host"
    assert reason in last_verdict(rec.snaps).reasons
    wide = Config(verdict=VerdictConfig(queued_busy_low=CFG.busy_low))
    assert set(verdicts(rec.snaps, wide)[start:]) == {"gpu"}


def test_without_a_queue_the_band_stays_wide() -> None:
    """Running below a full batch and nothing waiting: the band of `busy_low` keeps `gpu` at 0.78."""
    rec = Recorder()
    rec.run(Scene(busy=0.95, running=64, waiting=0, max_num_seqs=256), 3.0)
    rec.run(Scene(busy=0.78, running=64, waiting=0, max_num_seqs=256), 5.0)
    assert set(verdicts(rec.snaps)) == {"gpu"}


def test_with_a_queue_a_gpu_bound_load_keeps_a_band_and_does_not_flap() -> None:
    """Inside the narrowed band (0.83-0.85) gpu holds; GPU-bound decode's own noise (H100/H200 lab: means 0.91-0.99, sd under 0.02) never flips it."""
    rec = Recorder()
    rec.run(Scene(busy=0.95, running=8, waiting=20, max_num_seqs=8), 2.0)
    rec.run(Scene(busy=0.84, running=8, waiting=20, max_num_seqs=8), 3.0)
    assert set(verdicts(rec.snaps)) == {"gpu"}
    rnd = random.Random(11)
    rec = Recorder()
    for _ in range(400):
        rec.tick(Scene(busy=min(1.0, rnd.gauss(0.91, 0.02)), running=8, waiting=20, max_num_seqs=8))
    assert set(verdicts(rec.snaps)) == {"gpu"}


def test_queued_busy_low_is_a_share_and_is_taken_within_the_band() -> None:
    """A share in (0, 1]; a host that lowers its thresholds (busy_high 0.25) keeps working with the default."""
    from exporter.config import ConfigError, load

    for bad in ("0", "1.5", "nan"):
        with pytest.raises(ConfigError, match="queued_busy_low"):
            load(environ={"BOUNDWATCH_VERDICT__QUEUED_BUSY_LOW": bad})
    low = load(environ={"BOUNDWATCH_VERDICT__BUSY_HIGH": "0.25", "BOUNDWATCH_VERDICT__BUSY_LOW": "0.2"})
    f = v.Facts(
        0, busy=0.22, busy_source="gpm", engine=True, offered=True, running_mean=8.0, waiting_mean=9.0
    )
    assert v.thresholds(f, low.verdict) == (0.25, 0.25)  # 0.83 taken at the band's high edge
    f = dataclasses.replace(f, waiting_mean=0.0)
    assert v.thresholds(f, low.verdict) == (0.2, 0.25)


def test_a_straddling_tick_in_between_does_not_restart_the_hold() -> None:
    rec = Recorder()
    rec.run(Scene(busy=0.0, running=0), 3.0)
    rec.tick(Scene(busy=0.5, running=64))  # load began mid-tick: half busy reads host from idle
    rec.tick(Scene(busy=0.97, running=64))
    assert verdicts(rec.snaps)[-1] == "gpu"


def test_held_host_verdict_keeps_current_reasons() -> None:
    rec = Recorder()
    rec.run(Scene(**SEED_000, api_cpu=0.99), 3.0)
    rec.tick(Scene(busy=0.95, running=160, api_cpu=0.99))  # one tick of busy: held as host
    out = v.replay(rec.snaps, Config())
    last = out[-1].verdicts[0]
    assert (last.verdict, last.raw, last.streak) == ("host", "gpu", 1)

    assert "api_server_saturated" in last.reasons


def test_three_tick_hold_needs_three_disagreeing_ticks() -> None:
    rec = Recorder()
    rec.run(Scene(busy=0.97), 3.0)
    rec.run(Scene(**SEED, api_cpu=0.99), 1.0)
    cfg = Config(verdict=VerdictConfig(hold_ticks=3))
    assert verdicts(rec.snaps, cfg)[-1] == "gpu"
    rec.tick(Scene(**SEED, api_cpu=0.99))
    assert verdicts(rec.snaps, cfg)[-1] == "host"


def test_hold_of_one_tick_follows_every_change() -> None:
    rec = Recorder()
    rec.run(Scene(busy=0.95), 2.0)
    rec.tick(Scene(busy=0.2))
    cfg = Config(verdict=VerdictConfig(hold_ticks=1))
    assert verdicts(rec.snaps, cfg)[-1] == "host"


# --- counters and roofline ------------------------------------------------------------------


def test_bound_seconds_follow_the_reported_verdict() -> None:
    out = v.replay(series(Scene(busy=0.97), 3.0), Config())
    inc = v.accumulate(out[-1], Config())
    assert inc.verdict.bound_seconds[GpuVerdict(0, "gpu")] == pytest.approx(0.5)
    assert inc.verdict.bound_seconds[GpuVerdict(0, "host")] == 0.0  # present from the start


def test_host_bound_seconds_use_cupti_idle_time_while_running() -> None:
    out = v.replay(series(Scene(**SEED_000, api_cpu=0.99), 2.0), Config())
    inc = v.accumulate(out[-1], Config())
    assert inc.verdict.host_bound_seconds[0] == pytest.approx(0.5 * 0.73, rel=1e-6)


def test_host_bound_seconds_from_nvml_busy() -> None:
    out = v.replay(series(Scene(busy=0.4, busy_source="nvml", graph_share=None, running=8), 2.0), Config())
    inc = v.accumulate(out[-1], Config())
    assert inc.verdict.host_bound_seconds[0] == pytest.approx(0.5 * 0.6)


def test_host_bound_seconds_count_requests_waiting_with_none_running() -> None:
    # Work offered and nothing admitted: the GPU's idle time is host-bound time too.
    out = v.replay(series(Scene(busy=0.1, running=0, waiting=3), 2.0), Config())
    inc = v.accumulate(out[-1], Config())
    assert inc.verdict.host_bound_seconds[0] == pytest.approx(0.5 * 0.9)


def test_no_host_bound_seconds_when_the_engine_is_empty() -> None:
    out = v.replay(series(Scene(busy=0.1, running=0, waiting=0), 2.0), Config())
    inc = v.accumulate(out[-1], Config())
    assert inc.verdict.host_bound_seconds.get(0, 0.0) == 0.0


def test_roofline_floor_and_achieved_ratio() -> None:
    # seed 000: ~165 GB of weights at ~8 TB/s is a ~20 ms floor; steps took 72 ms.
    cfg = Config(roofline=RooflineConfig(weight_bytes_per_step=165e9, hbm_bandwidth_bytes_per_second=8e12))
    got = last_verdict(series(Scene(**SEED_000, api_cpu=0.99, step_ms=72, step_gpu_ms=19), 3.0), cfg)
    assert got.get("roofline_floor_seconds") == pytest.approx(165e9 / 8e12)
    assert got.get("roofline_achieved_ratio") == pytest.approx(165e9 / 8e12 / 0.072, rel=0.01)


def test_roofline_uses_the_probe_bandwidth() -> None:
    snaps = series(Scene(busy=0.97, running=64, step_ms=25, step_gpu_ms=24), 2.0)
    # the probe's Snapshot.probe
    probe = {"0": ProbeSummary("pass", True, hbm_bandwidth_bytes_per_second=4.2e12)}
    snaps = [dataclasses.replace(s, probe=probe) for s in snaps]
    cfg = Config(roofline=RooflineConfig(weight_bytes_per_step=84e9))
    got = last_verdict(snaps, cfg)
    assert got.get("roofline_floor_seconds") == pytest.approx(0.02)
    assert got.get("roofline_achieved_ratio") == pytest.approx(0.8, rel=0.02)


def test_roofline_counts_the_time_between_steps() -> None:
    # Steps of 1.3 ms each, but only 42 a tick (84/s) because the engine waits on its API server.
    cfg = Config(roofline=RooflineConfig(weight_bytes_per_step=4.4e9, hbm_bandwidth_bytes_per_second=4.28e12))
    scene = Scene(**SEED, api_cpu=0.99, step_ms=1.3, step_gpu_ms=1.1, steps_per_tick=42)
    got = last_verdict(series(scene, 3.0), cfg)
    assert got.get("step_seconds") == pytest.approx(0.0013)
    assert got.get("roofline_achieved_ratio") == pytest.approx(4.4e9 / 4.28e12 * 84, rel=0.01)


def test_engine_steps_over_time_give_a_step_time_without_an_agent() -> None:
    got = last_verdict(series(Scene(busy=0.97, running=64, graph_share=None, step_ms=None), 3.0))
    assert got.get("step_method") == "engine"
    assert got.get("step_seconds") == pytest.approx(0.02)


def test_graph_fallback_shows_with_the_newest_cupti_window() -> None:
    # CUPTI windows come late already: the first eager window flags the fallback, no extra averaging.
    rec = Recorder()
    rec.run(Scene(busy=0.3, running=64, max_num_seqs=64, api_cpu=0.3, graph_share=0.95), 3.0)
    rec.tick(Scene(busy=0.3, running=64, max_num_seqs=64, api_cpu=0.3, graph_share=0.0))
    assert "cuda_graph_fallback" in last_verdict(rec.snaps).reasons


@pytest.mark.parametrize(("runnable", "saturated"), [(0.99, True), (0.47, False)])
def test_api_server_starved_by_a_quota_reads_saturated_from_its_thread_demand(runnable, saturated) -> None:
    # the main thread ran 0.45 of a core; runnable the whole tick means a 0.5-core quota starved it
    rec = Recorder()
    rec.run(Scene(**{**SEED_000, "api_cpu": 0.45, "api_runnable": runnable}), 3.0)
    last = v.replay(rec.snaps, Config())[-1].verdicts[0]
    assert last.verdict == "host"
    assert ("api_server_saturated" in last.reasons) is saturated


def test_facts_of_found_fields_equal_facts_built_by_init() -> None:
    found: dict[str, object] = {"gpu": 3, "busy": 0.4, "engine": True, "running": 7, "span_seconds": 1.5}
    facts = v.Facts.of(found)
    assert facts == v.Facts(**found)  # type: ignore[arg-type]
    assert repr(facts) == repr(v.Facts(**found))  # type: ignore[arg-type]
    assert facts.evidence() == v.Facts(**found).evidence()  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        facts.busy = 0.9  # type: ignore[misc]
    with pytest.raises(TypeError):
        v.Facts.of({"gpu": 0, "bussy": 0.4})
    with pytest.raises(TypeError):
        v.Facts.of({"busy": 0.4})


def test_classify_holds_each_verdict_as_with_the_band_side_and_host_reasons_always_worked_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """classify works out the band's side and the host reasons only where hold reads them: the same Verdicts."""
    cfg = VerdictConfig()
    facts = [
        v.Facts(0, busy=b, busy_source=src, engine=True, offered=offered, api_servers=1, **extra)  # type: ignore[arg-type]
        for b in (0.05, 0.3, 0.45, 0.55, 0.7, 0.95, None)
        for src in ("gpm", "cupti")
        for offered in (True, False)
        for extra in (
            {},
            {"api_server_thread_cpu": 0.99, "waiting_mean": 0.0, "running_mean": 1.0, "max_batch": 64},
        )
    ]
    facts += [v.Facts(0, busy=b, agent=True) for b in (0.01, 0.3, 0.5, 0.9)]
    facts += [v.Facts(0, busy=0.5), v.Facts(0, unplaced="vllm:8000")]
    prevs: list[v.Verdict | None] = [None]
    for verdict, reasons in (
        ("gpu", ()),
        ("host", ("api_server_saturated",)),
        ("idle", ()),
        ("unknown", ("x",)),
    ):
        for streak in (0, 1, 2):
            prevs.append(
                v.Verdict(
                    0, verdict, reasons, 0.5, "gpm", (), raw="gpu" if streak else verdict, streak=streak
                )
            )
    for f in facts:
        monkeypatch.setattr(v, "gather", lambda *a, f=f, **k: f)
        for prev in prevs:
            verdict, reasons = v.decide(f, cfg, prev)
            raw = v.Verdict(
                0,
                verdict,
                reasons,
                f.busy,
                f.busy_source,
                f.evidence(),
                raw=verdict,
                offered=f.offered,
                edges=v.busy_edges(f, cfg, verdict),
            )
            host_now = reasons if verdict == "host" else v.host_reasons(f, cfg)
            want = v.hold(raw, prev, cfg, host_now, v.decide(f, cfg, None)[0])
            want = dataclasses.replace(want, edges=v.busy_edges(f, cfg, want.verdict))
            got = v.classify((), 0, cfg, prev)
            assert got == want and repr(got) == repr(want)


# an engine whose light agent (pid 77) counts its steps in CUDA graphs and its scheduler's counts
LIGHT_ENGINE = Scene(
    busy=0.4, light=True, graph_steps=20, agent_running=8, agent_waiting=0, agent_pid=77, engine_pids=(70, 77)
)


def _spread(
    snaps: list[Snapshot], gpus: int, core_gpus: tuple[tuple[int, tuple[int, ...]], ...] = ()
) -> list[Snapshot]:
    """Return a one-GPU series as an engine driving `gpus` GPUs (tensor parallel), each GPU alike."""
    out = []
    for s in snaps:
        readings = tuple(dataclasses.replace(s.gpus[0], index=i, uuid=f"GPU-{i}") for i in range(gpus))
        engines = tuple(
            dataclasses.replace(e, gpus=tuple(range(gpus)), core_gpus=core_gpus) for e in s.engines
        )
        busy = {i: s.busy[0] for i in range(gpus)} if 0 in s.busy else {}
        out.append(dataclasses.replace(s, gpus=readings, engines=engines, busy=busy))
    return out


def test_the_engine_facts_of_gpus_with_the_same_views_are_worked_out_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each of an engine's GPUs reads the engine's facts from the same views: worked out once a tick, read alike."""
    snaps = _spread(series(dataclasses.replace(LIGHT_ENGINE, api_cpu=0.99), 6.0), 4)
    cfg = Config()
    win = v.window(snaps, v._reach(cfg.verdict))
    # each GPU on its own (a tick of its own, nothing shared): what the shared tick must give
    alone = [v.gather(win, g, cfg.verdict, cfg.roofline) for g in range(4)]
    calls: list[int] = []
    real = v._engine_facts
    monkeypatch.setattr(v, "_engine_facts", lambda *a, **k: calls.append(1) or real(*a, **k))
    tick = v._Tick(win, cfg.verdict)
    shared = [v.gather(win, g, cfg.verdict, cfg.roofline, tick=tick) for g in range(4)]
    assert shared == alone and shared[0].engine and shared[0].api_server_thread_cpu == pytest.approx(0.99)
    assert [f.gpu for f in shared] == [0, 1, 2, 3]
    assert len(calls) == 1  # once for the four GPUs (four times when each GPU worked it out)
    calls.clear()
    assert v.classify_all(snaps, cfg) == tuple(
        v.classify(
            win,
            g,
            cfg.verdict,
            next(p for p in snaps[-2].verdicts if p.gpu == g) if snaps[-2].verdicts else None,
            cfg.roofline,
        )
        for g in range(4)
    )


def test_a_snapshots_views_are_made_once_while_it_stays_in_the_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Tick after tick the window holds the same Snapshots, or copies of them: each GPU's views made once."""
    page = RawPage(samples=())
    snaps = [
        dataclasses.replace(s, engines=tuple(dataclasses.replace(e, raw=page) for e in s.engines))
        for s in _spread(series(LIGHT_ENGINE, 6.0), 4)
    ]
    cfg = Config()
    made: list[tuple[int, int]] = []
    real = v._Drivers._views_of
    monkeypatch.setattr(v._Drivers, "_views_of", lambda d, g: made.append((d.snap.seq, g)) or real(d, g))
    v._DRIVERS.clear()
    start = len(snaps) - 3
    history = list(snaps[:start])
    got = []
    for n in range(start, len(snaps) + 1):
        got.append(v.classify_all(history, cfg))
        # as the pipeline and the history do: the newest kept as a copy (its verdicts and totals set), the
        # one before it retired (its totals and its engines' pages dropped: new engine readings)
        history = [
            *history[:-2],
            *map(retire, history[-2:-1]),
            *(dataclasses.replace(s, totals=EMPTY) for s in history[-1:]),
            *snaps[n : n + 1],
        ]
    assert any(e.raw is None for e in history[-2].engines) and snaps[-1].engines[0].raw is page
    first = len(v.window(snaps[:start], v._reach(cfg.verdict)))
    assert len(made) == len(set(made)) == 4 * (first + 3)  # the window's Snapshots, then one new one a tick
    kept = v._drivers_of(history[-1]).snap  # the parts the drivers read, not the Snapshot with its totals
    assert kept is not history[-1] and kept.totals is not history[-1].totals and kept.verdicts == ()
    # another Snapshot of the same tick whose engines differ by more than their pages is not taken for it
    other = dataclasses.replace(
        history[-1], engines=tuple(dataclasses.replace(e, running=99.0) for e in history[-1].engines)
    )
    assert v._drivers_of(other).snap.engines is other.engines
    v._DRIVERS.clear()  # worked out afresh, tick by tick, the verdicts are the same
    assert got == [v.classify_all(snaps[:n], cfg) for n in range(start, len(snaps) + 1)]


def test_a_retired_snapshot_without_its_agents_raw_windows_finds_its_drivers_and_activity_again() -> None:
    """The history drops a retired Snapshot's raw windows (`sampling.retire`): what the verdict worked out
    of the reading is found again for that copy, and what it keeps holds no raw windows."""
    from exporter import wire
    from exporter.analysis import pipeline
    from exporter.snapshot.agent import AgentReading, AgentWindow, GpuWindows

    ms, t0 = 1_000_000, 1_764_400_000_000_000_000
    snaps = _spread(series(LIGHT_ENGINE, 3.0), 2)
    history: list[Snapshot] = []
    for n, s in enumerate(snaps):
        start = t0 + n * 500 * ms
        iv, slack = wire.pack_intervals([(start + 10 * ms, start + (60 + n) * ms)], start)
        raw = tuple(
            GpuWindows(
                g,
                f"GPU-{g}",
                1,
                (AgentWindow(70, start, start + 500 * ms, (50 + n) * ms, iv=iv, slack_ns=slack),),
            )
            for g in range(2)
        )
        agent = AgentReading(agents=s.agent.agents, steps=s.agent.steps, windows=raw) if s.agent else None
        history.append(pipeline.advance(history, dataclasses.replace(s, agent=agent, verdicts=()), Config()))
    newest = history[-1]
    assert newest.agent is not None and newest.agent.windows and newest.agent.activity
    drivers, index = v._drivers_of(newest), v._activity_of(newest.agent)
    old = retire(newest)
    assert old.agent is not None and old.agent.windows == () and old.agent.activity is newest.agent.activity
    assert v._drivers_of(old) is drivers and v._activity_of(old.agent) is index
    assert drivers.snap.agent is not None and drivers.snap.agent.steps is newest.agent.steps
    held = [o for memo in (v._DRIVERS, v._ACTIVITY_INDEX) for objs, _ in memo._kept.values() for o in objs]
    held += [d.snap.agent for _, d in v._DRIVERS._kept.values()]
    assert held and not any(isinstance(o, AgentReading) and o.windows for o in held)
    assert not any(isinstance(o, tuple) and o and isinstance(o[0], GpuWindows) for o in held)


def test_gpus_of_different_engine_cores_read_their_own_cores_facts() -> None:
    """Under data parallelism each GPU takes its own core's steps: the facts differ and are not shared."""
    scene = dataclasses.replace(LIGHT_ENGINE, engine_pids=(70, 77, 78))
    snaps = _spread(series(scene, 6.0), 2, core_gpus=((77, (0,)), (78, (1,))))
    cfg = Config()
    win = v.window(snaps, v._reach(cfg.verdict))
    tick = v._Tick(win, cfg.verdict)
    got = [v.gather(win, g, cfg.verdict, cfg.roofline, tick=tick) for g in range(2)]
    assert got == [v.gather(win, g, cfg.verdict, cfg.roofline) for g in range(2)]
    # GPU 0 has core 77's counts; GPU 1's core (78) sent none, so it reads the page's
    assert got[0].counts_source == "agent" and got[1].counts_source == "page"


def test_busy_shares_with_no_edge_between_them_give_the_next_tick_the_same_verdict(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`Verdict.edges` are every busy share the next tick can turn on: the NVML source estimates GPM graphics only away from them."""
    cfg = VerdictConfig()
    grid = [i / 200 for i in range(201)]
    kinds: list[dict[str, object]] = [
        {"engine": True, "offered": True, "api_servers": 1},
        {"engine": True, "offered": True, "api_servers": 1, "graph_step_share": 0.1},  # eager decode
        {"engine": True, "offered": True, "running_mean": 8.0, "waiting_mean": 20.0},  # a queue held
        {"engine": True, "offered": True, "running_mean": 8.0, "max_batch": 8},  # a full batch
        {"engine": True, "offered": True, "running_mean": 8.0, "waiting_mean": 20.0, "graph_step_share": 0.1},
        {
            "engine": True,
            "offered": True,
            "api_servers": 1,
            "api_server_thread_cpu": 1.0,
        },  # a saturated API server
        {"engine": True, "offered": True, "throttled_share": 0.5},  # a quota throttling
        {"agent": True},
        {"agent": True, "graph_share": 0.2},
        {},
    ]
    for kind in kinds:
        for prev_verdict, streak in itertools.product(("gpu", "host", "idle", "unknown"), (0, 1)):
            first = v.Facts(0, busy=0.5, busy_source="gpm", **kind)  # type: ignore[arg-type]
            prev = v.Verdict(
                0, prev_verdict, (), 0.5, "gpm", raw="host" if streak else prev_verdict, streak=streak
            )
            edges = v.busy_edges(first, cfg, prev_verdict)
            outcomes = []
            for b in grid:
                f = dataclasses.replace(first, busy=b)
                monkeypatch.setattr(v, "gather", lambda *a, f=f, **k: f)
                got = v.classify((), 0, cfg, prev)
                outcomes.append((b, (got.verdict, got.raw, got.streak)))
            for (b1, o1), (b2, o2) in itertools.pairwise(outcomes):
                if o1 != o2:  # a change between two neighbouring shares: an edge lies between them
                    assert any(b1 < e <= b2 for e in edges), (
                        kind,
                        prev_verdict,
                        streak,
                        b1,
                        b2,
                        o1,
                        o2,
                        edges,
                    )


def test_the_facts_say_where_the_newest_gpm_busy_share_was_estimated_not_read() -> None:
    from exporter.snapshot.gpu import GpmRatios, GpuReading

    def tick(seq: int, estimated: bool) -> Snapshot:
        gpm = GpmRatios(graphics=0.9, sm=0.85, graphics_estimated=estimated)
        gpus = (GpuReading(0, "GPU-0", "H200", "580", utilization=1.0, gpm=gpm),)
        return Snapshot(seq=seq, at=seq * 0.5, mono=seq * 0.5, interval=0.5, dt=0.5, gpus=gpus)

    cfg = VerdictConfig()
    f = v.gather([tick(1, False), tick(2, True)], 0, cfg)
    assert f.busy_source == "gpm" and f.busy_estimated is True
    assert ("busy_estimated", 1.0) in f.evidence()
    assert v.gather([tick(1, True), tick(2, False)], 0, cfg).busy_estimated is None  # the newest was read
