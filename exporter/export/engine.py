"""Render the engines: their latest state, their own token counters passed through, and the engine totals."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.metrics_core import Metric

from exporter import catalogue as c
from exporter.analysis.verdict import placed
from exporter.export.families import Family, counters, histograms
from exporter.snapshot import Snapshot
from exporter.snapshot.engine import COUNTS_SOURCES, EngineReading


def info(snap: Snapshot) -> Metric:
    """Render boundwatch_engine_info{engine,kind,model} 1."""
    fam = c.gauge(c.ENGINE_INFO)
    for e in snap.engines:
        fam.add_metric([e.name, e.kind, e.model], 1.0)
    return fam


def up(snap: Snapshot) -> Metric:
    """Render whether each engine's last read succeeded."""
    fam = c.gauge(c.ENGINE_UP)
    for e in snap.engines:
        fam.add_metric([e.name], 0.0 if e.error else 1.0)
    return fam


def _per_engine(
    spec: c.MetricSpec, value: Callable[[EngineReading], float | None], fresh: bool = True
) -> Family:
    """Return a family of one sample per engine whose value is known (fresh: engines read without error only)."""

    def render(snap: Snapshot) -> Metric:
        fam = c.number(spec)
        for e in snap.engines:
            v = None if fresh and e.error else value(e)  # stale figures are dropped, never served as fresh
            if v is not None:
                fam.add_metric([e.name], v)
        return fam

    return Family(spec, render)


def thread_cpu(snap: Snapshot) -> Metric:
    """Render the CPU of each API server's busiest thread."""
    fam = c.gauge(c.API_SERVER_CPU_RATIO)
    for e in snap.engines:
        for server, proc in e.servers():
            if proc.busiest_thread is not None:
                fam.add_metric([e.name, server], proc.busiest_thread.cpu)
    return fam


def process_cpu(snap: Snapshot) -> Metric:
    """Render the CPU of each API server, all threads."""
    fam = c.gauge(c.API_SERVER_PROCESS_CPU_RATIO)
    for e in snap.engines:
        for server, proc in e.servers():
            fam.add_metric([e.name, server], proc.cpu)
    return fam


def counts_source(snap: Snapshot) -> Metric:
    """Render where each engine's running/waiting come from, one-hot (a change of source never ends a series)."""
    fam = c.gauge(c.ENGINE_COUNTS_SOURCE)
    for e in snap.engines:
        if not e.error:  # stale figures are dropped, never served as fresh
            for source in COUNTS_SOURCES:
                fam.add_metric([e.name, source], 1.0 if e.counts_source == source else 0.0)
    return fam


def gpu_info(snap: Snapshot) -> Metric:
    """Render each GPU an engine drives, and how that was found."""
    fam = c.gauge(c.ENGINE_GPU_INFO)
    for e in snap.engines:
        how = e.gpus_from or ("reading" if e.gpus else "lone_gpu")
        for gpu in placed(e, snap):
            fam.add_metric([e.name, str(gpu), how], 1.0)
    return fam


def gpu_count(snap: Snapshot) -> Metric:
    """Render how many GPUs each engine drives (0: placed on none)."""
    fam = c.gauge(c.ENGINE_GPUS)
    for e in snap.engines:
        fam.add_metric([e.name], float(len(placed(e, snap))))
    return fam


FAMILIES: tuple[Family, ...] = (
    Family(c.ENGINE_INFO, info),
    Family(c.ENGINE_UP, up),
    _per_engine(c.ENGINE_REQUESTS_RUNNING, lambda e: e.running),
    _per_engine(c.ENGINE_REQUESTS_WAITING, lambda e: e.waiting),
    _per_engine(c.ENGINE_KV_CACHE_USAGE_RATIO, lambda e: e.kv_cache_usage),
    _per_engine(c.ENGINE_API_SERVERS, lambda e: e.api_server_count, fresh=False),
    _per_engine(c.ENGINE_SPEC_DECODE_ACCEPTANCE_RATIO, lambda e: e.spec_acceptance),
    Family(c.API_SERVER_CPU_RATIO, thread_cpu),
    Family(c.API_SERVER_PROCESS_CPU_RATIO, process_cpu),
    _per_engine(c.ENGINE_SCRAPE_DURATION_SECONDS, lambda e: e.scrape_seconds, fresh=False),
    Family(c.ENGINE_COUNTS_SOURCE, counts_source),
    _per_engine(
        c.ENGINE_FLAGS_REFUSED, lambda e: e.graph_config.refused if e.graph_config else 0.0, fresh=False
    ),
    _per_engine(c.ENGINE_PAGE_AGE_SECONDS, lambda e: e.page_age_seconds),
    _per_engine(c.ENGINE_PROMPT_TOKENS_TOTAL, lambda e: e.prompt_tokens_total),
    _per_engine(c.ENGINE_GENERATION_TOKENS_TOTAL, lambda e: e.generation_tokens_total),
    _per_engine(c.ENGINE_PREEMPTIONS_TOTAL, lambda e: e.preemptions_total),
    Family(c.ENGINE_GPU_INFO, gpu_info),
    Family(c.ENGINE_GPUS, gpu_count),
)
INTEGRATED: tuple[Family, ...] = (
    counters(c.ENGINE_RUNNING_REQUEST_SECONDS_TOTAL, lambda t: t.engine.running_request_seconds),
    counters(c.ENGINE_WAITING_REQUEST_SECONDS_TOTAL, lambda t: t.engine.waiting_request_seconds),
    counters(c.ENGINE_STEPS_TOTAL, lambda t: t.engine.steps),
    counters(c.ENGINE_STEP_GPU_SECONDS_TOTAL, lambda t: t.engine.step_gpu_seconds),
    histograms(c.ENGINE_STEP_SECONDS, lambda t: t.engine.step_seconds),
    counters(c.API_SERVER_SATURATED_SECONDS_TOTAL, lambda t: t.engine.api_server_saturated_seconds),
    counters(c.ENGINE_PAGE_REFUSED_TOTAL, lambda t: t.engine.page_refused),
)
