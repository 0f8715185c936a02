"""Build Snapshot series that read like the field reports, for the verdict, report and codec tests."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from exporter.snapshot import Snapshot
from exporter.snapshot.agent import AgentReading, EngineSteps, GpuActivity
from exporter.snapshot.engine import EngineReading, StepCount, ThreadLoad
from exporter.snapshot.gpu import GpmRatios, GpuReading
from exporter.snapshot.host import CgroupCpu, HostReading, ProcessCpu

TICK = 0.5
NS = 1_000_000_000
# seed 000: 27% busy, nothing waiting, 160 running (with max_num_seqs 256), decode in CUDA graphs.
SEED: dict = dict(busy=0.27, running=160, waiting=0, graph_share=0.95, max_num_seqs=256)


@dataclass
class Scene:
    """One steady state of a host: what each 0.5 s tick shows."""

    busy: float | None = 0.9
    busy_source: str = "cupti"
    running: float | None = 64
    waiting: float | None = 0
    api_cpu: float | None = 0.3  # busiest API-server thread, cores
    api_runnable: float | None = None  # its demand (ran + waited to run), when schedstat is known
    quota_cores: float | None = None
    throttled_share: float = 0.0  # share of 100 ms quota periods throttled
    graph_share: float | None = 0.95  # share of busy time in CUDA graphs (None: no agent)
    step_ms: float | None = None  # agent step wall time
    step_gpu_ms: float | None = None
    gen_tokens_per_s: float = 1000.0
    max_num_seqs: int | None = 256
    power_w: float = 500.0
    power_limit_w: float = 700.0
    engine: bool = True
    gpus: tuple[int, ...] = ()
    idle_gap_ms: float = 0.0  # idle gaps over 1 ms per tick, total
    steps_per_tick: int | None = None  # agent steps per tick (None: back to back, 0.5 s / step_ms)
    step_gpu_measured: bool = True  # False: the steps' CUPTI ran in other processes (vLLM mp executor)
    nvml: bool = True  # NVML (and GPM) readings present
    nvml_busy: float | None = None  # what GPM and utilization.gpu say this tick (None: the same as busy)


class Recorder:
    """Accumulate ticks (cumulative counters carry on across scene changes)."""

    def __init__(self, start_mono: float = 1000.0) -> None:
        self.snaps: list[Snapshot] = []
        self.mono = start_mono
        self.periods = 0
        self.throttled = 0
        self.throttled_s = 0.0
        self.gen = 0.0
        self.steps = 0.0

    def tick(self, s: Scene) -> Snapshot:
        """Append one tick of a scene and return it."""
        self.mono += TICK
        dt = TICK if self.snaps else 0.0
        self.periods += 5
        self.throttled += round(5 * s.throttled_share)
        self.throttled_s += TICK * s.throttled_share * 0.5
        self.gen += s.gen_tokens_per_s * TICK
        step_s = (s.step_ms or 20.0) / 1000
        self.steps += TICK / step_s if (s.running or 0) > 0 else 0
        busy = {} if s.busy is None else {0: (s.busy, s.busy_source)}
        engines: tuple[EngineReading, ...] = ()
        if s.engine:
            thread = None if s.api_cpu is None else ThreadLoad(11, "python", s.api_cpu, s.api_runnable)
            server = ProcessCpu(
                10,
                "VLLM::APIServer_0",
                ("VLLM::APIServer_0",),
                (s.api_cpu or 0) + 0.1,
                thread,
                threads=() if thread is None else (thread,),
            )
            cgroups = ()
            if s.quota_cores is not None or s.throttled_share:
                cgroups = (
                    CgroupCpu(
                        "/kubepods/pod1",
                        s.quota_cores,
                        usage_seconds=self.mono,
                        throttled_seconds=self.throttled_s,
                        throttled_periods=self.throttled,
                        periods=self.periods,
                    ),
                )
            engines = (
                EngineReading(
                    name="vllm:8000",
                    kind="vllm",
                    model="m",
                    running=s.running,
                    waiting=s.waiting,
                    generation_tokens_total=self.gen,
                    prompt_tokens_total=0.0,
                    steps=StepCount("iteration_count", self.steps),
                    max_num_seqs=s.max_num_seqs,
                    api_servers=(server,) if s.api_cpu is not None else (),
                    cgroups=cgroups,
                    gpus=s.gpus,
                ),
            )
        agent = None
        if s.graph_share is not None or s.step_ms is not None:
            busy_ns = int((s.busy or 0) * TICK * NS)
            gaps = 1 if s.idle_gap_ms else 0
            act = GpuActivity(
                gpu=0,
                uuid="GPU-0",
                observed_ns=int(TICK * NS),
                busy_ns=busy_ns,
                graph_busy_ns=int(busy_ns * (s.graph_share or 0)),
                kernels=100,
                graphs=10,
                idle_gap_counts=(0, 0, 0, 0, gaps, 0, 0, 0, 0, 0, 0),
                idle_gap_sum_ns=int(s.idle_gap_ms * 1e6),
            )
            steps = ()
            if s.step_ms is not None and s.step_gpu_ms is not None:
                n = s.steps_per_tick or max(1, round(TICK * 1000 / s.step_ms))
                gpu_ns = int(n * s.step_gpu_ms * 1e6) if s.step_gpu_measured else 0
                steps = (
                    EngineSteps(
                        "vllm", n, int(n * s.step_ms * 1e6), gpu_ns, gpu_measured=s.step_gpu_measured
                    ),
                )
            agent = AgentReading(activity=(act,), steps=steps)
        device = s.busy if s.nvml_busy is None else s.nvml_busy
        gpu = GpuReading(
            0,
            "GPU-0",
            "NVIDIA H200",
            "580",
            power_watts=s.power_w,
            power_limit_watts=s.power_limit_w,
            sm_clock_hz=1.98e9,
            sm_clock_max_hz=1.98e9,
            utilization=device,
            gpm=GpmRatios(graphics=device, sm=device),
        )
        snap = Snapshot(
            seq=len(self.snaps) + 1,
            at=1.7e9 + self.mono,
            mono=self.mono,
            interval=TICK,
            dt=dt,
            gpus=(gpu,) if s.nvml else (),
            host=HostReading(cpus=16, cpu_busy=0.2),
            engines=engines,
            agent=agent,
            busy=MappingProxyType(busy),
        )
        self.snaps.append(snap)
        return snap

    def run(self, s: Scene, seconds: float) -> list[Snapshot]:
        """Append `seconds` of a scene and return the new ticks."""
        return [self.tick(s) for _ in range(round(seconds / TICK))]


def series(scene: Scene, seconds: float = 3.0) -> list[Snapshot]:
    """Return `seconds` of one scene."""
    rec = Recorder()
    rec.run(scene, seconds)
    return rec.snaps
