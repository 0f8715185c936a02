"""The verdict: is each GPU idle, GPU-bound or host-bound (and why), from a sliding window of Snapshots.

Two steps, both pure:
- `decide(facts, cfg, prev)` classifies one window (`gather` collects its facts): `idle` when no
  work is offered to the GPU's engines, `gpu` when the busy share is at or above `busy_high` while
  work is offered, `host` below `busy_low`, with reasons from the evidence in the window; `unknown`
  when a source the decision needs is missing. Between the two thresholds the previous verdict
  stays (a band of hysteresis on the busy share itself: a GPU at 78% busy that was GPU-bound stays
  GPU-bound, one that was host-bound stays host-bound); with no previous gpu/host verdict the
  midpoint decides. While work waits (in the engine's queue or a full batch, in a saturated API
  server, behind a quota) the band starts at `queued_busy_low`: a GPU that is the bottleneck is
  busy while work waits for it.
- `hold(raw, prev, cfg)` reports a change only once `hold_ticks` ticks in a row disagreed with
  the reported verdict (the tick that straddles a change counts when its busy share leans to the
  new side of the band's midpoint), so one odd tick (a GC pause, a slow scrape) does not flap
  the gauge and a load hovering inside the band never flips.

Work offered (`offered`) is more than the engine's queue. Seed 000: "waiting stayed at 0 while
running climbed by only about 4.5 requests per second. Requests weren't queueing in the engine.
They were stuck before it." So work is offered when any of these holds: the engine's running or
waiting at a reading of the last `offered_window_seconds` (the agent's counts, sampled every step,
before the page's); tokens flowing or agent-counted work in the newest tick; an API server whose
busiest thread is saturated in the newest tick (CPU plus run-queue wait); an API server's cgroup
throttled by its quota in the newest tick while the API servers in it use that quota. An idle
API server (no CPU) never offers work, and a cgroup outside the engine's never counts.

Timing. The engine's queue is read at the tick, so the busy share must be of the same tick:
by default (`busy_source = "fresh"`) the verdict takes NVML GPM GRAPHICS_UTIL (else
utilization.gpu) of the latest tick (`busy_window_seconds`, 0.5 s), and CUPTI only where NVML
is missing. The CUPTI figure is exact but 1-2 s late (an agent window closes once older than its
flush lag); thresholding it against a live queue would show "host" for the first second of every
load. CUPTI still feeds the evidence: graph share, idle gaps, step GPU time, host-bound seconds.
With a 2-tick hold a step change in load shows in the reported verdict 0.5-1.6 s after it
happens. Reasons are rates and shares over `window_seconds` (1.5 s), so they are steady, and
right again within 2 s of a change (CUPTI-based ones take the newest agent window, 1-2 s late).

Eager decode. GPM and utilization.gpu count the launch gaps between tiny eager kernels as busy
(on the H200 GPM read 0.85-0.94 where CUPTI's union read 0.61), so while decode runs without CUDA
graphs (the light agent's step modes or replay counts, or CUPTI's graph share) a GPU-bound verdict
from those figures needs `eager_busy_high` (0.97) and anything below `eager_busy_low` is host-bound
with `cuda_graph_fallback`. Prefill-shaped steps (many tokens per sequence) run eager by design
and are not taken as a fallback.

Engines without an agent, agents without an engine: see `decide`. The integrated counters
(time per verdict, host-bound seconds) are in `accumulate`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from exporter.analysis import busy
from exporter.analysis.activity import lossy
from exporter.analysis.memo import ByIdentity
from exporter.config import Config, RooflineConfig, VerdictConfig
from exporter.snapshot import Snapshot
from exporter.snapshot.agent import AgentReading, EngineSteps, GpuActivity
from exporter.snapshot.engine import EngineReading, demand
from exporter.snapshot.frozen import replace
from exporter.snapshot.host import CgroupCpu
from exporter.snapshot.totals import EMPTY, GpuKeys, GpuVerdict, Tally, Totals, VerdictTotals
from exporter.snapshot.verdict import HOST_REASONS, VERDICTS, Evidence, Verdict

T = TypeVar("T")

# Ticks may jitter; a snapshot this share of a tick older than the window edge still counts as inside.
_JITTER = 0.25
# Steps with more scheduled tokens per sequence than this are prefill-shaped: prefill chunks larger
# than the capture sizes run eager by design in vLLM and SGLang, so their eager steps are no
# fallback. Decode carries 1 token per sequence, 1 + depth with speculative decoding (depth <= 7).
DECODE_TOKENS_PER_SEQ = 8.0
# A throttled cgroup offers work only while the API servers in it use at least this share of its
# quota: then they are what runs out of it, not a neighbour (an idle API server uses ~0.02 cores).
_QUOTA_USE = 0.5
# Offered-work signals, in the order `Facts.offered_by` lists them.
OFFERED_BY: tuple[str, ...] = ("engine_queue", "engine_steps", "tokens", "api_server", "cpu_quota")


@dataclass(frozen=True)
class Facts:
    """What one window shows about one GPU (None where no source tells)."""

    gpu: int
    busy: float | None = None  # share of wall time, over busy_window_seconds
    busy_source: str | None = None
    # 1 where the newest tick's GPM GRAPHICS_UTIL was estimated from SM_UTIL, not read (`sources.nvml.GraphicsGate`)
    busy_estimated: bool | None = None
    engine: bool = False  # a relevant engine reading exists in the window
    unplaced: str | None = (
        None  # engines placed on no GPU in the newest tick ("+"-joined), when none drives this one
    )
    offered: bool = False  # work offered to the GPU's engines (see OFFERED_BY), with an engine only
    offered_by: str | None = None  # the signals that saw it, "+"-joined (evidence)
    counts_source: str | None = None  # agent | page: where running/waiting came from (latest reading)
    running: float | None = None  # latest, summed over the engines driving the GPU
    waiting: float | None = None
    running_mean: float | None = None
    waiting_mean: float | None = None
    running_growth_per_second: float | None = None
    max_batch: int | None = None
    api_servers: int = 0
    api_server_thread_cpu: float | None = None  # busiest thread of the busiest server, cores (median tick)
    api_server_process_cpu: float | None = None  # that server, all threads, cores (median tick)
    quota_cores: float | None = None  # smallest quota among the engine's cgroups
    throttled_share: float | None = None  # throttled periods over periods, the most throttled cgroup
    throttled_seconds_per_second: float | None = None
    generation_tokens_per_second: float | None = None
    prompt_tokens_per_second: float | None = None
    agent: bool = False  # agent activity for this GPU in the window
    agent_busy_ratio: float | None = None
    graph_share: float | None = None  # CUDA-graph time over busy time (graph spans: an upper bound)
    graph_step_share: float | None = None  # steps in a CUDA graph over all steps (light agent)
    graph_step_method: str | None = None  # modes (graph/eager steps) | replays (replays per step)
    # the flag that puts decode outside CUDA graphs at this batch (engine command line), when one does
    graph_config_eager: str | None = None
    step_tokens_per_seq: float | None = None  # scheduled tokens per sequence in the agent's steps
    idle_gaps: int | None = None  # idle gaps over 1 ms in the window
    idle_gap_seconds_per_second: float | None = None
    steps_per_second: float | None = None
    step_seconds: float | None = None  # mean wall time of a step
    step_gpu_seconds: float | None = None  # mean GPU busy time inside a step
    step_method: str | None = None  # agent | engine
    power_watts: float | None = None
    power_limit_watts: float | None = None
    sm_clock_ratio: float | None = None
    host_cpu: float | None = None
    roofline_floor_seconds: float | None = None
    roofline_achieved_ratio: float | None = None
    span_seconds: float = 0.0

    @property
    def pending(self) -> float | None:
        """Return running + waiting at the latest reading, or None without an engine figure."""
        if self.running is None and self.waiting is None:
            return None
        return (self.running or 0.0) + (self.waiting or 0.0)

    @property
    def decoding(self) -> bool:
        """Say whether an engine is generating (a plain torch process need not use graphs at all)."""
        return self.engine and (
            self.generation_tokens_per_second is None or self.generation_tokens_per_second > 0
        )

    @property
    def step_gpu_share(self) -> float | None:
        """Return GPU time per step over step wall time."""
        if self.step_seconds is None or self.step_gpu_seconds is None or self.step_seconds <= 0:
            return None
        return self.step_gpu_seconds / self.step_seconds

    @property
    def power_share(self) -> float | None:
        """Return power over its limit."""
        if self.power_watts is None or not self.power_limit_watts:
            return None
        return self.power_watts / self.power_limit_watts

    @classmethod
    def of(cls, found: dict[str, object]) -> Facts:
        """Return the Facts of a window from the fields it found (the others at their defaults).

        The same as `Facts(**found)` without the frozen __init__'s one object.__setattr__ per field
        (~45 of them, per GPU per tick): the defaults, then the found values, fill __dict__ in field
        order, as __init__ would. An unknown name, or no gpu, is refused as __init__ refuses it.
        """
        if "gpu" not in found or not found.keys() <= _DEFAULTS.keys():
            raise TypeError(
                f"Facts needs gpu and takes only its fields, not {sorted(found.keys() - _DEFAULTS.keys())}"
            )
        facts = object.__new__(cls)
        fields = facts.__dict__
        fields.update(_DEFAULTS)
        fields.update(found)
        return facts

    def evidence(self) -> Evidence:
        """Return the facts as (name, value) pairs for the Verdict and the report."""
        fields = self.__dict__  # every field, read once each (a frozen dataclass keeps them there)
        out: list[tuple[str, float | str | None]] = [
            (name, float(value) if isinstance(value, (bool, int)) else value)
            for name in _EVIDENCE_FIELDS
            if (value := fields[name]) is not None
        ]
        for name, value in (
            ("step_gpu_share", self.step_gpu_share),
            ("power_share", self.power_share),
            ("pending", self.pending),
        ):
            if value is not None:
                out.append((name, value))
        out.append(("window_seconds", self.span_seconds))
        return tuple(out)


# Each field's default in field order (`Facts.of`); gpu, the one without, is always found.
_DEFAULTS: dict[str, object] = {
    f.name: None if f.name == "gpu" else f.default for f in dataclasses.fields(Facts)
}
_EVIDENCE_FIELDS = tuple(
    f.name
    for f in dataclasses.fields(Facts)
    if f.name not in {"gpu", "engine", "agent", "span_seconds", "unplaced"}
)


@dataclass(frozen=True)
class View:
    """One engine driving a GPU at one tick, as the verdict reads it.

    running / waiting are the agent's scheduler counts (sampled after every step inside the engine)
    where the agent sent them for this engine, else the page's gauges; `limit` is the batch limit
    (the agent's max_num_seqs, else the reading's); `steps` the agent steps this engine counted.
    """

    reading: EngineReading
    running: float | None
    waiting: float | None
    limit: int | None
    steps: tuple[EngineSteps, ...] = ()
    counts: str = "page"  # agent | page


def window(history: Sequence[Snapshot], seconds: float) -> tuple[Snapshot, ...]:
    """Return the snapshots of the last `seconds` (the newest last), plus the one before as a baseline.

    The first element is the baseline for counters (its own per-tick figures are not used).
    """
    if not history:
        return ()
    newest = history[-1]
    edge = newest.mono - seconds + _JITTER * (newest.interval or 0.5)
    start = len(history) - 1
    while start > 0 and history[start - 1].mono > edge:
        start -= 1
    return tuple(history[max(0, start - 1) :])


def _inside(win: Sequence[T]) -> Sequence[T]:
    """Return the snapshots whose per-tick figures count (all but the baseline)."""
    return win[1:] if len(win) > 1 else win


def _weighted_mean(pairs: Sequence[tuple[float, float]]) -> float | None:
    """Return the mean of (value, weight) pairs; equal weights when all weights are 0."""
    if not pairs:
        return None
    total = sum(w for _, w in pairs)
    if total <= 0:
        return sum(v for v, _ in pairs) / len(pairs)
    return sum(v * w for v, w in pairs) / total


def _median(pairs: Sequence[tuple[float, float]]) -> float | None:
    """Return the median of the values of (value, weight) pairs (weights ignored)."""
    values = sorted(v for v, _ in pairs)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def lone_gpu(snap: Snapshot) -> int | None:
    """Return the host's only GPU: one NVML GPU, else (no NVML) the only one busy figures or agents name."""
    if snap.gpus:
        return snap.gpus[0].index if len(snap.gpus) == 1 else None
    found = set(snap.busy) | ({a.gpu for a in snap.agent.activity} if snap.agent is not None else set())
    return next(iter(found)) if len(found) == 1 else None


