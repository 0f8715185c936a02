"""Engine steps: GPU time inside each step from the closed windows, vLLM step wrapping without side effects."""

from typing import Any

from exporter import wire
from exporter.agent.plugins import _patch_schedule, wrap_step
from exporter.agent.steps import StepTracker
from exporter.analysis.intervals import WindowSummary

MS = 1_000_000
T0 = 1_764_400_000_000_000_000


def test_step_gpu_time_is_the_busy_time_inside_the_step() -> None:
    tracker = StepTracker()
    # the seed: a 72 ms step with 19 ms of GPU work in it, and a second step half outside the window
    tracker.record("vllm", T0, T0 + 72 * MS, tokens=160, seqs=160)
    tracker.record("vllm", T0 + 480 * MS, T0 + 552 * MS)
    packed, _ = wire.pack_intervals([(T0 + 5 * MS, T0 + 24 * MS), (T0 + 490 * MS, T0 + 600 * MS)], T0)
    tracker.attach_gpu(WindowSummary(t0=T0, t1=T0 + 500 * MS, busy_ns=0, iv=packed), dev=0)
    (steps,) = tracker.take()  # only the first step's window has closed
    assert (steps.n, steps.wall, steps.gpu, steps.tokens) == (1, 72 * MS, 19 * MS, 160)
    assert steps.measured == 1  # this process's CUPTI saw the GPU work
    packed2, _ = wire.pack_intervals([(T0 + 500 * MS, T0 + 600 * MS)], T0 + 500 * MS)
    tracker.attach_gpu(WindowSummary(t0=T0 + 500 * MS, t1=T0 + 1000 * MS, busy_ns=0, iv=packed2), dev=0)
    (steps,) = tracker.take()
    assert steps.gpu == 10 * MS + 52 * MS


def test_steps_of_a_process_that_saw_no_gpu_window_are_marked_unmeasured() -> None:
    tracker = StepTracker()  # vLLM's mp executor: EngineCore steps, CUPTI runs in the workers
    tracker.lag_ns = 0
    tracker.record("vllm", T0, T0 + 72 * MS)
    (steps,) = tracker.take()
    assert (steps.n, steps.gpu, steps.measured) == (1, 0, 0)


class FakeEngineCore:
    """Stands in for vLLM's EngineCore: step() returns (outputs, model_executed)."""

    def __init__(self) -> None:
        self.calls = 0

    def step(self, *args: object) -> tuple[dict[int, str], bool]:
        self.calls += 1
        return {0: "out"}, self.calls % 2 == 1


def test_wrapped_step_returns_the_same_result_and_counts_only_model_steps() -> None:
    from exporter import agent

    class Recorder:
        def __init__(self) -> None:
            self.steps = StepTracker()

    rec = Recorder()
    agent._agent = rec
    try:
        wrapped = wrap_step(FakeEngineCore.step, "vllm", lambda core, n: (128 * n, 64 * n))
        core = FakeEngineCore()
        results = [wrapped(core) for _ in range(4)]
    finally:
        agent._agent = None
    assert results == [({0: "out"}, True), ({0: "out"}, False)] * 2
    (s,) = rec.steps.take(final=True)
    assert (s.n, s.tokens, s.seqs) == (2, 256, 128)


def scheduled_by(output: object) -> list[int]:
    """Return the [tokens, sequences] that the patched Scheduler.schedule added up for one call returning output."""

    class Scheduler:
        def schedule(self, throttle_prefills: bool = False) -> object:
            return output

    last = [0, 0]
    _patch_schedule(Scheduler, last)
    assert Scheduler().schedule(throttle_prefills=True) is output
    return last


def test_the_schedule_patch_adds_up_vllm_scheduler_output_or_nothing() -> None:
    class Out:
        def __init__(self) -> None:
            self.total_num_scheduled_tokens = 320
            self.num_scheduled_tokens = {"req-1": 160, "req-2": 160}

    assert scheduled_by(Out()) == [320, 2]
    assert scheduled_by(object()) == [0, 0]
    odd = Out()
    odd.total_num_scheduled_tokens = 3.5  # type: ignore[assignment]
    assert scheduled_by(odd) == [0, 0]  # a total that is not an int is not added


