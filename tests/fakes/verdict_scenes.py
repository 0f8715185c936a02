"""Build Snapshot series that read like the field reports, for the verdict, report and codec tests."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from exporter.snapshot import Snapshot
from exporter.snapshot.agent import AgentReading, EngineSteps, GpuActivity, GraphUse
from exporter.snapshot.engine import EngineReading, GraphConfig, StepCount, ThreadLoad
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
    api_process_cpu: float | None = None  # each API server, all threads, cores (None: api_cpu + 0.1)
    quota_cores: float | None = None
    throttled_share: float = 0.0  # share of 100 ms quota periods throttled
    graph_share: float | None = 0.95  # share of busy time in CUDA graphs (None: no agent)
    step_ms: float | None = None  # agent step wall time
    step_gpu_ms: float | None = None
    gen_tokens_per_s: float | None = None  # None: 1000 while requests run, else 0
    prompt_tokens_per_s: float = 0.0
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
    api_servers: int = 1  # API-server processes, each with a busiest thread at api_cpu
    api_cgroup: str = ""  # the API servers' cgroup path ("" = unknown); the quota cgroup when set
    # Light agent (no CUPTI) in the engine: step modes, scheduler counts, graph replays.
    light: bool = False
    graph_steps: int = 0  # per tick
    eager_steps: int = 0
    agent_running: float | None = None
    agent_waiting: float | None = None
    agent_max_num_seqs: int | None = None
    agent_pid: int = 0
    step_tokens: int = 0  # scheduled tokens per tick, summed over steps
    step_seqs: int = 0
    replays: int | None = None  # CUDAGraph.replay calls per tick (None: no GraphUse)
    graph_config: GraphConfig | None = None  # what the engine's command line says about CUDA graphs
    captures: int = 0
    engine_pids: tuple[int, ...] = ()


class Recorder:
    """Accumulate ticks (cumulative counters carry on across scene changes)."""

    def __init__(self, start_mono: float = 1000.0) -> None:
        self.snaps: list[Snapshot] = []
        self.mono = start_mono
        self.periods = 0
        self.throttled = 0
        self.throttled_s = 0.0
        self.gen = 0.0
        self.prompt = 0.0
        self.steps = 0.0

    def tick(self, s: Scene) -> Snapshot:
        """Append one tick of a scene and return it."""
        self.mono += TICK
        dt = TICK if self.snaps else 0.0
        self.periods += 5
        self.throttled += round(5 * s.throttled_share)
        self.throttled_s += TICK * s.throttled_share * 0.5
        gen = s.gen_tokens_per_s if s.gen_tokens_per_s is not None else 1000.0 * ((s.running or 0) > 0)
        self.gen += gen * TICK
        self.prompt += s.prompt_tokens_per_s * TICK
        step_s = (s.step_ms or 20.0) / 1000
        self.steps += TICK / step_s if (s.running or 0) > 0 else 0
        busy = {} if s.busy is None else {0: (s.busy, s.busy_source)}
        engines: tuple[EngineReading, ...] = ()
        if s.engine:
            engines = (
                EngineReading(
                    name="vllm:8000",
                    kind="vllm",
                    model="m",
                    running=s.running,
                    waiting=s.waiting,
                    generation_tokens_total=self.gen,
                    prompt_tokens_total=self.prompt,
                    steps=StepCount("iteration_count", self.steps),
                    max_num_seqs=s.max_num_seqs,
                    graph_config=s.graph_config,
                    api_servers=self._servers(s),
                    cgroups=self._cgroups(s),
                    gpus=s.gpus,
                    pids=s.engine_pids,
                ),
            )
        agent = self._agent(s)
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

    def _servers(self, s: Scene) -> tuple[ProcessCpu, ...]:
        """Return the API servers of one tick, each with its busiest thread at the scene's figures."""
        if s.api_cpu is None:
            return ()
        out = []
        cpu = s.api_cpu + 0.1 if s.api_process_cpu is None else s.api_process_cpu
        for i in range(s.api_servers):
            thread = ThreadLoad(11 + 10 * i, "python", s.api_cpu, s.api_runnable)
            title = f"VLLM::APIServer_{i}"
            out.append(ProcessCpu(10 + 10 * i, title, (title,), cpu, thread, s.api_cgroup, (thread,)))
        return tuple(out)

    def _cgroups(self, s: Scene) -> tuple[CgroupCpu, ...]:
        """Return the engine's cgroup (the API servers' where the scene names it), with its counters."""
        if s.quota_cores is None and not s.throttled_share:
            return ()
        return (
            CgroupCpu(
                s.api_cgroup or "/kubepods/pod1",
                s.quota_cores,
                usage_seconds=self.mono,
                throttled_seconds=self.throttled_s,
                throttled_periods=self.throttled,
                periods=self.periods,
            ),
        )

    def _agent(self, s: Scene) -> AgentReading | None:
        """Return the agents' report of one tick: CUPTI activity and step timing, light-agent figures."""
        if s.graph_share is None and s.step_ms is None and not s.light:
            return None
        acts: tuple[GpuActivity, ...] = ()
        if s.graph_share is not None:
            busy_ns = int((s.busy or 0) * TICK * NS)
            gaps = 1 if s.idle_gap_ms else 0
            acts = (
                GpuActivity(
                    gpu=0,
                    uuid="GPU-0",
                    observed_ns=int(TICK * NS),
                    busy_ns=busy_ns,
                    graph_busy_ns=int(busy_ns * (s.graph_share or 0)),
                    kernels=100,
                    graphs=10,
                    idle_gap_counts=(0, 0, 0, 0, gaps, 0, 0, 0, 0, 0, 0),
                    idle_gap_sum_ns=int(s.idle_gap_ms * 1e6),
                ),
            )
        steps: tuple[EngineSteps, ...] = ()
        if s.step_ms is not None and s.step_gpu_ms is not None and not s.light:
            n = s.steps_per_tick or max(1, round(TICK * 1000 / s.step_ms))
            gpu_ns = int(n * s.step_gpu_ms * 1e6) if s.step_gpu_measured else 0
            steps = (
                EngineSteps("vllm", n, int(n * s.step_ms * 1e6), gpu_ns, gpu_measured=s.step_gpu_measured),
            )
        graphs: tuple[GraphUse, ...] = ()
        if s.light:
            step_ms = s.step_ms or 20.0
            n = s.graph_steps + s.eager_steps or s.steps_per_tick or 0
            if not n and ((s.agent_running or 0) > 0 or (s.running or 0) > 0):
                n = round(TICK * 1000 / step_ms)
            steps = (
                EngineSteps(
                    "vllm",
                    n,
                    int(n * step_ms * 1e6),
                    0,
                    tokens=s.step_tokens,
                    seqs=s.step_seqs,
                    gpu_measured=False,
                    pid=s.agent_pid,
                    graph_steps=s.graph_steps,
                    eager_steps=s.eager_steps,
                    running=s.agent_running,
                    waiting=s.agent_waiting,
                    running_seconds=(s.agent_running or 0.0) * TICK,
                    waiting_seconds=(s.agent_waiting or 0.0) * TICK,
                    max_num_seqs=s.agent_max_num_seqs,
                ),
            )
            if s.replays is not None:
                until = int((1.7e9 + self.mono) * NS)  # the tick's own time (Snapshot.at), covered whole
                graphs = (
                    GraphUse(
                        s.agent_pid or 20,
                        0,
                        int(TICK * NS),
                        s.replays,
                        s.captures,
                        since_ns=until - int(TICK * NS),
                        until_ns=until,
                    ),
                )
        return AgentReading(activity=acts, steps=steps, graphs=graphs)

    def run(self, s: Scene, seconds: float) -> list[Snapshot]:
        """Append `seconds` of a scene and return the new ticks."""
        return [self.tick(s) for _ in range(round(seconds / TICK))]


def series(scene: Scene, seconds: float = 3.0) -> list[Snapshot]:
    """Return `seconds` of one scene."""
    rec = Recorder()
    rec.run(scene, seconds)
    return rec.snaps
