"""`boundwatch demo`: serve synthetic, changing readings for a few GPUs through the real pipeline.

Nothing here decides a verdict. Demo sources named like the real ones (nvml, host, engine,
agent) return the same reading dataclasses the real sources return (GpuReading, HostReading,
EngineReading, AgentReading); the daemon's Sampler turns them into Snapshots with
`exporter.analysis.pipeline` and the real web app serves them. Each GPU cycles through phases:

- idle: no request running or waiting;
- gpu: a full batch, the GPU 96% busy;
- host: a saturated API server (its busiest thread wants a whole core), requests running, the
  engine's queue empty, the GPU 27% busy;
- quota: the engine's cgroup throttled by its CPU quota in most CFS periods;
- graph: batches above the CUDA-graph capture size, decode running eager.

Every page says it is demo data: `/metrics` carries `boundwatch_demo 1` and `/` a banner.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import random
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from exporter.commands import ConfigFlags
from exporter.snapshot.agent import AgentReading, AgentState, EngineSteps, GpuActivity, GraphUse
from exporter.snapshot.engine import EngineReading, StepCount, ThreadLoad
from exporter.snapshot.gpu import GpmRatios, GpuReading
from exporter.snapshot.host import CgroupCpu, HostReading, ProcessCpu, ThreadCpu
from exporter.wire import IDLE_GAP_BUCKETS_SECONDS, STEP_BUCKETS_SECONDS

HELP = "serve synthetic demo readings (clearly labelled) through the real pipeline and /metrics"
BANNER = "DEMO DATA: synthetic readings from `boundwatch demo`, not this host"


@dataclass(frozen=True)
class Phase:
    """What one phase looks like from outside: load, the API server's demand, throttling, graphs."""

    busy: float  # GPU busy share (GPM graphics, CUPTI)
    running: float  # requests running in the engine
    waiting: float  # requests waiting in the engine's queue
    api_thread: float  # the API server's busiest thread, cores it wants (runnable share)
    api_ran: float  # cores it got
    throttled_share: float  # CFS periods throttled
    graph_share: float  # busy time inside CUDA graphs
    step_seconds: float  # wall time of one engine step
    tokens_per_step: float  # tokens generated per step


PHASES: dict[str, Phase] = {
    "idle": Phase(0.0, 0, 0, 0.02, 0.02, 0.0, 0.95, 0.0, 0),
    "gpu": Phase(0.96, 180, 24, 0.55, 0.55, 0.0, 0.93, 0.030, 180),
    "host": Phase(0.27, 40, 0, 1.0, 0.99, 0.0, 0.90, 0.040, 40),
    "quota": Phase(0.34, 120, 30, 0.85, 0.45, 0.62, 0.90, 0.075, 120),
    "graph": Phase(0.45, 300, 8, 0.6, 0.6, 0.0, 0.12, 0.060, 300),
}
DEFAULT_ORDER = ("idle", "gpu", "host", "quota", "graph")
QUOTA_CORES = 6.0
PERIOD_SECONDS = 0.1  # the CFS period
MODEL = "demo/Llama-3.1-8B-Instruct"


def parse_phases(text: str) -> tuple[str, ...]:
    """Return the phase names of a comma-separated list, or raise ValueError."""
    names = tuple(p.strip() for p in text.split(",") if p.strip())
    bad = [n for n in names if n not in PHASES]
    if not names or bad:
        raise ValueError(f"phases must be a comma-separated list of {', '.join(PHASES)}; got {text!r}")
    return names


@dataclass
class World:
    """The demo's GPUs, engines and host, as functions of a clock; counters integrate per reader."""

    gpus: int = 4
    idle_gpus: int = 0
    order: tuple[str, ...] = DEFAULT_ORDER
    phase_seconds: float = 60.0
    stagger: bool = True
    clock: Callable[[], float] = time.monotonic
    seed: int = 11
    start: float = field(default=math.nan)

    def __post_init__(self) -> None:
        if math.isnan(self.start):
            self.start = self.clock()
        self.rng = random.Random(self.seed)

    @property
    def count(self) -> int:
        """Return the number of GPUs, cycling ones first, then the ones that stay idle."""
        return self.gpus + self.idle_gpus

    def phase_name(self, gpu: int, now: float | None = None) -> str:
        """Return the phase a GPU is in at a time (the GPUs after `gpus` stay idle)."""
        if gpu >= self.gpus:
            return "idle"
        now = self.clock() if now is None else now
        step = int(max(0.0, now - self.start) / self.phase_seconds)
        return self.order[(step + (gpu if self.stagger else 0)) % len(self.order)]

    def phase(self, gpu: int, now: float | None = None) -> Phase:
        """Return the phase a GPU is in at a time."""
        return PHASES[self.phase_name(gpu, now)]

    def jitter(self, value: float, share: float = 0.03) -> float:
        """Return a value with a little noise, never below 0."""
        return max(0.0, value * (1.0 + self.rng.uniform(-share, share)))

    def uuid(self, gpu: int) -> str:
        """Return a GPU's (synthetic) UUID."""
        return f"GPU-00000000-demo-4000-8000-{gpu:012d}"


