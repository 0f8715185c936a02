"""The verdict: is each GPU idle, GPU-bound or host-bound (and why), from a sliding window of Snapshots.

Two steps, both pure:
- `decide(facts, cfg, prev)` classifies one window (`gather` collects its facts): `idle` when no request is running or
  waiting, `gpu` when the busy share is at or above `busy_high` while work is pending, `host`
  below `busy_low`, with reasons from the evidence in the window; `unknown` when a source the
  decision needs is missing. Between the two thresholds the previous verdict stays (a band of
  hysteresis on the busy share itself: a GPU at 78% busy that was GPU-bound stays GPU-bound, one
  that was host-bound stays host-bound); with no previous gpu/host verdict the midpoint decides.
- `hold(raw, prev, cfg)` reports a change only once `hold_ticks` ticks in a row disagreed with
  the reported verdict (the tick that straddles a change counts when its busy share leans to the
  new side of the band's midpoint), so one odd tick (a GC pause, a slow scrape) does not flap
  the gauge and a load hovering inside the band never flips.

Timing. The engine's queue is read at the tick, so the busy share must be of the same tick:
by default (`busy_source = "fresh"`) the verdict takes NVML GPM GRAPHICS_UTIL (else
utilization.gpu) of the latest tick (`busy_window_seconds`, 0.5 s), and CUPTI only where NVML
is missing. The CUPTI figure is exact but 1-2 s late (an agent window closes once older than its
flush lag); thresholding it against a live queue would show "host" for the first second of every
load. CUPTI still feeds the evidence: graph share, idle gaps, step GPU time, host-bound seconds.
With a 2-tick hold a step change in load shows in the reported verdict 0.5-1.4 s after it
happens. Reasons are rates and shares over `window_seconds` (1.5 s), so they are steady, and
right again within 2 s of a change (CUPTI-based ones take the newest agent window, 1-2 s late).

Engines without an agent, agents without an engine: see `evaluate`. The integrated counters
(time per verdict, host-bound seconds) are in `accumulate`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from exporter.analysis.increments import Increments
from exporter.config import Config, RooflineConfig, VerdictConfig
from exporter.snapshot import Snapshot
from exporter.snapshot.engine import EngineReading, demand
from exporter.snapshot.host import CgroupCpu
from exporter.snapshot.verdict import HOST_REASONS, VERDICTS, Evidence, Verdict

# Ticks may jitter; a snapshot this share of a tick older than the window edge still counts as inside.
_JITTER = 0.25


@dataclass(frozen=True)
class Facts:
    """What one window shows about one GPU (None where no source tells)."""

    gpu: int
    busy: float | None = None  # share of wall time, over busy_window_seconds
    busy_source: str | None = None
    engine: bool = False  # a relevant engine reading exists in the window
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

    def evidence(self) -> Evidence:
        """Return the facts as (name, value) pairs for the Verdict and the report."""
        skip = {"gpu", "engine", "agent", "span_seconds"}
        out: list[tuple[str, float | str | None]] = []
        for f in dataclasses.fields(self):
            if f.name in skip:
                continue
            value = getattr(self, f.name)
            if value is None:
                continue
            out.append((f.name, float(value) if isinstance(value, bool | int) else value))
        for name in ("step_gpu_share", "power_share", "pending"):
            value = getattr(self, name)
            if value is not None:
                out.append((name, value))
        out.append(("window_seconds", self.span_seconds))
        return tuple(out)


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


def _inside(win: Sequence[Snapshot]) -> Sequence[Snapshot]:
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


def drives(engine: EngineReading, gpu: int) -> bool:
    """Say whether an engine drives a GPU (an engine that does not say drives all)."""
    return not engine.gpus or gpu in engine.gpus


def _engines(snap: Snapshot, gpu: int) -> list[EngineReading]:
    return [
        e
        for e in snap.engines
        if drives(e, gpu) and not e.error and (e.running is not None or e.waiting is not None)
    ]


def _sum(values: Sequence[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return sum(got) if got else None


def _steps_total(e: EngineReading) -> float | None:
    return e.steps.total if e.steps is not None else None


def _counter_rate(win: Sequence[Snapshot], gpu: int, attr: str) -> float | None:
    """Return the per-second increase of an engine counter over the window, summed over engines."""
    if len(win) < 2:
        return None
    first, last = win[0], win[-1]
    span = last.mono - first.mono
    if span <= 0:
        return None

    def value(e: EngineReading) -> float | None:
        return _steps_total(e) if attr == "steps" else getattr(e, attr)

    before = {e.name: value(e) for e in _engines(first, gpu)}
    total = 0.0
    seen = False
    for e in _engines(last, gpu):
        a, b = before.get(e.name), value(e)
        if a is None or b is None or b < a:
            continue
        total += b - a
        seen = True
    return total / span if seen else None


def busy_of(snap: Snapshot, gpu: int, prefer: str = "fresh") -> tuple[float, str] | None:
    """Return the busy share the verdict uses for one tick, and its source.

    "fresh" (the default): NVML GPM GRAPHICS_UTIL, else utilization.gpu, measured over this very
    tick like the engine's queue, else the pipeline's pick. The CUPTI figure is exact but arrives
    1-2 s late (the agent closes a window only once it is older than its flush lag), which would
    delay every switch and show a false "host" for the first second of load. "best": the
    pipeline's pick (CUPTI first) for every tick.
    """
    if prefer == "fresh":
        g = snap.gpu(gpu)
        if g is not None:
            if g.gpm is not None and g.gpm.graphics is not None:
                return g.gpm.graphics, "gpm"
            if g.utilization is not None:
                return g.utilization, "nvml"
    return snap.busy.get(gpu)


def _step_matches(engine: str, names: set[str]) -> bool:
    """Say whether agent steps counted under `engine` ("vllm", or "vllm:8000") belong to one of the engines."""
    return not names or engine in names or any(n.split(":", 1)[0] == engine for n in names)


def _probe_bandwidth(snap: Snapshot, gpu: int) -> float | None:
    """Return the probe's HBM bandwidth for a GPU (Snapshot.probe: {"0": {"hbm_bandwidth_bytes_per_second": ...}}).

    The probe measures a copy (bytes read plus written per second), which is also what a stream
    of weight reads reaches.
    """
    if not snap.probe:
        return None
    entry = snap.probe.get(str(gpu), snap.probe.get(gpu))  # type: ignore[call-overload]
    value = entry.get("hbm_bandwidth_bytes_per_second") if isinstance(entry, Mapping) else None
    if value is None:
        value = snap.probe.get("hbm_bandwidth_bytes_per_second")
        if isinstance(value, Mapping):
            value = value.get(str(gpu), value.get(gpu))
    return float(value) if isinstance(value, int | float) and value > 0 else None


def gather(
    win: Sequence[Snapshot],
    gpu: int,
    cfg: VerdictConfig,
    roofline: RooflineConfig | None = None,
    whole: bool = False,
) -> Facts:
    """Return what a window (from `window()`) shows about one GPU (whole: CUPTI shares over all of it)."""
    if not win:
        return Facts(gpu)
    last = win[-1]
    inside = _inside(win)
    f: dict[str, object] = {
        "gpu": gpu,
        "span_seconds": max(0.0, last.mono - win[0].mono) if len(win) > 1 else 0.0,
    }

    # Busy share over the (short) busy window: the latest ticks, weighted by their length.
    busy_win = window(win, cfg.busy_window_seconds)
    latest = busy_of(last, gpu, cfg.busy_source)
    if latest is not None:
        rows = [(b, s.dt) for s in _inside(busy_win) if (b := busy_of(s, gpu, cfg.busy_source)) is not None]
        f["busy"] = _weighted_mean([(b[0], dt) for b, dt in rows if b[1] == latest[1]])
        f["busy_source"] = latest[1]

    # Engine: latest good reading in the window, means, growth, rates.
    readings = [(s, _engines(s, gpu)) for s in inside]
    good = [(s, es) for s, es in readings if es]
    if good:
        f["engine"] = True
        s_last, es_last = good[-1]
        f["running"] = _sum([e.running for e in es_last])
        f["waiting"] = _sum([e.waiting for e in es_last])
        run_pairs = [(v, s.dt) for s, es in good if (v := _sum([e.running for e in es])) is not None]
        wait_pairs = [(v, s.dt) for s, es in good if (v := _sum([e.waiting for e in es])) is not None]
        f["running_mean"] = _weighted_mean(run_pairs)
        f["waiting_mean"] = _weighted_mean(wait_pairs)
        s_first, es_first = good[0]
        r0, r1 = _sum([e.running for e in es_first]), _sum([e.running for e in es_last])
        if len(good) > 1 and r0 is not None and r1 is not None and s_last.mono > s_first.mono:
            f["running_growth_per_second"] = (r1 - r0) / (s_last.mono - s_first.mono)
        batches = [e.max_num_seqs for e in es_last if e.max_num_seqs]
        max_batch = cfg.max_batch or (sum(batches) if batches else None)
        f["max_batch"] = max_batch
        f["generation_tokens_per_second"] = _counter_rate(win, gpu, "generation_tokens_total")
        f["prompt_tokens_per_second"] = _counter_rate(win, gpu, "prompt_tokens_total")
        # API servers: the busiest thread's demand per server (by pid: CPU it ran plus run-queue
        # wait, so a thread starved by a quota or by neighbours still reads saturated), then the
        # busiest server. The window takes the median tick; over a whole run (`whole`) the mean.
        per_server: dict[int, list[tuple[float, float, float]]] = {}
        for s, es in good:
            for e in es:
                for p in e.api_servers:
                    want = demand(p)
                    if want is not None:
                        per_server.setdefault(p.pid, []).append((want, p.cpu, s.dt))
        f["api_servers"] = len({p.pid for e in es_last for p in e.api_servers}) or len(per_server)
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
        f.update(_throttling(win, gpu))

    # Agent: exact busy, graph share, idle gaps, steps. CUPTI windows arrive 1-2 s late, so the
    # shares come from the newest tick that brought one (averaging more would only add delay);
    # `whole=True` (the report over a run) takes every window instead.
    busy_ns = graph_ns = observed_ns = gaps = gap_ns = 0
    newest: tuple[int, int, int] | None = None
    for s in inside:
        if s.agent is None:
            continue
        for a in s.agent.activity:
            if a.gpu == gpu:
                f["agent"] = True
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
    engine_names = {e.name for _, es in good for e in es}
    # Steps timed by the agent; their GPU time only where CUPTI ran in the engine's own process
    # (vLLM's multiprocess executor times steps in EngineCore and runs the GPU in workers).
    steps = wall_ns = measured = step_gpu_ns = 0
    for s in inside:
        if s.agent is None:
            continue
        for st in s.agent.steps:
            if not _step_matches(st.engine, engine_names):
                continue
            steps += st.steps
            wall_ns += st.wall_ns
            if st.gpu_measured:
                measured += st.steps
                step_gpu_ns += st.gpu_busy_ns
    span = float(f["span_seconds"])  # type: ignore[arg-type]
    ran_all = bool(good) and all((_sum([e.running for e in es]) or 0) > 0 for _, es in good)
    if steps > 0:
        f["step_method"] = "agent"
        f["step_seconds"] = wall_ns / steps / 1e9
        if measured:
            f["step_gpu_seconds"] = step_gpu_ns / measured / 1e9
        if span > 0:
            f["steps_per_second"] = steps / span
    elif good and len(win) > 1 and span > 0:
        rate = _counter_rate(win, gpu, "steps")
        if rate:
            f["steps_per_second"] = rate
            # Steps over time are a step time only while the engine ran work all window long.
            if ran_all:
                f["step_method"] = "engine"
                f["step_seconds"] = 1.0 / rate

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
    return Facts(**f)  # type: ignore[arg-type]


def _throttling(win: Sequence[Snapshot], gpu: int) -> dict[str, float]:
    """Return the quota and the throttled share of the engine's cgroups over the window (the worst).

    Each cgroup is measured from the first snapshot of the window that lists it, so a process
    moved into a throttled cgroup shows from its second tick there.
    """
    out: dict[str, float] = {}
    if len(win) < 2:
        return out
    first: dict[str, tuple[float, CgroupCpu]] = {}
    for snap in win:
        for e in _engines(snap, gpu):
            for c in e.cgroups:
                first.setdefault(c.path, (snap.mono, c))
    last_good = next((s for s in reversed(win) if _engines(s, gpu)), win[-1])
    quotas = []
    share = per_second = None
    for e in _engines(last_good, gpu):
        for c in e.cgroups:
            if c.quota_cores is not None:
                quotas.append(c.quota_cores)
            since, c0 = first.get(c.path, (last_good.mono, c))
            span = last_good.mono - since
            if span <= 0:
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


def host_reasons(f: Facts, cfg: VerdictConfig) -> tuple[str, ...]:
    """Return why a GPU with work pending is starved, root causes first; ("unknown",) when nothing fits."""
    found: set[str] = set()
    if f.throttled_share is not None and f.throttled_share >= cfg.throttled_share:
        found.add("cpu_quota_throttled")
    elif f.throttled_share is None and (f.throttled_seconds_per_second or 0.0) >= cfg.throttled_share:
        found.add("cpu_quota_throttled")
    if f.api_server_thread_cpu is not None and f.api_server_thread_cpu >= cfg.api_server_saturated:
        found.add("api_server_saturated")
    # Decode needs an engine that is generating; a plain torch process need not use graphs at all.
    decoding = f.engine and (f.generation_tokens_per_second is None or f.generation_tokens_per_second > 0)
    if f.graph_share is not None and decoding and f.graph_share < cfg.graph_share_low:
        found.add("cuda_graph_fallback")
    if (
        f.max_batch
        and f.waiting_mean is not None
        and f.running_mean is not None
        and f.waiting_mean <= cfg.waiting_empty
        and f.running_mean < cfg.admission_fill * f.max_batch
    ):
        found.add("admission_stalled")
    share = f.step_gpu_share
    if share is not None and f.step_method == "agent" and share < cfg.step_gpu_share_low:
        found.add("step_overhead")
    if not found:
        return ("unknown",)
    return tuple(r for r in HOST_REASONS if r in found)


def _by_busy(busy: float, cfg: VerdictConfig, prev: Verdict | None) -> str:
    """Return gpu or host from the busy share, keeping the previous one inside the band."""
    if busy >= cfg.busy_high:
        return "gpu"
    if busy < cfg.busy_low:
        return "host"
    if prev is not None and prev.verdict in ("gpu", "host"):
        return prev.verdict
    return "gpu" if busy >= (cfg.busy_low + cfg.busy_high) / 2 else "host"


def decide(f: Facts, cfg: VerdictConfig, prev: Verdict | None = None) -> tuple[str, tuple[str, ...]]:
    """Return the window's verdict and reasons.

    With an engine: idle without running or waiting requests; else by the busy share (unknown,
    no_busy_source, without one). Without an engine but with an agent on the GPU (a plain torch
    process): the agent's activity says whether anything runs (idle below `idle_busy`), the busy
    share decides gpu or host, and a host verdict has reason unknown (no queue to read). With
    neither: a GPU at or above busy_high is GPU-bound whatever runs on it, one below `idle_busy`
    is idle, and anything between is unknown, no_engine_source.
    """
    if f.engine:
        if (f.pending or 0.0) <= 0:
            return "idle", ()
        if f.busy is None:
            return "unknown", ("no_busy_source",)
        v = _by_busy(f.busy, cfg, prev)
        return v, host_reasons(f, cfg) if v == "host" else ()
    if f.busy is None:
        return "unknown", ("no_busy_source", "no_engine_source")
    if f.busy < cfg.idle_busy:
        return "idle", ()
    if f.agent:
        v = _by_busy(f.busy, cfg, prev)
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
    if prev is None or (raw.verdict == prev.verdict and lean == prev.verdict):
        return dataclasses.replace(raw, raw=raw.verdict, streak=0)
    streak = prev.streak + 1
    if raw.verdict != prev.verdict and streak >= cfg.hold_ticks:
        return dataclasses.replace(raw, raw=raw.verdict, streak=0)
    reasons = host_now if prev.verdict == "host" else prev.reasons
    return dataclasses.replace(raw, verdict=prev.verdict, reasons=reasons, raw=raw.verdict, streak=streak)


def classify(
    win: Sequence[Snapshot],
    gpu: int,
    cfg: VerdictConfig,
    prev: Verdict | None = None,
    roofline: RooflineConfig | None = None,
) -> Verdict:
    """Return the verdict to report for one GPU: the window's verdict, held against the previous one."""
    f = gather(win, gpu, cfg, roofline)
    verdict, reasons = decide(f, cfg, prev)
    lean = decide(f, cfg, None)[0]  # inside the band: the side of its midpoint
    raw = Verdict(gpu, verdict, reasons, f.busy, f.busy_source, f.evidence())
    return hold(raw, prev, cfg, reasons if verdict == "host" else host_reasons(f, cfg), lean)


