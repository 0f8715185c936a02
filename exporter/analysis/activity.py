"""Counters and histograms from the agents' CUPTI windows, and the CUPTI busy ratio per GPU (pure)."""

from __future__ import annotations

from exporter.analysis.increments import Increments
from exporter.analysis.intervals import IDLE_GAP_BUCKETS_SECONDS
from exporter.config import Config
from exporter.snapshot import Snapshot
from exporter.snapshot.agent import GpuActivity

# Same as exporter.catalogue.STEP_BUCKETS_SECONDS (analysis may not import the catalogue; a test checks).
STEP_BUCKETS_SECONDS: tuple[float, ...] = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0)
KINDS = (("kernel", "kernels"), ("memcpy", "memcpys"), ("memset", "memsets"), ("graph", "graphs"))
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


def accumulate(snap: Snapshot, cfg: Config, prev: Snapshot | None = None) -> Increments:
    """Return this tick's increments from snap.agent: busy, observed, graph, gaps, records, steps."""
    inc = Increments()
    reading = snap.agent
    if reading is None:
        return inc
    for a in reading.activity:
        gpu = str(a.gpu)
        if a.observed_ns > 0 and not lossy(a):
            inc.count("boundwatch_gpu_busy_seconds_total", (gpu, "cupti"), a.busy_ns * NS)
            inc.count("boundwatch_gpu_observed_seconds_total", (gpu, "cupti"), a.observed_ns * NS)
            inc.count("boundwatch_gpu_graph_busy_seconds_total", (gpu,), a.graph_busy_ns * NS)
            if a.idle_gap_counts:
                inc.observe(
                    "boundwatch_gpu_idle_gap_seconds",
                    (gpu,),
                    IDLE_GAP_BUCKETS_SECONDS,
                    a.idle_gap_counts,
                    a.idle_gap_sum_ns * NS,
                )
        if a.observed_ns > 0:
            for kind, attr in KINDS:
                inc.count("boundwatch_gpu_activity_records_total", (gpu, kind), getattr(a, attr))
            inc.count("boundwatch_agent_dropped_records_total", (gpu,), a.dropped)
    inc.count("boundwatch_agent_messages_total", (), reading.messages)
    inc.count("boundwatch_agent_bad_messages_total", (), reading.bad_messages)
    for reason, n in reading.refused:
        inc.count("boundwatch_agent_refused_total", (reason,), n)
    for s in reading.steps:
        if s.steps <= 0:
            continue
        inc.count("boundwatch_engine_steps_total", (s.engine, "agent"), s.steps)
        if s.gpu_measured:  # else CUPTI ran in other processes: no GPU time to add here
            inc.count("boundwatch_engine_step_gpu_seconds_total", (s.engine,), s.gpu_busy_ns * NS)
        if s.step_hist:
            inc.observe(
                "boundwatch_engine_step_seconds",
                (s.engine,),
                STEP_BUCKETS_SECONDS,
                s.step_hist,
                s.wall_ns * NS,
            )
    return inc


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
