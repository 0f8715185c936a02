"""Counters and histograms from the agents' CUPTI windows, and the CUPTI busy ratio per GPU (pure)."""

from __future__ import annotations

from exporter.config import Config
from exporter.snapshot import Snapshot
from exporter.snapshot.agent import GpuActivity
from exporter.snapshot.totals import (
    EMPTY,
    AgentTotals,
    BusyTotals,
    EngineMethod,
    EngineTotals,
    GpuKeys,
    GpuKind,
    GpuSource,
    HistogramTally,
    Tally,
    Totals,
)
from exporter.wire import IDLE_GAP_BUCKETS_SECONDS, STEP_BUCKETS_SECONDS

KINDS = (("kernel", "kernels"), ("memcpy", "memcpys"), ("memset", "memsets"), ("graph", "graphs"))
CUPTI_KEY = GpuKeys(GpuSource, ("cupti",))  # each GPU's keys, made once (snapshot.totals.GpuKeys)
KIND_KEYS = GpuKeys(GpuKind, tuple(kind for kind, _ in KINDS))
NS = 1e-9
# A window that lost more than this share of its records (CUPTI's buffers full, the agent's queue
# over its bound) undercounts busy time: measured on the H200, a late-started agent on a ~760-node
# graph at 640 steps/s kept 22% of its kernel records and read 10% busy for 97%. Such windows add
# no CUPTI busy or observed time and give no CUPTI busy ratio; GPM or NVML stand in.
LOSSY_SHARE = 0.01


def lossy(a: GpuActivity) -> bool:
    """Say whether a GPU's windows lost too many records for their busy time to count."""
    records = a.kernels + a.memcpys + a.memsets + a.graphs
    return a.dropped > LOSSY_SHARE * (records + a.dropped)


def accumulate(snap: Snapshot, cfg: Config, prev: Snapshot | None = None) -> Totals:
    """Return this tick's increments from snap.agent: busy, observed, graph, gaps, records, steps."""
    reading = snap.agent
    if reading is None:
        return EMPTY
    busy_s, observed_s, graph_s = Tally[GpuSource](), Tally[GpuSource](), Tally[int]()
    records, dropped, gaps = Tally[GpuKind](), Tally[int](), HistogramTally[int]()
    for a in reading.activity:
        if a.observed_ns <= 0:
            continue
        gpu = a.gpu
        if not lossy(a):
            (cupti,) = CUPTI_KEY(gpu)
            busy_s.count(cupti, a.busy_ns * NS)
            observed_s.count(cupti, a.observed_ns * NS)
            graph_s.count(gpu, a.graph_busy_ns * NS)
            if a.idle_gap_counts:
                gaps.observe(gpu, IDLE_GAP_BUCKETS_SECONDS, a.idle_gap_counts, a.idle_gap_sum_ns * NS)
        for kind, n in zip(KIND_KEYS(gpu), (a.kernels, a.memcpys, a.memsets, a.graphs), strict=True):
            records[kind] = records.get(kind, 0.0) + (n if n > 0.0 else 0.0)  # Tally.count, inline
        dropped.count(gpu, a.dropped)
    refused = Tally[str]()
    for reason, n in reading.refused:
        refused.count(reason, n)
    steps, step_gpu, step_hist = Tally[EngineMethod](), Tally[str](), HistogramTally[str]()
    for s in reading.steps:
        if s.steps <= 0:
            continue
        steps.count(EngineMethod(s.engine, "agent"), s.steps)
        if s.gpu_measured:  # else CUPTI ran in other processes: no GPU time to add here
            step_gpu.count(s.engine, s.gpu_busy_ns * NS)
        if s.step_hist:
            step_hist.observe(s.engine, STEP_BUCKETS_SECONDS, s.step_hist, s.wall_ns * NS)
    return Totals(
        busy=BusyTotals(busy_s, observed_s, graph_s, records, dropped, gaps),
        agent=AgentTotals(float(max(0, reading.messages)), float(max(0, reading.bad_messages)), refused),
        engine=EngineTotals(steps=steps, step_gpu_seconds=step_gpu, step_seconds=step_hist),
    )


def cupti_busy_ratio(snap: Snapshot) -> dict[int, float]:
    """Return the busy share of each GPU over its newest CUPTI window (key: GpuActivity.gpu)."""
    out: dict[int, float] = {}
    if snap.agent is None:
        return out
    for a in snap.agent.activity:
        if lossy(a):
            continue
        if a.last_window_ns > 0:
            out[a.gpu] = min(1.0, a.last_window_busy_ns / a.last_window_ns)
        elif a.observed_ns > 0:
            out[a.gpu] = min(1.0, a.busy_ns / a.observed_ns)
    return out