def gpus_of(snap: Snapshot) -> list[int]:
    """Return the GPUs a Snapshot knows about (NVML, busy sources, agents, engines)."""
    found = {g.index for g in snap.gpus} | set(snap.busy)
    if snap.agent is not None:
        found |= {a.gpu for a in snap.agent.activity}
    for e in snap.engines:
        found |= set(e.gpus)
    return sorted(found)


def classify_all(history: Sequence[Snapshot], cfg: Config) -> tuple[Verdict, ...]:
    """Return the verdict of every GPU for the newest Snapshot of a history (oldest first)."""
    if not history:
        return ()
    v = cfg.verdict
    win = window(history, max(v.window_seconds, v.busy_window_seconds))
    prev_snap = history[-2] if len(history) > 1 else None
    prev = {p.gpu: p for p in prev_snap.verdicts} if prev_snap is not None else {}
    return tuple(classify(win, gpu, v, prev.get(gpu), cfg.roofline) for gpu in gpus_of(history[-1]))


def classify_tick(history: Sequence[Snapshot], snap: Snapshot, cfg: Config) -> Snapshot:
    """Return the Snapshot with its verdicts set (the pipeline's hook; history excludes snap)."""
    return dataclasses.replace(snap, verdicts=classify_all((*history, snap), cfg))


