"""The NVML source against a stand-in driver: units, GPM, clock events, rare energy reads, failures."""

import pytest

from exporter.analysis import busy
from exporter.config import NvmlConfig
from exporter.snapshot import Snapshot
from exporter.snapshot.verdict import Verdict
from exporter.sources.base import SourceUnavailable
from exporter.sources.nvml import GraphicsGate, NvmlSource
from tests.fakes.clock import Clock
from tests.fakes.nvml_standin import FakeGpu, FakeNvml


def test_reading_converts_to_base_units_like_the_h200_under_a_matmul():
    src = NvmlSource(NvmlConfig(), nvml=FakeNvml())  # type: ignore[arg-type]
    src.read_blocking()  # first GPM sample pair
    (g,) = src.read_blocking()
    assert g.name == "NVIDIA H200" and g.driver == "580.159.04"
    assert g.power_watts == pytest.approx(695.0)
    assert g.power_limit_watts == pytest.approx(700.0)
    assert g.sm_clock_hz == pytest.approx(1.44e9)
    assert g.sm_clock_max_hz == pytest.approx(1.98e9)
    assert g.utilization == pytest.approx(1.0)
    assert g.energy_joules == pytest.approx(123_456.789)
    assert g.memory_total_bytes == 143_771 * 2**20
    assert g.clock_events()["sw_power_cap"] is True
    assert g.clock_events()["hw_thermal_slowdown"] is False
    assert g.gpm is not None
    assert g.gpm.graphics == pytest.approx(0.987)
    assert g.gpm.sm == pytest.approx(0.952)
    assert g.gpm.tensor == pytest.approx(0.924)
    assert g.errors == ()


def test_energy_is_read_only_every_energy_interval():
    nvml, clock = FakeNvml(), Clock()
    src = NvmlSource(NvmlConfig(energy_every_seconds=10.0), nvml=nvml, clock=clock)  # type: ignore[arg-type]
    for _ in range(20):  # 10 s of 0.5 s ticks
        src.read_blocking()
        clock.t += 0.5
    assert nvml.calls["energy"] == 1
    clock.t += 0.1
    src.read_blocking()
    assert nvml.calls["energy"] == 2


def test_unsupported_field_is_none_without_an_error_and_lost_gpu_reports_errors():
    nvml = FakeNvml([FakeGpu(no_power=True), FakeGpu(uuid="GPU-2", lost=True)])
    src = NvmlSource(NvmlConfig(gpm=False), nvml=nvml)  # type: ignore[arg-type]
    first, second = src.read_blocking()
    assert first.power_watts is None and first.errors == ()
    assert second.power_watts is None and second.sm_clock_hz is None
    assert any("GpuIsLost" in e for e in second.errors)
    assert first.gpm is None


def test_gpu_without_gpm_support_has_no_gpm_ratios():
    src = NvmlSource(NvmlConfig(), nvml=FakeNvml(gpm=False))  # type: ignore[arg-type]
    src.read_blocking()
    (g,) = src.read_blocking()
    assert g.gpm is None and g.utilization == pytest.approx(1.0)


def test_no_driver_is_unavailable_and_init_is_retried_only_after_30_s():
    nvml, clock = FakeNvml(driver_present=False), Clock()
    src = NvmlSource(NvmlConfig(), nvml=nvml, clock=clock)  # type: ignore[arg-type]
    with pytest.raises(SourceUnavailable, match="LibraryNotFound"):
        src.read_blocking()
    clock.t += 10
    with pytest.raises(SourceUnavailable):
        src.read_blocking()
    assert nvml.calls["init"] == 1
    nvml.driver_present = True
    clock.t += 25
    (g,) = src.read_blocking()
    assert nvml.calls["init"] == 2 and g.power_watts == pytest.approx(695.0)


def test_close_frees_gpm_samples_and_shuts_nvml_down():
    nvml = FakeNvml()
    src = NvmlSource(NvmlConfig(), nvml=nvml)  # type: ignore[arg-type]
    src.read_blocking()
    src.read_blocking()
    assert nvml.samples_alive == 2
    src.close()
    assert nvml.samples_alive == 0 and nvml.shutdown