class _Reader:
    """A demo source: the real sources' name and contract, readings from the World."""

    name = ""

    def __init__(self, world: World) -> None:
        self.world = world
        self.last: float | None = None

    def elapsed(self) -> tuple[float, float]:
        """Return (now, seconds since this reader's previous read; 0 on the first)."""
        now = self.world.clock()
        dt = 0.0 if self.last is None else max(0.0, now - self.last)
        self.last = now
        return now, dt

    def close(self) -> None:
        """Hold nothing."""


class DemoNvml(_Reader):
    """GPUs as NVML would report them."""

    name = "nvml"

    def __init__(self, world: World) -> None:
        super().__init__(world)
        self.energy = [0.0] * world.count

    async def read(self) -> tuple[GpuReading, ...]:
        """Return every demo GPU's reading."""
        now, dt = self.elapsed()
        w = self.world
        out = []
        for i in range(w.count):
            p = w.phase(i, now)
            busy = min(1.0, w.jitter(p.busy)) if p.busy else 0.0
            power = 95.0 + 600.0 * busy + w.rng.uniform(-5, 5)
            self.energy[i] += power * dt
            out.append(
                GpuReading(
                    index=i,
                    uuid=w.uuid(i),
                    name="NVIDIA H100 80GB HBM3 (demo)",
                    driver="550.54.15",
                    pci_bus_id=f"00000000:{0x18 + i:02X}:00.0",
                    power_watts=power,
                    power_limit_watts=700.0,
                    energy_joules=1.0e6 + self.energy[i],
                    sm_clock_hz=1.98e9 if busy else 0.345e9,
                    sm_clock_max_hz=1.98e9,
                    clock_event_mask=0x1
                    if not busy
                    else (0x4 if busy > 0.9 else 0x0),  # power cap at full load
                    utilization=min(1.0, busy * 1.15 + 0.03) if busy else 0.0,
                    memory_used_bytes=int(71.5e9),
                    memory_total_bytes=int(80e9),
                    gpm=GpmRatios(
                        graphics=busy,
                        sm=busy * 0.82,
                        sm_occupancy=busy * 0.41,
                        tensor=busy * 0.37,
                        dram=busy * 0.58,
                    ),
                    pids=(20000 + i,),
                )
            )
        return tuple(out)


class DemoHost(_Reader):
    """The host's CPUs and boundwatch's own cgroup."""

    name = "host"

    def __init__(self, world: World) -> None:
        super().__init__(world)
        self.own_usage = 0.0

    async def read(self) -> HostReading:
        """Return the host's reading."""
        now, dt = self.elapsed()
        w = self.world
        cores = sum(w.phase(i, now).api_ran + 2.0 * w.phase(i, now).busy for i in range(w.count))
        self.own_usage += 0.02 * dt
        own = CgroupCpu(
            "/system.slice/boundwatch.service", 1.0, self.own_usage, 0.0, 0, int(self.own_usage * 10)
        )
        busy = min(1.0, w.jitter((cores + 1.0) / 64.0, 0.05)) if dt else None
        return HostReading(cpus=64, cpu_busy=busy, own_cgroup=own)


@dataclass
class _EngineTotals:
    prompt: float = 0.0
    generation: float = 0.0
    steps: float = 0.0
    usage: float = 0.0
    throttled: float = 0.0
    throttled_periods: float = 0.0
    periods: float = 0.0