def test_light_steps_are_counted_on_the_engine_thread_and_handed_over_by_the_agent() -> None:
    from exporter import agent
    from exporter.agent import plugins

    class Recorder:
        def __init__(self) -> None:
            self.steps = StepTracker()
            self.steps.per_step = False  # the light agent
            self.steps.lag_ns = 0

    class Core:
        def __init__(self, clock: list[int]) -> None:
            self.clock = clock
            self.calls = 0

        def step(self) -> tuple[dict[int, str], bool]:
            self.calls += 1
            self.clock[0] += 2 * MS if self.calls % 3 else 0  # every third call: no model step
            return {0: "out"}, self.calls % 3 != 0

    now = [T0]
    counts = []

    def counts_of(core: Core) -> tuple[int, int, int, int]:
        counts.append(core.calls)
        return 8, 3, 8, 0

    rec = Recorder()
    agent._agent = rec
    plugins._wrappers.clear()
    try:
        wrapped = wrap_step(
            Core.step, "vllm", lambda core, n: (8 * n, 8 * n), counts_of, clock=lambda: now[0], time_every=1
        )
        core = Core(now)
        for _ in range(30):  # 20 model steps of 2 ms, 10 calls that ran no model
            wrapped(core)
        assert counts == [1]  # the engine's thread handed over its first step only
        plugins.flush_pending(rec.steps, 0, now_ns=now[0])  # the agent's thread, at its tick
        assert counts == [1, 30]
        plugins.flush_pending(rec.steps, 0, now_ns=now[0])  # nothing new: nothing handed over
        assert counts == [1, 30]
        first = rec.steps.take(final=True)
        assert sum(s.n for s in first) == 20 and sum(sum(s.hist) for s in first) == 20
        assert sum(s.wall for s in first) == 20 * 2 * MS
        assert sum(s.tokens for s in first) == 20 * 8 and sum(s.seqs for s in first) == 20 * 8
        now[0] += 3_000 * MS  # past STEP_SAMPLE_NS: the engine's own backstop hands over
        wrapped(core)
        assert counts == [1, 30, 31]
    finally:
        agent._agent = None
        plugins._wrappers.clear()
    totals = rec.steps.take(final=True)
    assert sum(s.n for s in totals) == 1  # the step after the gap
    assert sum(s.wall for s in totals) == 2 * MS and sum(s.tokens for s in totals) == 8
    assert plugins.STEP_SAMPLE_NS >= 1_000_000_000


def test_vllm_steps_handed_over_between_schedule_and_step_lose_no_scheduled_token() -> None:
    """The patched EngineCore: hand-overs by the agent's thread between any two calls keep totals exact."""
    import types

    from exporter import agent
    from exporter.agent import plugins

    class Out:
        def __init__(self, tokens: int, seqs: int) -> None:
            self.total_num_scheduled_tokens = tokens
            self.num_scheduled_tokens = {f"r{i}": 1 for i in range(seqs)}

    class Scheduler:
        def __init__(self) -> None:
            self.batches = [(320, 2), (8, 8), (512, 1), (16, 16)]

        def schedule(self) -> Out:
            return Out(*self.batches.pop(0))

        def get_request_counts(self) -> tuple[int, int]:
            return 2, 0

    class EngineCore:
        def __init__(self) -> None:
            self.scheduler = Scheduler()

        def step(self) -> tuple[dict[int, str], bool]:
            self.scheduler.schedule()
            return {0: "out"}, True

    class Recorder:
        def __init__(self) -> None:
            self.steps = StepTracker()
            self.steps.per_step = False
            self.steps.lag_ns = 0

    saved = set(plugins._patched)
    plugins._patched.discard("vllm_engine")
    plugins._wrappers.clear()
    rec = Recorder()
    agent._agent = rec
    try:
        plugins._patch_vllm_engine_core(types.SimpleNamespace(EngineCore=EngineCore))
        core = EngineCore()
        core.step()  # the first step: handed over by the engine's thread
        plugins.flush_pending(rec.steps, 0)  # nothing new
        core.step()
        core.step()
        plugins.flush_pending(rec.steps, 0)  # the agent's thread: two steps
        core.step()
        plugins.flush_pending(rec.steps, 0)
        totals = rec.steps.take(final=True)
    finally:
        agent._agent = None
        plugins._wrappers.clear()
        plugins._patched.clear()
        plugins._patched.update(saved)
    assert sum(s.n for s in totals) == 4
    assert sum(s.tokens for s in totals) == 320 + 8 + 512 + 16
    assert sum(s.seqs for s in totals) == 2 + 8 + 1 + 16