def test_real_pynvml_without_a_driver_reports_unavailable():
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    with pytest.raises(SourceUnavailable, match="NVML unavailable"):
        NvmlSource(NvmlConfig()).read_blocking()


class RefusingNvml(FakeNvml):
    """A driver that is there but refuses us (no permission on /dev/nvidia*)."""

    def nvmlInit(self) -> None:
        from tests.fakes.nvml_standin import NVMLError

        raise NVMLError("Insufficient Permissions")


@pytest.mark.parametrize(
    ("nvml", "errors"),
    [(RefusingNvml(), 4), (FakeNvml(driver_present=False), 0)],
    ids=["refused: counted every tick", "no driver on this host: a state, not an error"],
)
async def test_source_errors_count_every_tick_nvml_is_refused_and_the_log_says_it_once(nvml, errors):
    from structlog.testing import capture_logs

    from exporter.config import Config
    from exporter.sampling import Sampler

    clock = Clock()
    src = NvmlSource(NvmlConfig(), nvml=nvml, clock=clock)  # type: ignore[arg-type]
    sampler = Sampler(Config(), [src], clock=clock)
    with capture_logs() as logs:
        try:
            for _ in range(4):
                snap = await sampler.tick()
                clock.t += 0.5
        finally:
            src.close()
    (status,) = snap.sources
    assert (status.up, status.errors_total) == (False, errors)
    assert [e["event"] for e in logs if e["event"].startswith("source_")] == ["source_down"]


def test_the_power_limit_is_read_every_static_interval_and_when_the_clock_events_change():
    gpu = FakeGpu()
    nvml, clock = FakeNvml([gpu]), Clock()
    src = NvmlSource(NvmlConfig(), nvml=nvml, clock=clock)  # type: ignore[arg-type]

    def limits(ticks: int) -> list[float | None]:
        out = []
        for _ in range(ticks):
            out.append(src.read_blocking()[0].power_limit_watts)
            clock.t += 0.5
        return out

    assert limits(4) == [700.0] * 4 and nvml.calls["power_limit"] == 1
    gpu.limit_mw, gpu.reasons = 500_000, 0x4 | 0x80  # an administrator lowers the limit: a new mask
    assert limits(1) == [500.0]  # read at once
    gpu.limit_mw = 450_000  # the same mask: seen when the interval has passed
    assert limits(20) == [500.0] * 19 + [450.0]
    assert nvml.calls["power_limit"] == 3


def test_gpm_ratios_follow_each_tick_with_one_request_built_once():
    gpu = FakeGpu()
    src = NvmlSource(NvmlConfig(), nvml=FakeNvml([gpu]))  # type: ignore[arg-type]
    src.read_blocking()
    first = src.read_blocking()[0].gpm
    gpu.gpm = {1: 50.0, 2: 40.0}  # tensor and the others: not supported now
    second = src.read_blocking()[0].gpm
    assert first is not None and second is not None
    assert first.tensor == pytest.approx(0.924)
    assert (second.graphics, second.sm, second.tensor, second.dram) == (
        pytest.approx(0.5),
        pytest.approx(0.4),
        None,
        None,
    )


def test_gpm_every_third_tick_carries_the_last_ratios_between_reads():
    gpu = FakeGpu()
    nvml = FakeNvml([gpu])
    gets = _count_gets(nvml)
    src = NvmlSource(NvmlConfig(gpm_every_ticks=3, graphics_estimate=False), nvml=nvml)  # type: ignore[arg-type]
    first = [src.read_blocking()[0].gpm for _ in range(2)]
    gpu.gpm = {1: 50.0, 2: 40.0}
    later = [src.read_blocking()[0].gpm for _ in range(5)]
    assert gets == {"all": 3, "lean": 0, "graphics": 0}  # ticks 1, 4 and 7 of 7
    assert first[0] is not None and first[0].graphics == pytest.approx(0.987)
    assert first[1] is first[0]  # carried: the verdict's busy source stays GPM
    assert later[0] is first[0]  # tick 3: not due yet, the change not seen
    assert later[1] is not None and later[1].graphics == pytest.approx(0.5) and later[1].tensor is None
    assert later[2] is later[1] and later[3] is later[1]
    assert later[4] is not None and later[4] is not later[1] and later[4].graphics == pytest.approx(0.5)