class DemoEngine(_Reader):
    """One vLLM engine per cycling GPU, one API server each, in a cgroup with a CPU quota."""

    name = "engine"

    def __init__(self, world: World) -> None:
        super().__init__(world)
        self.totals = [_EngineTotals() for _ in range(world.count)]

    async def read(self) -> tuple[EngineReading, ...]:
        """Return every demo engine's reading."""
        now, dt = self.elapsed()
        return tuple(self._one(i, self.world.phase(i, now), dt) for i in range(self.world.count))

    def _one(self, i: int, p: Phase, dt: float) -> EngineReading:
        w, t = self.world, self.totals[i]
        steps = dt / p.step_seconds if p.step_seconds else 0.0
        t.steps += steps
        t.generation += steps * p.tokens_per_step
        t.prompt += steps * p.tokens_per_step * 3.5
        ran = w.jitter(p.api_ran)
        t.usage += (ran + 1.0 + 0.5 * p.busy) * dt
        t.periods += dt / PERIOD_SECONDS
        t.throttled_periods += p.throttled_share * dt / PERIOD_SECONDS
        t.throttled += p.throttled_share * 0.4 * dt
        thread = ThreadLoad(
            tid=30000 + i, name="python3", cpu=ran, runnable=min(1.0, w.jitter(p.api_thread, 0.01))
        )
        server = ProcessCpu(
            pid=30000 + i,
            name="APIServer_0",
            cmdline=("python3", "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL),
            cpu=ran + 0.1,
            busiest_thread=thread,
            cgroup=f"/demo.slice/vllm-{i}.scope",
            threads=(thread, ThreadCpu(30100 + i, "tokenizer", 0.05)),
        )
        cgroup = CgroupCpu(
            path=f"/demo.slice/vllm-{i}.scope",
            quota_cores=QUOTA_CORES,
            usage_seconds=t.usage,
            throttled_seconds=t.throttled,
            throttled_periods=int(t.throttled_periods),
            periods=int(t.periods),
        )
        running = round(w.jitter(p.running, 0.05))
        waiting = round(w.jitter(p.waiting, 0.2))
        return EngineReading(
            name=f"demo-vllm-{i}",
            kind="vllm",
            model=MODEL,
            url=f"demo://engine-{i}/metrics",
            running=float(running),
            waiting=float(waiting),
            kv_cache_usage=min(0.98, 0.002 * running + 0.01),
            prompt_tokens_total=t.prompt,
            generation_tokens_total=t.generation,
            preemptions_total=0.0,
            spec_acceptance=0.71,  # an engine-computed acceptance ratio, as SGLang gives one
            steps=StepCount("iteration_count", t.steps),
            iteration_count=t.steps,
            iteration_tokens_sum=t.generation,
            max_num_seqs=256,
            api_server_count=1,
            api_server_count_source="processes",
            api_servers=(server,),
            cgroups=(cgroup,),
            gpus=(i,),
            pids=(20000 + i, 30000 + i),
            scrape_seconds=0.004 if p.api_thread < 0.9 else 0.35,
        )


def _gap_counts(gaps: int, p: Phase) -> tuple[int, ...]:
    """Spread idle gaps over the histogram's buckets (+Inf last): long ones when the host starves the GPU."""
    counts = [0] * (len(IDLE_GAP_BUCKETS_SECONDS) + 1)
    centre = 1 if p.busy > 0.9 else 3  # 2 ms gaps between busy steps, ~10 ms when starved
    for k in range(gaps):
        counts[min(len(counts) - 1, centre + (k % 3) - 1)] += 1
    return tuple(counts)


def _step_hist(steps: int, seconds: float) -> tuple[int, ...]:
    """Put `steps` steps of `seconds` each in the step histogram's bucket (+Inf last)."""
    counts = [0] * (len(STEP_BUCKETS_SECONDS) + 1)
    index = next(
        (k for k, edge in enumerate(STEP_BUCKETS_SECONDS) if seconds <= edge), len(STEP_BUCKETS_SECONDS)
    )
    counts[index] = steps
    return tuple(counts)


class DemoAgent(_Reader):
    """The in-process CUPTI agent of each engine's worker: exact busy time, graph share, steps."""

    name = "agent"

    def __init__(self, world: World) -> None:
        super().__init__(world)
        self.stepped: list[Phase | None] = [None] * world.count  # the phase of each engine's last steps

    def handover(self, i: int, last: Phase) -> EngineSteps:
        """Return the step the light agent hands over once an engine stops stepping, its counts read then (0, 0).

        The real agent does this from its own thread (`plugins.flush_pending`), so an idle engine's
        scheduler counts go to 0 instead of staying at those of its last busy step.
        """
        return EngineSteps(
            engine=f"demo-vllm-{i}",
            steps=1,
            wall_ns=int(last.step_seconds * 1e9),
            gpu_busy_ns=0,
            step_hist=_step_hist(1, last.step_seconds),
            pid=20000 + i,
            graph_steps=round(last.graph_share),
            eager_steps=1 - round(last.graph_share),
            running=0.0,
            waiting=0.0,
            max_num_seqs=256,
        )

    async def read(self) -> AgentReading:
        """Return what the demo agents reported since the last read."""
        now, dt = self.elapsed()
        w = self.world
        ns = int(dt * 1e9)
        activity, states, steps, graphs = [], [], [], []
        for i in range(w.count):
            p = w.phase(i, now)
            last, self.stepped[i] = self.stepped[i], (p if p.step_seconds and ns > 0 else None)
            if last is not None and self.stepped[i] is None and ns > 0:
                steps.append(self.handover(i, last))
            states.append(
                AgentState(
                    pid=20000 + i,
                    gpu=0,
                    state="running",
                    role="vllm_worker",
                    uuid=w.uuid(i),
                    lib="demo",
                    mode="raw+graph_trace",
                )
            )
            if ns <= 0:
                continue
            busy_ns = int(min(1.0, w.jitter(p.busy)) * ns) if p.busy else 0
            n_steps = round(dt / p.step_seconds) if p.step_seconds else 0
            gaps = n_steps if p.busy else 0
            activity.append(
                GpuActivity(
                    gpu=i,
                    uuid=w.uuid(i),
                    observed_ns=ns,
                    busy_ns=busy_ns,
                    graph_busy_ns=int(busy_ns * p.graph_share),
                    kernels=n_steps * 220,
                    memcpys=n_steps * 2,
                    memsets=n_steps,
                    graphs=int(n_steps * p.graph_share),
                    idle_gap_counts=_gap_counts(gaps, p),
                    idle_gap_sum_ns=ns - busy_ns if gaps else 0,
                    last_window_busy_ns=busy_ns,
                    last_window_ns=ns,
                )
            )
            if n_steps:
                step_ns = int(p.step_seconds * 1e9)
                graph_steps = round(n_steps * p.graph_share)
                steps.append(
                    EngineSteps(
                        engine=f"demo-vllm-{i}",
                        steps=n_steps,
                        wall_ns=n_steps * step_ns,
                        gpu_busy_ns=busy_ns,
                        step_hist=_step_hist(n_steps, p.step_seconds),
                        tokens=int(n_steps * p.tokens_per_step),
                        seqs=int(n_steps * p.running),
                        pid=20000 + i,
                        graph_steps=graph_steps,
                        eager_steps=n_steps - graph_steps,
                        running=p.running,
                        waiting=p.waiting,
                        running_seconds=p.running * dt,
                        waiting_seconds=p.waiting * dt,
                        max_num_seqs=256,
                    )
                )
                graphs.append(
                    GraphUse(pid=20000 + i, gpu=i, observed_ns=ns, replays=graph_steps, captures=67)
                )
        return AgentReading(
            activity=tuple(activity),
            agents=tuple(states),
            steps=tuple(steps),
            graphs=tuple(graphs),
            messages=len(activity),
        )


def demo_config(cfg: Any) -> Any:
    """Return the configuration with the demo model's roofline (8B in bf16 on an H100) unless one is set."""
    import dataclasses

    from exporter.config import RooflineConfig

    if cfg.roofline.weight_bytes_per_step:
        return cfg
    return dataclasses.replace(cfg, roofline=RooflineConfig(16.1e9, 3.35e12))


def demo_sources(world: World, cfg: Any) -> list[Any]:
    """Return the demo sources the configuration enables (`--no-nvml` etc. leave one out)."""
    kinds = (("nvml", DemoNvml), ("host", DemoHost), ("engine", DemoEngine), ("agent", DemoAgent))
    return [cls(world) for name, cls in kinds if getattr(cfg, name).enabled]


def make_demo_app(cfg: Any, sampler: Any) -> Any:
    """Return the real web app for a demo sampler, with the demo gauge and the page banner."""
    from exporter.export.collectors import DemoCollector
    from exporter.serve.web import BANNER as BANNER_KEY
    from exporter.serve.web import REGISTRY, make_app

    app = make_app(cfg, sampler)
    app[REGISTRY].register(DemoCollector())  # type: ignore[arg-type]
    app[BANNER_KEY] = BANNER
    return app


async def serve(
    cfg: Any, world: World, seconds: float | None = None, say: Callable[[str], None] = print
) -> None:
    """Tick the demo sources through the real Sampler and serve the real app until stopped."""
    from exporter.sampling import Sampler
    from exporter.serve.web import serve_tcp

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    if seconds is not None:
        loop.call_later(seconds, stop.set)
    sampler = Sampler(cfg, demo_sources(world, cfg), clock=world.clock)
    await sampler.tick()
    runner = await serve_tcp(make_demo_app(cfg, sampler), cfg.web.address, cfg.web.port)
    # the port bound (with --port 0 the kernel's pick), so the banner says where to scrape
    port = next((a[1] for a in runner.addresses if isinstance(a, tuple)), cfg.web.port)
    say(
        f"{BANNER}\nserving http://{cfg.web.address}:{port}/metrics; GPUs cycle "
        f"{' -> '.join(world.order)} every {world.phase_seconds:g} s (Ctrl-C stops)"
    )
    ticking = asyncio.create_task(sampler.run(stop), name="demo-sampler")
    try:
        await stop.wait()
    finally:
        ticking.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticking
        await runner.cleanup()
        await sampler.aclose()


def add_parser(subparsers: Any, config_flags: ConfigFlags) -> argparse.ArgumentParser:
    """Add the `demo` sub-command."""
    p = subparsers.add_parser(
        "demo", help=HELP, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--gpus", type=int, default=4, help="GPUs that cycle through the phases (default 4)")
    p.add_argument("--idle-gpus", type=int, default=0, help="more GPUs that stay idle all along (default 0)")
    p.add_argument(
        "--phases", default=",".join(DEFAULT_ORDER), help=f"the cycle (default {','.join(DEFAULT_ORDER)})"
    )
    p.add_argument("--phase-seconds", type=float, default=60.0, help="length of one phase (default 60)")
    p.add_argument(
        "--no-stagger",
        action="store_true",
        help="every GPU in the same phase (default: GPU i starts at phase i)",
    )
    p.add_argument(
        "--seconds", type=float, default=None, help="stop after this long (default: run until stopped)"
    )
    config_flags(p)
    return p


def validate(args: argparse.Namespace) -> tuple[World | None, str]:
    """Return the World the flags describe, or (None, why not)."""
    try:
        order = parse_phases(args.phases)
    except ValueError as exc:
        return None, str(exc)
    if not 0 <= args.gpus <= 64 or not 0 <= args.idle_gpus <= 64 or args.gpus + args.idle_gpus == 0:
        return None, "--gpus and --idle-gpus must be 0-64, and not both 0"
    if not math.isfinite(args.phase_seconds) or not 1.0 <= args.phase_seconds <= 86400:
        return None, "--phase-seconds must be 1-86400"
    if args.seconds is not None and not (math.isfinite(args.seconds) and args.seconds > 0):
        return None, "--seconds must be a positive number"
    return World(args.gpus, args.idle_gpus, order, args.phase_seconds, not args.no_stagger), ""


def _asks_tls(web: Any) -> bool:
    """Say whether the configuration asks for TLS (web.tls_* or the web config file's tls_server_config)."""
    if web.tls_cert_file:
        return True
    if not web.config_file:
        return False
    from exporter import webconfig

    return webconfig.load(web.config_file).tls  # checked when the configuration was loaded


def run(args: argparse.Namespace) -> int:
    """Serve the demo; exit 2 on bad flags, 1 when the port is taken."""
    world, error = validate(args)
    if world is None:
        print(f"demo: {error}", file=sys.stderr)
        return 2
    if _asks_tls(args.cfg.web):  # served as asked or not at all: never plain HTTP where TLS was asked for
        print(
            "demo: serves plain HTTP only (no TLS): run the daemon for TLS, or leave out web.tls_* and "
            "the web config file's tls_server_config",
            file=sys.stderr,
        )
        return 2
    try:
        asyncio.run(serve(demo_config(args.cfg), world, args.seconds))
    except OSError as exc:
        print(f"demo: cannot listen on {args.cfg.web.address}:{args.cfg.web.port}: {exc}", file=sys.stderr)
        return 1
    return 0


__all__: Sequence[str] = ("PHASES", "World", "demo_sources", "make_demo_app", "run", "serve")