def _sampling_run(walls_ms: list[float], time_every: int, per_step: bool = False) -> tuple[list[Any], int]:
    """Run a light-wrapped step once per entry of walls_ms (each a model step of that wall time, 0: no
    model step ran); hand over at the end as the agent's thread would. Return the totals and clock reads."""
    from exporter import agent
    from exporter.agent import plugins

    now = [T0]
    reads = [0]

    def clock() -> int:
        reads[0] += 1
        return now[0]

    class Core:
        def __init__(self) -> None:
            self.i = 0

        def step(self) -> tuple[dict[int, str], bool]:
            wall = walls_ms[self.i]
            self.i += 1
            now[0] += round(wall * MS)
            return {}, wall > 0

    class Recorder:
        def __init__(self) -> None:
            self.steps = StepTracker()
            self.steps.per_step = per_step
            self.steps.lag_ns = 0

    rec = Recorder()
    agent._agent = rec
    plugins._wrappers.clear()
    try:
        wrapped = wrap_step(
            Core.step, "vllm", lambda core, n: (n, n), clock=clock, sample_ns=10**15, time_every=time_every
        )
        core = Core()
        for _ in walls_ms:
            wrapped(core)
            now[0] += MS // 10  # the engine's loop between steps
        plugins.flush_pending(rec.steps, 0, now_ns=now[0])
        totals = rec.steps.take(final=True)
    finally:
        agent._agent = None
        plugins._wrappers.clear()
    return totals, reads[0]


def test_light_steps_are_all_counted_and_one_in_time_every_timed() -> None:
    walls = [1.4] * 799 + [0]  # 799 decode steps of 1.4 ms, then a call that ran no model
    totals, reads = _sampling_run(walls, time_every=8)
    assert sum(s.n for s in totals) == 799  # every model step counted
    assert sum(s.tokens for s in totals) == 799
    assert reads <= 2 * (
        799 // 8 + 2
    )  # two clock reads per timed call: one call in 8, the first, the idle one
    assert abs(sum(s.wall for s in totals) - 799 * 1.4 * MS) <= 799  # the timed mean, scaled to all
    every, reads_all = _sampling_run(walls, time_every=1)
    assert sum(s.n for s in every) == 799 and reads_all == 2 * 800


def test_light_sampling_times_every_step_after_a_long_one_and_never_exceeds_the_time_since_the_last_hand_over() -> (
    None
):
    from exporter.agent import plugins

    long_ms = plugins.LONG_STEP_NS / MS
    walls = [long_ms * 2] * 11  # prefill-sized steps: each one timed, their wall exact
    totals, reads = _sampling_run(walls, time_every=8)
    assert sum(s.n for s in totals) == 11 and reads == 22
    assert sum(s.wall for s in totals) == round(22 * long_ms * MS)
    # a long step that happened to be timed among short untimed ones: scaled to all, the estimate
    # would exceed the time that passed; it is cut to that time instead
    walls = [1.0] + [1.0] * 7 + [100.0] + [1.0] * 7 + [1.0] * 24
    totals, _ = _sampling_run(walls, time_every=8)
    assert sum(s.n for s in totals) == 40
    elapsed = sum(walls) * MS + 40 * MS // 10
    assert sum(s.wall for s in totals) <= elapsed


def test_cupti_steps_are_each_timed() -> None:
    walls = [1.4, 2.0, 3.0] * 10
    totals, reads = _sampling_run(walls, time_every=8, per_step=True)
    assert sum(s.n for s in totals) == 30 and reads == 60
    assert sum(s.wall for s in totals) == round(sum(walls) * MS)
