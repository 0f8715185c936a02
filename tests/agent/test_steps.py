"""Engine steps: GPU time inside each step from the closed windows, vLLM step wrapping without side effects."""

from exporter import wire
from exporter.agent.plugins import scheduled_batch, wrap_step
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
        wrapped = wrap_step(FakeEngineCore.step, "vllm", lambda core: (128, 64))
        core = FakeEngineCore()
        results = [wrapped(core) for _ in range(4)]
    finally:
        agent._agent = None
    assert results == [({0: "out"}, True), ({0: "out"}, False)] * 2
    (s,) = rec.steps.take(final=True)
    assert (s.n, s.tokens, s.seqs) == (2, 256, 128)


def test_scheduled_batch_reads_vllm_scheduler_output_or_gives_zero() -> None:
    class Out:
        def __init__(self) -> None:
            self.total_num_scheduled_tokens = 320
            self.num_scheduled_tokens = {"req-1": 160, "req-2": 160}

    assert scheduled_batch(Out()) == (320, 2)
    assert scheduled_batch(object()) == (0, 0)