def test_gpm_read_every_tick_by_default_the_gate_asking_for_graphics_apart():
    gpu = FakeGpu()
    nvml = FakeNvml([gpu])
    gets = _count_gets(nvml)
    assert NvmlConfig().graphics_estimate  # the default since the H200 lab ran with it (session 26)
    src = NvmlSource(NvmlConfig(), nvml=nvml)  # type: ignore[arg-type]
    for _ in range(4):
        src.read_blocking()
    assert gets == {"all": 0, "lean": 4, "graphics": 4}  # the gate, no verdict yet: GRAPHICS_UTIL each tick
    src = NvmlSource(NvmlConfig(graphics_estimate=False), nvml=nvml)  # type: ignore[arg-type]
    for _ in range(4):
        src.read_blocking()
    assert gets == {"all": 4, "lean": 4, "graphics": 4}  # the gate off, a busy GPU: every metric in one call


def _count_gets(nvml: FakeNvml) -> dict[str, int]:
    """Count the stand-in's nvmlGpmMetricsGet calls: every metric, all but GRAPHICS_UTIL, it alone."""
    gets = {"all": 0, "lean": 0, "graphics": 0}
    real = nvml.nvmlGpmMetricsGet

    def counted(req):
        ids = {req.metrics[i].metricId for i in range(req.numMetrics)}
        graphics = nvml.NVML_GPM_METRIC_GRAPHICS_UTIL in ids
        gets["lean" if not graphics else "graphics" if len(ids) == 1 else "all"] += 1
        return real(req)

    nvml.nvmlGpmMetricsGet = counted  # type: ignore[method-assign]
    return gets


def test_graphics_is_asked_for_only_where_an_sm_was_active_in_the_window():
    gpu = FakeGpu()
    nvml = FakeNvml([gpu])
    gets = _count_gets(nvml)
    src = NvmlSource(NvmlConfig(graphics_estimate=False), nvml=nvml)  # type: ignore[arg-type]
    src.read_blocking()
    gpu.gpm = {1: 0.004, 2: 0.0, 3: 0.0, 5: 0.0, 10: 0.0}  # no SM active: GRAPHICS_UTIL not asked for
    idle = [src.read_blocking()[0].gpm for _ in range(3)]
    assert gets == {"all": 2, "lean": 2, "graphics": 0}  # the first idle window found in the one call
    assert all(g is not None and g.graphics == 0.0 and g.sm == 0.0 for g in idle)
    gpu.gpm = {1: 12.5, 2: 0.01}  # one SM a moment: asked for again, the same tick
    (busy,) = src.read_blocking()
    assert busy.gpm is not None and busy.gpm.graphics == pytest.approx(0.125)
    assert gets == {"all": 2, "lean": 3, "graphics": 1}
    gpu.gpm = {1: 33.0}  # SM_UTIL not supported: GRAPHICS_UTIL read every tick
    (unknown,) = src.read_blocking()
    assert unknown.gpm is not None and unknown.gpm.graphics == pytest.approx(0.33) and unknown.gpm.sm is None
    assert gets == {"all": 3, "lean": 3, "graphics": 1}


def test_gpm_without_graphics_leaves_the_busy_share_to_utilization():
    nvml = FakeNvml([FakeGpu(util=42)])
    gets = _count_gets(nvml)
    src = NvmlSource(NvmlConfig(gpm_graphics=False), nvml=nvml)  # type: ignore[arg-type]
    src.read_blocking()
    (g,) = src.read_blocking()
    assert gets == {"all": 0, "lean": 2, "graphics": 0}
    assert g.gpm is not None and g.gpm.graphics is None and g.gpm.sm == pytest.approx(0.952)
    snap = Snapshot(seq=1, at=0.0, mono=0.0, interval=0.5, dt=0.5, gpus=(g,))
    assert busy.for_verdict(snap, 0) == (pytest.approx(0.42), "nvml")


