"""Render the engines' latest state: gauges, and the engines' own token counters passed through."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import Metric

from exporter.analysis.verdict import placed
from exporter.catalogue import counter, gauge
from exporter.snapshot import Snapshot
from exporter.snapshot.engine import COUNTS_SOURCES


def render(snap: Snapshot) -> Iterator[Metric]:
    """Yield the engine gauges and pass-through counters of the latest snapshot."""
    info = gauge("boundwatch_engine_info")
    up = gauge("boundwatch_engine_up")
    running = gauge("boundwatch_engine_requests_running")
    waiting = gauge("boundwatch_engine_requests_waiting")
    kv = gauge("boundwatch_engine_kv_cache_usage_ratio")
    servers = gauge("boundwatch_engine_api_servers")
    spec = gauge("boundwatch_engine_spec_decode_acceptance_ratio")
    thread_cpu = gauge("boundwatch_api_server_cpu_ratio")
    process_cpu = gauge("boundwatch_api_server_process_cpu_ratio")
    scrape = gauge("boundwatch_engine_scrape_duration_seconds")
    counts_source = gauge("boundwatch_engine_counts_source")
    page_age = gauge("boundwatch_engine_page_age_seconds")
    prompt = counter("boundwatch_engine_prompt_tokens_total")
    generation = counter("boundwatch_engine_generation_tokens_total")
    preemptions = counter("boundwatch_engine_preemptions_total")
    gpu_info = gauge("boundwatch_engine_gpu_info")
    gpu_count = gauge("boundwatch_engine_gpus")
    for e in snap.engines:
        labels = [e.name]
        info.add_metric([e.name, e.kind, e.model], 1.0)
        on = placed(e, snap)
        for gpu in on:
            gpu_info.add_metric([e.name, str(gpu), e.gpus_from or ("reading" if e.gpus else "lone_gpu")], 1.0)
        gpu_count.add_metric(labels, float(len(on)))
        up.add_metric(labels, 0.0 if e.error else 1.0)
        if e.scrape_seconds is not None:
            scrape.add_metric(labels, e.scrape_seconds)
        if e.api_server_count is not None:
            servers.add_metric(labels, e.api_server_count)
        for server, proc in e.servers():
            process_cpu.add_metric([e.name, server], proc.cpu)
            if proc.busiest_thread is not None:
                thread_cpu.add_metric([e.name, server], proc.busiest_thread.cpu)
        if e.error:
            continue  # stale figures are dropped, never served as fresh
        for source in COUNTS_SOURCES:  # one-hot, so a change of source never ends a series
            counts_source.add_metric([e.name, source], 1.0 if e.counts_source == source else 0.0)
        page_age.add_metric(labels, e.page_age_seconds)
        for fam, value in (
            (running, e.running),
            (waiting, e.waiting),
            (kv, e.kv_cache_usage),
            (prompt, e.prompt_tokens_total),
            (generation, e.generation_tokens_total),
            (preemptions, e.preemptions_total),
        ):
            if value is not None:
                fam.add_metric(labels, value)
        if e.spec_acceptance is not None:
            spec.add_metric(labels, e.spec_acceptance)
    yield from (info, up, running, waiting, kv, servers, spec, thread_cpu, process_cpu, scrape)
    yield from (counts_source, page_age)
    yield from (prompt, generation, preemptions, gpu_info, gpu_count)