def placed(engine: EngineReading, snap: Snapshot | None = None) -> tuple[int, ...]:
    """Return the GPUs an engine drives: as the pipeline placed it, else the host's only GPU, else none."""
    if engine.gpus:
        return engine.gpus
    lone = lone_gpu(snap) if snap is not None else None
    return (lone,) if lone is not None else ()


def unplaced(snap: Snapshot) -> tuple[str, ...]:
    """Return the live engines that could be placed on no GPU (their GPUs then read `no_gpu_mapping`)."""
    return tuple(e.name for e in snap.engines if not e.error and not placed(e, snap))


def _sum(values: Sequence[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return sum(got) if got else None


def _steps_total(e: EngineReading) -> float | None:
    return e.steps.total if e.steps is not None else None


def _step_matches(engine: str, names: set[str]) -> bool:
    """Say whether agent steps counted under `engine` ("vllm", or "vllm:8000") belong to one of the engines."""
    return not names or engine in names or any(n.split(":", 1)[0] == engine for n in names)


def owner(st: EngineSteps, engines: Sequence[EngineReading]) -> EngineReading | None:
    """Return the engine agent steps belong to: by pid, else by name, else the only engine of their kind."""
    if st.pid:
        for e in engines:
            if st.pid in e.pids:
                return e
    for e in engines:
        if e.name == st.engine:
            return e
    of_kind = [e for e in engines if e.kind == st.engine or e.name.split(":", 1)[0] == st.engine]
    return of_kind[0] if len(of_kind) == 1 else None


def _agent_counts(steps: Sequence[EngineSteps]) -> tuple[float | None, float | None, int | None]:
    """Return running, waiting and the batch limit after the newest step, summed over engine cores.

    Each engine core (data-parallel rank) has its own scheduler and agent process: its newest
    report per process counts once.
    """
    newest: dict[tuple[int, int | None], EngineSteps] = {}
    for st in steps:
        newest[(st.pid, st.dp_rank)] = st
    running = _sum([st.running for st in newest.values()])
    waiting = _sum([st.waiting for st in newest.values()])
    limits = [st.max_num_seqs for st in newest.values() if st.max_num_seqs]
    return running, waiting, sum(limits) if limits else None


def _on_gpu(e: EngineReading, steps: Sequence[EngineSteps], gpu: int) -> tuple[EngineSteps, ...]:
    """Return the steps of an engine's cores that drive a GPU, each rank's once.

    Under data parallelism each engine core (rank) drives its own GPUs: a GPU takes the steps of
    its core alone where the pipeline placed the cores. SGLang's TP schedulers each count the same
    batch, so per data-parallel rank one scheduler's steps count (the lowest pid's).
    """
    cores = dict(e.core_gpus)
    return once(e, [st for st in steps if not st.pid or st.pid not in cores or gpu in cores[st.pid]])


def once(e: EngineReading, steps: Sequence[EngineSteps]) -> tuple[EngineSteps, ...]:
    """Return an engine's agent steps with each data-parallel rank's counted once (SGLang TP schedulers)."""
    if e.kind != "sglang":
        return tuple(steps)
    first: dict[int | None, int] = {}
    for st in steps:
        first[st.dp_rank] = min(first.get(st.dp_rank, st.pid), st.pid)
    return tuple(st for st in steps if st.pid == first[st.dp_rank])


def owned_steps(snap: Snapshot) -> dict[str, list[EngineSteps]]:
    """Return the agent steps of one tick by the engine they belong to (see `owner`)."""
    engines = [e for e in snap.engines if not e.error]
    owned: dict[str, list[EngineSteps]] = {}
    for st in snap.agent.steps if snap.agent is not None else ():
        o = owner(st, engines)
        if o is not None:
            owned.setdefault(o.name, []).append(st)
    return owned


def views(snap: Snapshot, gpu: int) -> list[View]:
    """Return the engines driving a GPU at one tick, with the agent's counts joined (by pid first)."""
    return _drivers_of(snap).views(gpu)


class _Drivers:
    """One tick's live engines with the GPUs each drives, and its agent steps: what every GPU's views read.

    Built once per Snapshot, not once per GPU: the placements, the steps joined to their engines
    (only once a GPU has an engine) and the steps that join none (`_gpu_steps`). GPUs that the same
    engines drive with the same steps (an engine's tensor-parallel GPUs) share one list of views, so
    what is worked out from the views alone is worked out once (`_Tick.shared`). A Snapshot stays in
    the verdict's window for several ticks, and its drivers with it (`_drivers_of`): each GPU's views
    of it are made once.
    """

    __slots__ = ("_by_gpu", "_owned", "_unowned", "_views", "placed", "snap")

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        self.placed = [(e, placed(e, snap)) for e in snap.engines if not e.error]
        self._owned: dict[str, list[EngineSteps]] | None = None
        self._unowned: list[tuple[EngineSteps, int | None]] | None = None
        self._views: dict[tuple[tuple[int, ...], ...], list[View]] = {}
        self._by_gpu: dict[int, list[View]] = {}

    def views(self, gpu: int) -> list[View]:
        """Return the engines driving a GPU (see `views`); the list is shared with GPUs of the same views: read only."""
        out = self._by_gpu.get(gpu)
        if out is None:
            out = self._by_gpu[gpu] = self._views_of(gpu)
        return out

    def _views_of(self, gpu: int) -> list[View]:
        drive: list[tuple[EngineReading, tuple[EngineSteps, ...]]] = []
        for e, gpus in self.placed:
            if gpu not in gpus:
                continue
            if self._owned is None:  # joined once an engine drives a GPU (most GPUs have none)
                self._owned = owned_steps(self.snap)
            drive.append((e, _on_gpu(e, self._owned.get(e.name, ()), gpu)))
        # the engines and steps by identity: every one lives in this Snapshot as long as this does
        key = tuple((id(e), *map(id, steps)) for e, steps in drive)
        out = self._views.get(key)
        if out is None:
            out = self._views[key] = self._build(drive)
        return out

    @staticmethod
    def _build(drive: Sequence[tuple[EngineReading, tuple[EngineSteps, ...]]]) -> list[View]:
        out = []
        for e, steps in drive:
            a_run, a_wait, a_limit = _agent_counts(steps)
            running = a_run if a_run is not None else e.running
            waiting = a_wait if a_wait is not None else e.waiting
            if running is None and waiting is None:
                continue
            counts = "agent" if a_run is not None or a_wait is not None else e.counts_source
            out.append(View(e, running, waiting, a_limit or e.max_num_seqs, steps, counts))
        return out

    def unowned(self) -> list[tuple[EngineSteps, int | None]]:
        """Return the tick's agent steps that join no engine, each with its agent's GPU (None: matched by kind).

        Steps whose kind several live engines share are left out: whose they are cannot be told.
        """
        if self._unowned is None:
            snap = self.snap
            self._unowned = []
            engines = [e for e in snap.engines if not e.error]
            agent_gpu = (
                {a.pid: a.gpu for a in snap.agent.agents if a.gpu >= 0} if snap.agent is not None else {}
            )
            for st in snap.agent.steps if snap.agent is not None else ():
                if owner(st, engines) is not None:
                    continue
                if st.pid in agent_gpu:
                    self._unowned.append((st, agent_gpu[st.pid]))
                elif sum(1 for e in engines if e.kind == st.engine.split(":", 1)[0]) <= 1:
                    self._unowned.append((st, None))
        return self._unowned


# A Snapshot's tick (its seq, the parts of its agent reading the drivers read, GPUs and busy figures) ->
# its drivers, for the Snapshots of the last few ticks: each is in the verdict's window for
# window_seconds, as the copies the pipeline and the history make of it (verdicts and totals set, then
# its totals, engines' pages and agents' raw windows dropped), which share those parts and whose engines
# differ at most by their pages (`raw`, which no verdict reads): its drivers, and every GPU's views of
# it, made once. The size grows with the window. The drivers hold only the parts they read, not the
# Snapshot with its totals (large at 64 GPUs, and dropped by the history) nor its agents' raw windows
# (their packed intervals, ~7 KiB a GPU a tick with CUPTI agents, dropped by the history too).
_DRIVERS: ByIdentity[_Drivers] = ByIdentity(8)


def _driving(agent: AgentReading | None) -> AgentReading | None:
    """Return the parts of an agent reading the drivers read (its activity, agents and steps), the same objects."""
    if agent is None:
        return None
    return AgentReading(activity=agent.activity, agents=agent.agents, steps=agent.steps)


def _drivers_of(snap: Snapshot) -> _Drivers:
    """Return a Snapshot's drivers (`_Drivers`), made once while it (or a copy of it) stays in the window."""
    agent = snap.agent

    def make() -> _Drivers:
        return _Drivers(
            Snapshot(
                seq=snap.seq,
                at=snap.at,
                mono=snap.mono,
                interval=snap.interval,
                dt=snap.dt,
                gpus=snap.gpus,
                engines=snap.engines,
                agent=_driving(agent),
                busy=snap.busy,
            )
        )

    parts = (agent.activity, agent.agents, agent.steps) if agent is not None else (None, None, None)
    drivers = _DRIVERS.get((*parts, snap.gpus, snap.busy), make, (snap.seq, len(snap.engines)))
    if not _same_but_pages(drivers.snap.engines, snap.engines):  # another Snapshot that shares those parts
        return make()
    return drivers


def _same_but_pages(kept: Sequence[EngineReading], now: Sequence[EngineReading]) -> bool:
    """Say whether two ticks' engines are the same readings but for pages dropped since (`sampling.retire`)."""
    return kept is now or all(
        a is b or (a.raw is not None and b.raw is None and replace(a, raw=None) == b)
        for a, b in zip(kept, now, strict=True)
    )


class _Tick:
    """What the verdict of every GPU reads alike in one window: computed once per tick, not once per GPU."""

    __slots__ = ("_facts", "_lost", "activity", "busy_inside", "drivers")

    def __init__(self, win: Sequence[Snapshot], cfg: VerdictConfig) -> None:
        _DRIVERS.size = max(_DRIVERS.size, 2 * len(win) + 2)  # a longer window (verdict.*_seconds) keeps more
        self.drivers = [_drivers_of(s) for s in win]
        self.busy_inside = _inside(window(win, cfg.busy_window_seconds))
        self.activity = [_activity_of(s.agent) for s in _inside(win) if s.agent is not None]
        self._lost: tuple[str, ...] | None = None
        self._facts: dict[tuple[object, ...], dict[str, object]] = {}

    def shared(self, key: tuple[object, ...], make: Callable[[], dict[str, object]]) -> dict[str, object]:
        """Return what `make` gives, once per key this tick (facts that GPUs with the same views read alike).

        The views of each tick come from `drivers` (shared between GPUs of the same engines and
        steps, held there for this tick), so the lists' identities name what such facts are read from.
        """
        facts = self._facts.get(key)
        if facts is None:
            facts = self._facts[key] = make()
        return facts

    def lost(self, last: Snapshot) -> tuple[str, ...]:
        """Return the newest tick's engines placed on no GPU (`unplaced`)."""
        if self._lost is None:
            self._lost = unplaced(last)
        return self._lost


def _counter_rate(win: Sequence[Snapshot], vs: Sequence[Sequence[View]], attr: str) -> float | None:
    """Return the per-second increase of an engine counter over the window, summed over engines.

    Per engine, from its first to its last reading in the window whose page was read at its tick:
    a page carried between slow reads (`EngineReading.page_read` False) tells no value at that time.
    """
    if len(win) < 2:
        return None

    def value(e: EngineReading) -> float | None:
        return _steps_total(e) if attr == "steps" else getattr(e, attr)

    first: dict[str, tuple[float, float]] = {}
    last: dict[str, tuple[float, float]] = {}
    for s, v in zip(win, vs, strict=True):
        for x in v:
            b = value(x.reading) if x.reading.page_read else None
            if b is not None:
                first.setdefault(x.reading.name, (s.mono, b))
                last[x.reading.name] = (s.mono, b)
    total = 0.0
    seen = False
    for name, (t1, b) in last.items():
        t0, a = first[name]
        if t1 <= t0 or b < a:
            continue
        total += (b - a) / (t1 - t0)
        seen = True
    return total if seen else None


def busy_of(snap: Snapshot, gpu: int, prefer: str = "fresh") -> tuple[float, str] | None:
    """Return the busy share the verdict uses for one tick, and its source (analysis.busy.for_verdict)."""
    return busy.for_verdict(snap, gpu, prefer)


def _probe_bandwidth(snap: Snapshot, gpu: int) -> float | None:
    """Return the HBM bandwidth the probe measured on a GPU (its `ProbeSummary` in Snapshot.probe), or None.

    The probe measures a copy (bytes read plus written per second), which is also what a stream
    of weight reads reaches.
    """
    entry = snap.probe.get(str(gpu))
    value = entry.hbm_bandwidth_bytes_per_second if entry is not None else None
    return value if value is not None and value > 0 else None


def gather(
    win: Sequence[Snapshot],
    gpu: int,
    cfg: VerdictConfig,
    roofline: RooflineConfig | None = None,
    whole: bool = False,
    tick: _Tick | None = None,
) -> Facts:
    """Return what a window (from `window()`) shows about one GPU (whole: CUPTI shares over all of it).

    `tick`: what every GPU of this window reads alike, built once by `classify_all` (else here).
    """
    if not win:
        return Facts(gpu)
    if tick is None:
        tick = _Tick(win, cfg)
    last = win[-1]
    vs = [d.views(gpu) for d in tick.drivers]
    span = max(0.0, last.mono - win[0].mono) if len(win) > 1 else 0.0
    f: dict[str, object] = {"gpu": gpu, "span_seconds": span}
    f.update(_busy(win, gpu, cfg, tick.busy_inside))
    good = [(s, v) for s, v in zip(_inside(win), _inside(vs), strict=True) if v]
    if good:  # the engine's facts: once a tick for GPUs with the same views (an engine's TP GPUs)
        f.update(
            tick.shared(
                (whole, *map(id, vs)),
                lambda: {**_engine_facts(win, vs, good, cfg, whole), **_offered(win, vs, cfg)},
            )
        )
    elif lost := tick.lost(last):
        f["unplaced"] = "+".join(lost)
    f.update(_agent_activity(tick.activity, gpu, whole))
    names = {x.reading.name for _, v in good for x in v}
    ran_all = bool(good) and all((_sum([x.running for x in v]) or 0) > 0 for _, v in good)
    mine = [_gpu_steps(d, v, names, gpu) for d, v in zip(_inside(tick.drivers), _inside(vs), strict=True)]
    f.update(_step_timing(win, vs, mine, ran_all, span))
    f.update(_graph_steps(win, vs, mine, gpu, span))
    if good and "graph_share" not in f and "graph_step_share" not in f:
        f.update(_graph_config(good))

    # NVML: power against its limit, clocks (latest).
    g = last.gpu(gpu)
    if g is not None:
        f["power_watts"] = g.power_watts
        f["power_limit_watts"] = g.power_limit_watts
        if g.sm_clock_hz and g.sm_clock_max_hz:
            f["sm_clock_ratio"] = g.sm_clock_hz / g.sm_clock_max_hz
    if last.host is not None:
        f["host_cpu"] = last.host.cpu_busy

    # Roofline: weight bytes per step over bandwidth, against the achieved step time.
    if roofline is not None and roofline.weight_bytes_per_step:
        bw = roofline.hbm_bandwidth_bytes_per_second or _probe_bandwidth(last, gpu)
        if bw:
            floor = roofline.weight_bytes_per_step / bw
            f["roofline_floor_seconds"] = floor
            # Achieved: steps per second while requests ran all window (the seed's "14 steps/s where
            # the floor allows 48"), so time between steps counts; a step's own wall time would not.
            achieved = f.get("steps_per_second")
            if isinstance(achieved, float) and achieved > 0 and ran_all:
                f["roofline_achieved_ratio"] = floor * achieved
    return Facts.of(f)


def _busy(
    win: Sequence[Snapshot], gpu: int, cfg: VerdictConfig, busy_inside: Sequence[Snapshot]
) -> dict[str, object]:
    """Return the busy share over the (short) busy window: the latest ticks, weighted by their length.

    `busy_inside`: the busy window's snapshots whose figures count (`_Tick.busy_inside`).
    """
    latest = busy_of(win[-1], gpu, cfg.busy_source)
    if latest is None:
        return {}
    rows = [(b, s.dt) for s in busy_inside if (b := busy_of(s, gpu, cfg.busy_source)) is not None]
    out: dict[str, object] = {
        "busy": _weighted_mean([(b[0], dt) for b, dt in rows if b[1] == latest[1]]),
        "busy_source": latest[1],
    }
    if latest[1] == "gpm":
        g = win[-1].gpu(gpu)
        if g is not None and g.gpm is not None and g.gpm.graphics_estimated:
            out["busy_estimated"] = True
    return out


def _engine_facts(
    win: Sequence[Snapshot],
    vs: Sequence[Sequence[View]],
    good: Sequence[tuple[Snapshot, Sequence[View]]],
    cfg: VerdictConfig,
    whole: bool,
) -> dict[str, object]:
    """Return the engine's latest counts, their means and growth, rates, API servers and throttling."""
    f: dict[str, object] = {"engine": True}
    s_last, v_last = good[-1]
    f["counts_source"] = "agent" if any(x.counts == "agent" for x in v_last) else "page"
    f["running"] = _sum([x.running for x in v_last])
    f["waiting"] = _sum([x.waiting for x in v_last])
    run_pairs = [(r, s.dt) for s, v in good if (r := _sum([x.running for x in v])) is not None]
    wait_pairs = [(w, s.dt) for s, v in good if (w := _sum([x.waiting for x in v])) is not None]
    f["running_mean"] = _weighted_mean(run_pairs)
    f["waiting_mean"] = _weighted_mean(wait_pairs)
    s_first, v_first = good[0]
    r0, r1 = _sum([x.running for x in v_first]), f["running"]
    if len(good) > 1 and r0 is not None and isinstance(r1, float | int) and s_last.mono > s_first.mono:
        f["running_growth_per_second"] = (r1 - r0) / (s_last.mono - s_first.mono)
    limits = [x.limit for x in v_last if x.limit]
    f["max_batch"] = cfg.max_batch or (sum(limits) if limits else None)
    f["generation_tokens_per_second"] = _counter_rate(win, vs, "generation_tokens_total")
    f["prompt_tokens_per_second"] = _counter_rate(win, vs, "prompt_tokens_total")
    # API servers: the busiest thread's demand per server (by pid: CPU it ran plus run-queue
    # wait, so a thread starved by a quota or by neighbours still reads saturated), then the
    # busiest server. The window takes the median tick; over a whole run (`whole`) the mean.
    per_server: dict[int, list[tuple[float, float, float]]] = {}
    for s, v in good:
        for x in v:
            for p in x.reading.api_servers:
                want = demand(p)
                if want is not None:
                    per_server.setdefault(p.pid, []).append((want, p.cpu, s.dt))
    f["api_servers"] = len({p.pid for x in v_last for p in x.reading.api_servers}) or len(per_server)
    if per_server:
        stat = _weighted_mean if whole else _median
        means = {
            pid: (
                stat([(t, w) for t, _, w in rows]) or 0.0,
                stat([(c, w) for _, c, w in rows]) or 0.0,
            )
            for pid, rows in per_server.items()
        }
        thread, process = max(means.values())
        f["api_server_thread_cpu"] = thread
        f["api_server_process_cpu"] = process
    f.update(_throttling(win, vs))
    return f


def _throttled(before: CgroupCpu, now: CgroupCpu, seconds: float) -> float | None:
    """Return the share of quota periods throttled between two readings (else throttled s per s).

    None where the two read their counters at different cgroups (a quota set or lifted moved the one
    that binds): those counters are not one series.
    """
    if before.counted_at != now.counted_at:
        return None
    if None not in (now.periods, before.periods, now.throttled_periods, before.throttled_periods):
        periods = now.periods - before.periods  # type: ignore[operator]
        throttled = now.throttled_periods - before.throttled_periods  # type: ignore[operator]
        if periods > 0 and throttled >= 0:
            return throttled / periods
    if now.throttled_seconds is not None and before.throttled_seconds is not None and seconds > 0:
        return max(0.0, now.throttled_seconds - before.throttled_seconds) / seconds
    return None


def _quota_starved(before: EngineReading, now: EngineReading, cfg: VerdictConfig, seconds: float) -> bool:
    """Say whether an API server's cgroup was throttled over a tick while its API servers used the quota.

    Only cgroups of the engine's own processes count, and only while the API servers in them
    (an API server whose cgroup is unknown counts for each) use at least `_QUOTA_USE` of the
    quota, so a throttled neighbour beside an idle API server offers no work.
    """
    if not now.api_servers:
        return False
    prev = {c.path: c for c in before.cgroups}
    for c in now.cgroups:
        c0 = prev.get(c.path)
        if c.quota_cores is None or c0 is None:
            continue
        use = sum(p.cpu for p in now.api_servers if not p.cgroup or p.cgroup == c.path)
        if use < _QUOTA_USE * c.quota_cores:
            continue
        share = _throttled(c0, c, seconds)
        if share is not None and share >= cfg.throttled_share:
            return True
    return False


def _offered(win: Sequence[Snapshot], vs: Sequence[Sequence[View]], cfg: VerdictConfig) -> dict[str, object]:
    """Return whether work was offered to the engines, and which signals saw it.

    Gauges are instants, so the engine's running/waiting counts at any reading of the last
    `offered_window_seconds` (a queue that flickers 0/1 between readings still offers work).
    Counters and CPU figures already cover a whole tick, so they take the newest tick alone: a
    longer window would only delay `idle` after a load stops.
    """
    found: set[str] = set()
    recent = window(win, cfg.offered_window_seconds)
    n = len(recent) - 1 if len(recent) > 1 else 1
    if any((x.running or 0) > 0 or (x.waiting or 0) > 0 for v in vs[-n:] for x in v):
        found.add("engine_queue")
    i = next((k for k in range(len(vs) - 1, -1, -1) if vs[k]), None)
    if i is not None:
        before = {x.reading.name: x.reading for x in vs[i - 1]} if i > 0 else {}
        seconds = win[i].mono - win[i - 1].mono if i > 0 else 0.0
        for x in vs[i]:
            if any(st.running_seconds > 0 or st.waiting_seconds > 0 for st in x.steps):
                found.add("engine_steps")
            e, e0 = x.reading, before.get(x.reading.name)
            # Tokens moved within the newest tick only when both ends of it read the page: a
            # delta seen at a slow read spans many ticks, and a tick without a read says nothing.
            if (
                e0 is not None
                and e.page_read
                and e0.page_read
                and any(
                    a is not None and b is not None and b > a
                    for a, b in (
                        (e0.generation_tokens_total, e.generation_tokens_total),
                        (e0.prompt_tokens_total, e.prompt_tokens_total),
                    )
                )
            ):
                found.add("tokens")
            if any((demand(p) or 0.0) >= cfg.api_server_saturated for p in e.api_servers):
                found.add("api_server")
            if e0 is not None and _quota_starved(e0, e, cfg, seconds):
                found.add("cpu_quota")
    return {"offered": bool(found), "offered_by": "+".join(s for s in OFFERED_BY if s in found) or None}


# An agent reading's activity -> its records by GPU, for the readings of the last few ticks (each GPU's
# verdict reads every tick of its window: indexing once per reading keeps that linear in GPUs). Keyed by
# the activity alone, which the history's copies of a reading share (its raw windows dropped) and which
# is all that is held here.
_ACTIVITY_INDEX: ByIdentity[dict[int, list[GpuActivity]]] = ByIdentity(16)


def _activity_of(agent: AgentReading) -> dict[int, list[GpuActivity]]:
    """Return an agent reading's activity records by GPU, in their order."""
    activity = agent.activity

    def index() -> dict[int, list[GpuActivity]]:
        out: dict[int, list[GpuActivity]] = {}
        for a in activity:
            out.setdefault(a.gpu, []).append(a)
        return out

    return _ACTIVITY_INDEX.get((activity,), index)


def _agent_activity(
    indices: Sequence[dict[int, list[GpuActivity]]], gpu: int, whole: bool
) -> dict[str, object]:
    """Return CUPTI's exact busy, graph share and idle gaps for a GPU.

    `indices`: the activity by GPU of each snapshot inside the window that has an agent reading
    (`_Tick.activity`). CUPTI windows arrive 1-2 s late, so the shares come from the newest tick
    that brought one (averaging more would only add delay); `whole=True` (the report over a run)
    takes every window.
    """
    f: dict[str, object] = {}
    busy_ns = graph_ns = observed_ns = gaps = gap_ns = 0
    newest: tuple[int, int, int] | None = None
    for index in indices:
        for a in index.get(gpu, ()):
            f["agent"] = True
            if lossy(a):  # records lost: its busy, graph and gap figures undercount
                continue
            busy_ns += a.busy_ns
            graph_ns += a.graph_busy_ns
            observed_ns += a.observed_ns
            gaps += sum(a.idle_gap_counts)
            gap_ns += a.idle_gap_sum_ns
            if a.observed_ns > 0:
                newest = (a.busy_ns, a.graph_busy_ns, a.observed_ns)
    if f.get("agent") and observed_ns > 0:
        f["idle_gaps"] = gaps
        f["idle_gap_seconds_per_second"] = gap_ns / observed_ns
        cb, cg, co = (busy_ns, graph_ns, observed_ns) if whole or newest is None else newest
        f["agent_busy_ratio"] = cb / co
        if cb > 0:
            f["graph_share"] = min(1.0, cg / cb)
    return f


def _gpu_steps(drivers: _Drivers, v: Sequence[View], names: set[str], gpu: int) -> list[EngineSteps]:
    """Return the agent steps of one tick that belong to the GPU's engines.

    Steps joined to an engine (by pid, name, or the only engine of their kind) belong to it alone.
    Steps that join none belong to the GPU of the agent that sent them where it says one; else they
    count for every GPU whose engines share their kind (as before agents sent pids), unless several
    engines of that kind run: then whose steps they are cannot be told, and they count nowhere.
    """
    mine = [st for x in v for st in x.steps]
    agent = drivers.snap.agent
    if agent is None or not agent.steps:
        return mine
    for st, agent_gpu in drivers.unowned():
        if agent_gpu is not None:
            if agent_gpu == gpu:
                mine.append(st)
        elif _step_matches(st.engine, names):
            mine.append(st)
    return mine


def _step_timing(
    win: Sequence[Snapshot],
    vs: Sequence[Sequence[View]],
    mine: Sequence[Sequence[EngineSteps]],
    ran_all: bool,
    span: float,
) -> dict[str, object]:
    """Return the steps' rate and wall time, and their GPU time where CUPTI ran in the engine's process.

    `mine`: the GPU's agent steps of each tick inside the window (`_gpu_steps`).

    vLLM's multiprocess executor times steps in EngineCore and runs the GPU in workers, so GPU
    time per step is there only for steps marked `gpu_measured`.
    """
    f: dict[str, object] = {}
    steps = wall_ns = measured = step_gpu_ns = 0
    for tick in mine:
        for st in tick:
            steps += st.steps
            wall_ns += st.wall_ns
            if st.gpu_measured:
                measured += st.steps
                step_gpu_ns += st.gpu_busy_ns
    if steps > 0:
        f["step_method"] = "agent"
        f["step_seconds"] = wall_ns / steps / 1e9
        if measured:
            f["step_gpu_seconds"] = step_gpu_ns / measured / 1e9
        if span > 0:
            f["steps_per_second"] = steps / span
    elif any(vs[1:]) and len(win) > 1 and span > 0:
        rate = _counter_rate(win, vs, "steps")
        if rate:
            f["steps_per_second"] = rate
            # Steps over time are a step time only while the engine ran work all window long.
            if ran_all:
                f["step_method"] = "engine"
                f["step_seconds"] = 1.0 / rate
    return f


def _graph_steps(
    win: Sequence[Snapshot],
    vs: Sequence[Sequence[View]],
    mine: Sequence[Sequence[EngineSteps]],
    gpu: int,
    span: float,
) -> dict[str, object]:
    """Return the share of engine steps that ran in a CUDA graph, from the light agent (no CUPTI).

    From step modes (graph_steps / (graph_steps + eager_steps)) where the agent tells them; else,
    for a GPU whose processes captured graphs, replays over steps (agent steps, else the page's in
    the ticks the counts cover: `_covered_steps`), capped at 1: a process that captured graphs but
    replays none while steps run decodes eager.
    Replays count graph pieces under vLLM PIECEWISE, so that figure is an upper bound.
    """
    f: dict[str, object] = {}
    graph = eager = tokens = seqs = steps = 0
    for tick in mine:  # the GPU's agent steps of each tick inside the window (`_gpu_steps`)
        for st in tick:
            graph += st.graph_steps
            eager += st.eager_steps
            tokens += st.tokens
            seqs += st.seqs
            steps += st.steps
    if tokens > 0 and seqs > 0:
        f["step_tokens_per_seq"] = tokens / seqs
    if graph + eager > 0:
        f["graph_step_share"] = graph / (graph + eager)
        f["graph_step_method"] = "modes"
        return f
    pids = {pid for v in vs for x in v for pid in x.reading.pids}
    replays = 0
    captured = False
    covers: dict[int, list[tuple[int, int]]] = {}
    for s in _inside(win):
        for use in s.agent.graphs if s.agent is not None else ():
            if use.gpu == gpu or (use.gpu < 0 and use.pid in pids):
                replays += use.replays
                captured = captured or use.captures > 0
                if use.until_ns > use.since_ns > 0:
                    covers.setdefault(use.pid, []).append((use.since_ns, use.until_ns))
    if not captured:
        return f
    if not steps and covers:
        steps = _covered_steps(win, vs, covers)
    elif not steps and span > 0:  # a recording from before the counts said what they cover
        steps = round((_counter_rate(win, vs, "steps") or 0.0) * span)
    if steps > 0:
        f["graph_step_share"] = min(1.0, replays / steps)
        f["graph_step_method"] = "replays"
    return f


# A tick's page steps count against the agent's replays once its counts cover this much of the tick.
_COVERED = 0.9


def _merged(spans: list[tuple[int, int]]) -> list[list[int]]:
    """Return spans merged where they touch or overlap, in order."""
    out: list[list[int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return out


def _covers(merged: list[list[int]], lo: int, hi: int) -> bool:
    """Say whether merged spans cover [lo, hi] to its end and `_COVERED` of it in all.

    The end must be covered: a message sent at a burst's first call covers the time before the
    burst, not the steps the page shows after it. The slack is the start's: a quiet agent's ticks
    are counted when the feed is read, a little after the tick's time.
    """
    if not any(c_lo < hi <= c_hi + 1_000_000 for c_lo, c_hi in merged):  # 1 ms: clocks read apart
        return False
    return sum(max(0, min(hi, c_hi) - max(lo, c_lo)) for c_lo, c_hi in merged) >= _COVERED * (hi - lo)


def _covered_steps(
    win: Sequence[Snapshot], vs: Sequence[Sequence[View]], covers: dict[int, list[tuple[int, int]]]
) -> int:
    """Return the page's steps, over engines, in the ticks that every process's graph counts cover.

    The agent sends what its hooks counted when the engine's next call comes a period after its
    last send, so an engine that steps in short bursts (held back by its API servers, or its queue
    nearly empty) has its last burst's replays sent only with the next burst, while the page shows
    those steps at once. Steps at a time that no count covers yet are not known to have replayed
    nothing: only ticks covered (to their end, and `_COVERED` of them: `_covers`) by each
    process's counts' [since, until] (a message's window, a quiet agent's ticks) are compared with
    the replays.
    """
    per_pid = [_merged(spans) for spans in covers.values()]
    last: dict[str, tuple[int, float]] = {}
    total = 0.0
    for snap, v in zip(win, vs, strict=True):
        at = int(snap.at * 1e9)
        for x in v:
            b = _steps_total(x.reading) if x.reading.page_read else None
            if b is None:
                continue
            prev = last.get(x.reading.name)
            last[x.reading.name] = (at, b)
            if prev is None or at <= prev[0] or b < prev[1]:
                continue
            lo = prev[0]
            if all(_covers(merged, lo, at) for merged in per_pid):
                total += b - prev[1]
    return round(total)


def _throttling(win: Sequence[Snapshot], vs: Sequence[Sequence[View]]) -> dict[str, float]:
    """Return the quota and the throttled share of the engine's cgroups over the window (the worst).

    Each cgroup is measured from the first snapshot of the window that lists it, so a process
    moved into a throttled cgroup shows from its second tick there. Where the cgroup whose counters
    count moved within the window (an ancestor's quota set or lifted: `CgroupCpu.counted_at`), from
    the first reading at the newest one: the readings before it are another cgroup's counters, and
    waiting for them to leave the window would hide the throttling for a whole window.
    """
    out: dict[str, float] = {}
    if len(win) < 2:
        return out
    first: dict[str, tuple[float, CgroupCpu]] = {}
    for snap, v in zip(win, vs, strict=True):
        for x in v:
            for c in x.reading.cgroups:
                seen = first.get(c.path)
                if seen is None or seen[1].counted_at != c.counted_at:
                    first[c.path] = (snap.mono, c)
    i = next((k for k in range(len(vs) - 1, -1, -1) if vs[k]), len(vs) - 1)
    last_good = win[i]
    quotas = []
    share = per_second = None
    for x in vs[i]:
        for c in x.reading.cgroups:
            if c.quota_cores is not None:
                quotas.append(c.quota_cores)
            since, c0 = first.get(c.path, (last_good.mono, c))
            span = last_good.mono - since
            if span <= 0:  # a cgroup first listed (or first counted where it is now) at this tick
                continue
            if None not in (c.periods, c0.periods, c.throttled_periods, c0.throttled_periods):
                periods = c.periods - c0.periods  # type: ignore[operator]
                throttled = c.throttled_periods - c0.throttled_periods  # type: ignore[operator]
                if periods > 0 and throttled >= 0:
                    share = max(share or 0.0, throttled / periods)
            if c.throttled_seconds is not None and c0.throttled_seconds is not None:
                rate = max(0.0, c.throttled_seconds - c0.throttled_seconds) / span
                per_second = max(per_second or 0.0, rate)
    if quotas:
        out["quota_cores"] = min(quotas)
    if share is not None:
        out["throttled_share"] = share
    if per_second is not None:
        out["throttled_seconds_per_second"] = per_second
    return out


def _graph_config(good: Sequence[tuple[Snapshot, Sequence[View]]]) -> dict[str, object]:
    """Return the flag that sends decode outside CUDA graphs at the window's mean batch, for an engine that has one."""
    running: dict[str, list[tuple[float, float]]] = {}
    configs = {}
    for s, v in good:
        for x in v:
            if x.reading.graph_config is not None and x.running is not None:
                configs[x.reading.name] = x.reading.graph_config
                running.setdefault(x.reading.name, []).append((x.running, s.dt))
    for name, gc in configs.items():
        mean = _weighted_mean(running[name])
        if mean is not None and gc.eager_at(mean):
            return {"graph_config_eager": gc.source}
    return {}


def eager_decode(f: Facts, cfg: VerdictConfig) -> bool:
    """Say whether decode ran without CUDA graphs: CUPTI's graph share of busy time, the light agent's of steps, else the command line.

    Prefill-shaped steps (over DECODE_TOKENS_PER_SEQ tokens per sequence) run eager by design.
    """
    if not f.decoding:
        return False
    if f.step_tokens_per_seq is not None and f.step_tokens_per_seq > DECODE_TOKENS_PER_SEQ:
        return False
    return graphs_read_eager(f, cfg)


def graphs_read_eager(f: Facts, cfg: VerdictConfig) -> bool:
    """Say whether the window's graph figures put the GPU's work outside CUDA graphs (whatever the step's shape).

    CUPTI's graph share of busy time, the light agent's of steps, else the command line.
    """
    shares = [x for x in (f.graph_share, f.graph_step_share) if x is not None]
    if not shares:  # nothing measured the graphs: the command line may still say decode runs eager
        return f.graph_config_eager is not None
    return any(x < cfg.graph_share_low for x in shares)


def busy_edges(f: Facts, cfg: VerdictConfig, reported: str) -> tuple[float, ...]:
    """Return the busy shares at which the next tick's verdict could differ, given the one reported now, lowest first.

    The NVML source reads GPM GRAPHICS_UTIL, its dearest figure, on a busy GPU only where its
    estimate of it lies near one of these (`sources.nvml.GraphicsGate`). With an engine or an agent
    the busy share is held against a band (`_by_busy`, then `hold`): after `gpu` only falling
    below `busy_low` turns the verdict, and the band's midpoint decides the side a tick leans to
    (the hold's streak); after `host`, the midpoint and `busy_high`; after anything else, the
    midpoint alone (inside the band it picks the side). Both bands where the graphs read eager
    (decode may take the eager one next tick); while work waits (`work_waits`), the narrowed band's
    edges too (`queued_busy_low`, its midpoint), beside the usual ones (the wait may end).
    Without an engine, `idle_busy` too, and after `idle` (where the scheduled self-test reads the
    busy share against its own idle bar, 0.02 by default); without an engine or an agent,
    `idle_busy` and `busy_high` alone.
    """
    eager = graphs_read_eager(f, cfg)
    banded = f.engine or f.agent
    queued = f.engine and work_waits(f, cfg)  # the band narrows (`thresholds`)
    key = (id(cfg), eager, f.engine, banded, queued, reported)
    known = _EDGES.get(key)
    if known is not None and known[0] is cfg:  # a few tuples per config, not one per GPU per tick
        return known[1]
    if banded:
        bands = [(cfg.busy_low, cfg.busy_high)]
        if eager:
            bands.append((cfg.eager_busy_low, cfg.eager_busy_high))
        edges: list[float] = []
        for low, high in bands:
            mid = (low + high) / 2
            edges += (low, mid) if reported == "gpu" else (mid, high) if reported == "host" else (mid,)
            # the narrow band while work waits, beside the usual one (the wait may end next tick)
            if queued:
                q = _queued_low(low, high, cfg)
                edges += (q, (q + high) / 2) if reported == "gpu" else ((q + high) / 2,)
        # an agent's GPU without an engine reads idle below idle_busy; after idle, the self-test's idle
        # check reads near it too with its default bar (a raised bar: the NVML source's also_edges)
        if not f.engine or reported == "idle":
            edges.append(cfg.idle_busy)
    else:
        edges = [cfg.idle_busy, cfg.busy_high]
    made = tuple(sorted(set(edges)))
    if len(_EDGES) >= 64:  # configs come and go in tests; the daemon has one
        _EDGES.clear()
    _EDGES[key] = (cfg, made)
    return made


_EDGES: dict[tuple[int, bool, bool, bool, bool, str], tuple[VerdictConfig, tuple[float, ...]]] = {}


def engine_holds_work(f: Facts, cfg: VerdictConfig) -> bool:
    """Say whether the engine decodes with work queued or a full batch: the GPU then waits on the engine's own step.

    Without the agent's GPU time per step this is what shows host time inside the step (eager
    launches, scheduling, sampling on the CPU): requests run and more wait, or the batch is full,
    yet the GPU idles. Requests waiting with none running are no step (the engine may be stuck).
    """
    if f.running_mean is None or f.running_mean <= 0:
        return False
    if f.waiting_mean is not None and f.waiting_mean > cfg.waiting_empty:
        return True
    return bool(f.max_batch) and f.running_mean >= cfg.admission_fill * (f.max_batch or 0)


def _quota_throttled(f: Facts, cfg: VerdictConfig) -> bool:
    """Say whether a cgroup of the engine's is throttled by its quota (share of periods, else seconds per second)."""
    if f.throttled_share is not None:
        return f.throttled_share >= cfg.throttled_share
    return (f.throttled_seconds_per_second or 0.0) >= cfg.throttled_share


def _api_server_saturated(f: Facts, cfg: VerdictConfig) -> bool:
    """Say whether the busiest API-server thread is saturated."""
    return f.api_server_thread_cpu is not None and f.api_server_thread_cpu >= cfg.api_server_saturated


def work_waits(f: Facts, cfg: VerdictConfig) -> bool:
    """Say whether work waits for the GPU's engine: in its queue or a full batch, in a saturated API server, behind a quota.

    A GPU that is the bottleneck is busy while work waits for it, so then the band that keeps a
    previous `gpu` verdict starts at `queued_busy_low` (`thresholds`).
    """
    return engine_holds_work(f, cfg) or _api_server_saturated(f, cfg) or _quota_throttled(f, cfg)


def scheduler_stalled(f: Facts, cfg: VerdictConfig) -> bool:
    """Say whether requests wait in the engine's queue while none run: its scheduler admits none of them.

    A request being prefilled already counts as running, so a queue with nothing running and the
    GPU idle is the engine holding its requests back on the host: a grammar being compiled for
    structured output, KV blocks awaited from another instance, an adapter loading, a prompt larger
    than one step's token budget without chunked prefill (vLLM's WAITING_FOR_FSM, WAITING_FOR_REMOTE_KVS).
    """
    return (
        f.waiting_mean is not None
        and f.waiting_mean > cfg.waiting_empty
        and f.running_mean is not None
        and f.running_mean <= cfg.waiting_empty
    )


def host_reasons(f: Facts, cfg: VerdictConfig) -> tuple[str, ...]:
    """Return why a GPU with work offered is starved, root causes first; ("unknown",) when nothing fits."""
    found: set[str] = set()
    if _quota_throttled(f, cfg):
        found.add("cpu_quota_throttled")
    if _api_server_saturated(f, cfg):
        found.add("api_server_saturated")
    if eager_decode(f, cfg):
        found.add("cuda_graph_fallback")
    if (
        f.max_batch
        and f.waiting_mean is not None
        and f.running_mean is not None
        and f.waiting_mean <= cfg.waiting_empty
        and f.running_mean < cfg.admission_fill * f.max_batch
    ):
        found.add("admission_stalled")
    if scheduler_stalled(f, cfg):
        found.add("scheduler_stalled")
    share = f.step_gpu_share
    if share is not None and f.step_method == "agent":
        if share < cfg.step_gpu_share_low:
            found.add("step_overhead")
    elif "cuda_graph_fallback" not in found and engine_holds_work(f, cfg):
        found.add("step_overhead")  # inferred from the queue: only where no cause inside the step is known
    if not found:
        return ("unknown",)
    return tuple(r for r in HOST_REASONS if r in found)


def thresholds(f: Facts, cfg: VerdictConfig) -> tuple[float, float]:
    """Return the (low, high) busy thresholds for a window: the eager bar for GPM/NVML figures of eager decode.

    While work waits (`work_waits`: requests in the engine's queue or a full batch, a saturated API
    server, a throttled cgroup) the band's low edge is at least `queued_busy_low` (0.83): a GPU that
    is the bottleneck is busy while work waits for it, so one that idles a fifth of the time then
    waits on the host (eager decode that GPM reads inside the band, with no agent to see the graphs
    go). A narrow band is kept, not none: a GPU-bound load whose busy share wavers near `busy_high`
    does not flap.
    """
    low, high = cfg.busy_low, cfg.busy_high
    if f.busy_source in ("gpm", "nvml") and eager_decode(f, cfg):
        low, high = cfg.eager_busy_low, cfg.eager_busy_high
    return (_queued_low(low, high, cfg), high) if work_waits(f, cfg) else (low, high)


def _queued_low(low: float, high: float, cfg: VerdictConfig) -> float:
    """Return a band's low edge while work waits: raised to `queued_busy_low`, never past the high one."""
    return min(high, max(low, cfg.queued_busy_low))


def _by_busy(busy: float, band: tuple[float, float], prev: Verdict | None) -> str:
    """Return gpu or host from the busy share, keeping the previous one inside the band."""
    low, high = band
    if busy >= high:
        return "gpu"
    if busy < low:
        return "host"
    if prev is not None and prev.verdict in ("gpu", "host"):
        return prev.verdict
    return "gpu" if busy >= (low + high) / 2 else "host"


def decide(f: Facts, cfg: VerdictConfig, prev: Verdict | None = None) -> tuple[str, tuple[str, ...]]:
    """Return the window's verdict and reasons.

    With an engine: idle while no work is offered (`Facts.offered`: queue, tokens, saturated or
    throttled API servers); else by the busy share against `thresholds` (unknown,
    no_busy_source, without one). Without an engine but with an agent on the GPU (a plain torch
    process): the agent's activity says whether anything runs (idle below `idle_busy`), the busy
    share decides gpu or host, and a host verdict has the reasons the agent's evidence supports
    (graph share, step timing), else unknown (no queue to read). With
    neither: a GPU at or above busy_high is GPU-bound whatever runs on it, one below `idle_busy`
    is idle, and anything between is unknown, no_engine_source. A GPU no placed engine drives
    while an engine could be placed on no GPU is unknown, no_gpu_mapping: its engine may be that
    one, so neither its queue nor its API servers can be read for it.
    """
    if f.unplaced and not f.engine:
        return "unknown", ("no_gpu_mapping",)
    if f.engine:
        if not f.offered:
            return "idle", ()
        if f.busy is None:
            return "unknown", ("no_busy_source",)
        v = _by_busy(f.busy, thresholds(f, cfg), prev)
        return v, host_reasons(f, cfg) if v == "host" else ()
    if f.busy is None:
        return "unknown", ("no_busy_source", "no_engine_source")
    if f.busy < cfg.idle_busy:
        return "idle", ()
    if f.agent:
        v = _by_busy(f.busy, (cfg.busy_low, cfg.busy_high), prev)
        return v, host_reasons(f, cfg) if v == "host" else ()
    if f.busy >= cfg.busy_high:
        return "gpu", ()
    return "unknown", ("no_engine_source",)


def hold(
    raw: Verdict,
    prev: Verdict | None,
    cfg: VerdictConfig,
    host_now: tuple[str, ...] = ("unknown",),
    lean: str | None = None,
) -> Verdict:
    """Return the verdict to report: a change shows once hold_ticks ticks in a row have disagreed.

    A tick disagrees when its raw verdict differs from the reported one, or when its busy share
    sits in the band but on the other side of the band's midpoint (`lean`): the tick that
    straddles a change of load often lands there and should count toward the change without
    being able to make it. The switch itself needs a raw verdict outside the band, so a load that
    hovers inside the band never flips. While an old host verdict is held, its reasons are this
    window's (`host_now`), so they stay current.
    """
    lean = raw.verdict if lean is None else lean
    shown = raw if raw.raw == raw.verdict and raw.streak == 0 else None  # already as reported unheld
    if prev is None or (raw.verdict == prev.verdict and lean == prev.verdict):
        return shown if shown is not None else replace(raw, raw=raw.verdict, streak=0)
    streak = prev.streak + 1
    if raw.verdict != prev.verdict and streak >= cfg.hold_ticks:
        return shown if shown is not None else replace(raw, raw=raw.verdict, streak=0)
    reasons = host_now if prev.verdict == "host" else prev.reasons
    return replace(raw, verdict=prev.verdict, reasons=reasons, raw=raw.verdict, streak=streak)


def classify(
    win: Sequence[Snapshot],
    gpu: int,
    cfg: VerdictConfig,
    prev: Verdict | None = None,
    roofline: RooflineConfig | None = None,
    tick: _Tick | None = None,
) -> Verdict:
    """Return the verdict to report for one GPU: the window's verdict, held against the previous one."""
    f = gather(win, gpu, cfg, roofline, tick=tick)
    verdict, reasons = decide(f, cfg, prev)
    raw = Verdict(
        gpu,
        verdict,
        reasons,
        f.busy,
        f.busy_source,
        f.evidence(),
        raw=verdict,
        offered=f.offered,
        edges=busy_edges(f, cfg, verdict),
    )
    # What `hold` reads only in some cases is worked out only then: the side of the band's midpoint
    # (`lean`, without prev the verdict itself) while the verdict stays, the window's host reasons
    # while a host verdict is held.
    lean = verdict
    if prev is not None and verdict == prev.verdict:
        lean = decide(f, cfg, None)[0]  # inside the band: the side of its midpoint
    host_now = reasons
    if verdict != "host":
        host_now = host_reasons(f, cfg) if prev is not None and prev.verdict == "host" else ("unknown",)
    out = hold(raw, prev, cfg, host_now, lean)
    if out.verdict != verdict:  # the hold kept the previous verdict: the next tick reads from that one
        out = replace(out, edges=busy_edges(f, cfg, out.verdict))
    return out


def gpus_of(snap: Snapshot) -> list[int]:
    """Return the GPUs a Snapshot knows about (NVML, busy sources, agents, engines)."""
    found = {g.index for g in snap.gpus} | set(snap.busy)
    if snap.agent is not None:
        found |= {a.gpu for a in snap.agent.activity if a.gpu >= 0}
    for e in snap.engines:
        found |= set(e.gpus)
    return sorted(found)


def _reach(v: VerdictConfig) -> float:
    """Return how far back the verdict reads: its longest window."""
    return max(v.window_seconds, v.busy_window_seconds, v.offered_window_seconds)


def classify_all(history: Sequence[Snapshot], cfg: Config) -> tuple[Verdict, ...]:
    """Return the verdict of every GPU for the newest Snapshot of a history (oldest first)."""
    if not history:
        return ()
    v = cfg.verdict
    win = window(history, _reach(v))
    prev_snap = history[-2] if len(history) > 1 else None
    prev = {p.gpu: p for p in prev_snap.verdicts} if prev_snap is not None else {}
    tick = _Tick(win, v)  # what every GPU reads alike, once
    return tuple(classify(win, gpu, v, prev.get(gpu), cfg.roofline, tick) for gpu in gpus_of(history[-1]))


def classify_tick(history: Sequence[Snapshot], snap: Snapshot, cfg: Config) -> Snapshot:
    """Return the Snapshot with its verdicts set (the pipeline's hook; history excludes snap)."""
    return replace(snap, verdicts=classify_all((*history, snap), cfg))


def replay(snapshots: Sequence[Snapshot], cfg: Config) -> list[Snapshot]:
    """Return the snapshots with verdicts recomputed tick by tick (for recordings and tests)."""
    out: list[Snapshot] = []
    keep = max(2, int(_reach(cfg.verdict) / cfg.tick_seconds) + 4)
    for snap in snapshots:
        out.append(classify_tick(out[-keep:], replace(snap, verdicts=()), cfg))
    return out


VERDICT_KEYS = GpuKeys(GpuVerdict, VERDICTS)  # each GPU's bound_seconds keys, made once


def accumulate(snap: Snapshot, cfg: Config, prev: Snapshot | None = None) -> Totals:
    """Return this tick's time per verdict and host-bound seconds.

    bound_seconds[gpu, verdict] adds dt to the reported verdict.
    host_bound_seconds[gpu] adds the GPU's idle time while work was offered to an
    engine driving it (`Verdict.offered`: in its queue, in flight, or held before it by a saturated
    or throttled API server; without a verdict, while requests ran): with an agent, the exact idle
    time of the windows the agent closed (observed minus busy); else (1 - busy share) x dt.
    Without an engine nothing is added.
    """
    if snap.dt <= 0:
        return EMPTY
    bound, host_bound = Tally[GpuVerdict](), Tally[int]()
    dt, get = snap.dt, bound.get
    for v in snap.verdicts:  # every series from the first tick, so rate() sees each start from 0
        for name, key in zip(VERDICTS, VERDICT_KEYS(v.gpu), strict=True):  # Tally.count; dt > 0
            bound[key] = get(key, 0.0) + (dt if name == v.verdict else 0.0)
    verdicts = {v.gpu: v for v in snap.verdicts}
    by_gpu = _activity_of(snap.agent) if snap.agent is not None else {}
    live = [  # the live engines with counts, each placed once (not once per GPU)
        (placed(e, snap), e)
        for e in snap.engines
        if not e.error and (e.running is not None or e.waiting is not None)
    ]
    for gpu in gpus_of(snap):
        running = _sum([e.running for gpus, e in live if gpu in gpus])
        verdict = verdicts.get(gpu)
        offered = verdict.offered if verdict is not None else (running or 0.0) > 0
        if running is None and not offered:
            continue
        idle = 0.0
        if offered:
            acts = by_gpu.get(gpu, ())
            if acts and snap.busy.get(gpu, (0.0, ""))[1] == "cupti":
                idle = sum(max(0, a.observed_ns - a.busy_ns) for a in acts) / 1e9
            elif gpu in snap.busy:
                idle = max(0.0, 1.0 - snap.busy[gpu][0]) * snap.dt
        host_bound.count(gpu, idle)
    return Totals(verdict=VerdictTotals(bound, host_bound))