def _following(src: NvmlSource, edges: tuple[float, ...] = (0.70, 0.85)) -> None:
    """Hand the source a Snapshot whose verdict on GPU 0 could turn at these busy shares."""
    src.follow(
        Snapshot(seq=1, at=0.0, mono=0.0, interval=0.5, dt=0.5, verdicts=(Verdict(0, "gpu", edges=edges),))
    )


def _gated() -> tuple[FakeGpu, dict[str, int], NvmlSource]:
    """A busy stand-in GPU, its GPM requests counted, and a gated source whose verdict could turn at 0.70 and 0.85."""
    gpu = FakeGpu()
    nvml = FakeNvml([gpu])
    gets = _count_gets(nvml)
    src = NvmlSource(NvmlConfig(graphics_estimate=True), nvml=nvml)  # type: ignore[arg-type]
    _following(src)
    return gpu, gets, src


def test_a_busy_gpu_far_from_every_edge_reads_graphics_every_eighth_tick_and_marks_the_estimates():
    _, gets, src = _gated()  # GRAPHICS_UTIL 0.987, SM_UTIL 0.952: far from 0.70 and 0.85
    ticks = [src.read_blocking()[0].gpm for _ in range(17)]
    assert gets == {"all": 0, "lean": 17, "graphics": 3}  # reads 1, 9 and 17
    read = [i for i, g in enumerate(ticks) if g is not None and not g.graphics_estimated]
    assert read == [0, 8, 16]
    assert all(g is not None and g.graphics == pytest.approx(0.987) for g in ticks)  # the ratio holds


def test_graphics_is_read_where_sm_moved_or_the_estimate_nears_an_edge():
    gpu, gets, src = _gated()
    src.read_blocking()  # read: nothing to carry yet
    gpu.gpm = {1: 96.0, 2: 93.0}  # SM moved 0.022: estimated, 0.93 x 0.987 / 0.952
    (g,) = src.read_blocking()
    assert g.gpm is not None and g.gpm.graphics_estimated
    assert g.gpm.graphics == pytest.approx(0.93 * 0.987 / 0.952)
    gpu.gpm = {1: 80.0, 2: 70.0}  # SM moved 0.25: read
    (g,) = src.read_blocking()
    assert g.gpm is not None and not g.gpm.graphics_estimated and g.gpm.graphics == pytest.approx(0.80)
    assert gets["graphics"] == 2
    gpu.gpm = {1: 81.0, 2: 71.0}  # moved 0.01, but 0.71 x 0.80 / 0.70 = 0.811 is within 0.10 of 0.85: read
    (g,) = src.read_blocking()
    assert g.gpm is not None and not g.gpm.graphics_estimated and gets["graphics"] == 3
    _following(src, edges=(0.02,))  # the verdict now turns only at 0.02: the estimate stands in
    (g,) = src.read_blocking()
    assert g.gpm is not None and g.gpm.graphics_estimated and gets["graphics"] == 3
    src.follow(Snapshot(seq=2, at=0.0, mono=0.0, interval=0.5, dt=0.5))  # no verdict: read
    (g,) = src.read_blocking()
    assert g.gpm is not None and not g.gpm.graphics_estimated and gets["graphics"] == 4


def test_an_idle_gpu_carries_no_ratio_into_its_next_busy_tick():
    gpu, gets, src = _gated()
    src.read_blocking()
    gpu.gpm = {1: 0.0, 2: 0.0}
    (idle,) = src.read_blocking()
    assert idle.gpm is not None and idle.gpm.graphics == 0.0 and not idle.gpm.graphics_estimated
    gpu.gpm = {1: 3.0, 2: 2.0}  # a little work: SM moved only 0.02 from the idle read, but no ratio: read
    (g,) = src.read_blocking()
    assert g.gpm is not None and not g.gpm.graphics_estimated and g.gpm.graphics == pytest.approx(0.03)
    assert gets == {"all": 0, "lean": 3, "graphics": 2}