def replay(snapshots: Sequence[Snapshot], cfg: Config) -> list[Snapshot]:
    """Return the snapshots with verdicts recomputed tick by tick (for recordings and tests)."""
    out: list[Snapshot] = []
    keep = max(
        2, int(max(cfg.verdict.window_seconds, cfg.verdict.busy_window_seconds) / cfg.tick_seconds) + 4
    )
    for snap in snapshots:
        out.append(classify_tick(out[-keep:], dataclasses.replace(snap, verdicts=()), cfg))
    return out


def accumulate(snap: Snapshot, cfg: Config, prev: Snapshot | None = None) -> Increments:
    """Return this tick's time per verdict and host-bound seconds.

    boundwatch_bound_seconds_total{gpu,verdict} adds dt to the reported verdict.
    boundwatch_host_bound_seconds_total{gpu} adds the GPU's idle time while an engine driving it
    had running requests: with an agent, the exact idle time of the windows the agent closed
    (observed minus busy); else (1 - busy share) x dt. Without an engine nothing is added.
    """
    inc = Increments()
    if snap.dt <= 0:
        return inc
    for v in snap.verdicts:
        for name in VERDICTS:  # every series from the first tick, so rate() sees each start from 0
            inc.count(
                "boundwatch_bound_seconds_total", (str(v.gpu), name), snap.dt if name == v.verdict else 0.0
            )
    for gpu in gpus_of(snap):
        running = _sum([e.running for e in _engines(snap, gpu)])
        if running is None:
            continue
        idle = 0.0
        if running > 0:
            acts = [a for a in (snap.agent.activity if snap.agent else ()) if a.gpu == gpu]
            if acts and snap.busy.get(gpu, (0.0, ""))[1] == "cupti":
                idle = sum(max(0, a.observed_ns - a.busy_ns) for a in acts) / 1e9
            elif gpu in snap.busy:
                idle = max(0.0, 1.0 - snap.busy[gpu][0]) * snap.dt
        inc.count("boundwatch_host_bound_seconds_total", (str(gpu),), idle)
    return inc