def test_graphics_gate_reads_within_the_margin_of_any_edge_and_estimates_at_most_one():
    gate = GraphicsGate()
    assert gate.estimate(0, 0.5, (0.70, 0.85)) is None  # nothing read yet
    gate.read(0, 0.5, 0.6)
    assert gate.estimate(1, 0.5, None) is None  # no verdict known
    assert gate.estimate(1, 0.5, (0.70, 0.85)) is None  # 0.60 is 0.10 from 0.70: at the margin, read
    assert gate.estimate(1, 0.5, (0.85,)) == pytest.approx(0.6)
    assert gate.estimate(8, 0.5, (0.85,)) is None  # eight reads on
    assert gate.estimate(1, 0.56, (0.85,)) is None  # SM moved more than 0.05
    gate.read(2, 0.5, 0.99)
    assert gate.estimate(3, 0.54, ()) == 1.0  # 0.54 x 1.98, capped: 0.01 from the figure read
    gate.read(4, 0.5, 0.6)  # a ratio of 1.2
    assert gate.estimate(5, 0.54, ()) == pytest.approx(0.648)  # moved 0.048 from the figure read
    assert gate.estimate(5, 0.545, ()) is None  # SM moved 0.045, but the estimate 0.054: read


def test_a_small_move_of_sm_that_a_large_ratio_magnifies_is_read_not_estimated():
    gate = GraphicsGate()
    gate.read(0, 0.002, 0.05)  # nearly idle: a ratio of 25
    assert gate.estimate(1, 0.003, (0.70, 0.775)) == pytest.approx(0.075)  # moved 0.025: estimated
    assert gate.estimate(1, 0.03, (0.70, 0.775)) is None  # SM moved 0.028 (< 0.05), the estimate 0.70: read


def test_the_self_tests_idle_bar_is_an_edge_too_where_the_probe_runs():
    # a GPU at ~0.30 after an `idle` verdict (edges: the band's midpoint and 0.02); an operator raised
    # probe.idle_busy_max to 0.30: whether the self-test may run turns on that share, so it is read
    def gated(also: tuple[float, ...]) -> tuple[FakeGpu, dict[str, int], NvmlSource]:
        gpu = FakeGpu()
        nvml = FakeNvml([gpu])
        gets = _count_gets(nvml)
        src = NvmlSource(NvmlConfig(graphics_estimate=True), nvml=nvml, also_edges=also)  # type: ignore[arg-type]
        _following(src, edges=(0.02, 0.775))
        gpu.gpm = {1: 30.0, 2: 25.0}
        src.read_blocking()  # read: nothing to carry yet
        gpu.gpm = {1: 30.0, 2: 25.5}  # SM moved 0.005: 0.255 x 0.30 / 0.25 = 0.306, 0.29 from 0.02
        return gpu, gets, src

    _, gets, src = gated(())
    (g,) = src.read_blocking()
    assert g.gpm is not None and g.gpm.graphics_estimated and gets["graphics"] == 1
    _, gets, src = gated((0.30,))
    (g,) = src.read_blocking()
    assert g.gpm is not None and not g.gpm.graphics_estimated and gets["graphics"] == 2
    assert src._edges == {0: (0.02, 0.30, 0.775)}  # merged, in order


def test_the_daemon_hands_the_probes_idle_bar_to_the_nvml_source_only_where_the_probe_runs():
    from exporter.config import Config, ProbeConfig
    from exporter.daemon import build_sources

    def also(cfg: Config) -> tuple[float, ...]:
        (src,) = [s for s in build_sources(cfg) if isinstance(s, NvmlSource)]
        try:
            return src._also
        finally:
            src.close()

    assert also(Config()) == ()
    assert also(Config(probe=ProbeConfig(enabled=True, idle_busy_max=0.3))) == (0.3,)
