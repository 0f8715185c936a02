"""Render the agents: how many report per GPU and state, and what their CUPTI windows and messages add up to."""

from __future__ import annotations

from collections import Counter

from prometheus_client.core import Metric

from exporter import catalogue as c
from exporter.export.families import Family, counter, counters, histograms
from exporter.snapshot import Snapshot

STATES = ("running", "preempted", "unavailable", "stale")


def agents(snap: Snapshot) -> Metric:
    """Render boundwatch_agents{gpu,state}: every state of every GPU an agent reported on, zeros included."""
    family = c.gauge(c.AGENTS)
    if snap.agent is None:
        return family
    by_uuid = {g.uuid: g.index for g in snap.gpus}
    counts: Counter[tuple[str, str]] = Counter()
    gpus: set[str] = set()
    for a in snap.agent.agents:
        if a.role == "vllm_engine" and a.gpu < 0:
            continue  # a steps-only agent in vLLM's EngineCore drives no GPU
        gpu = str(by_uuid.get(a.uuid, a.gpu)) if a.gpu >= 0 or a.uuid in by_uuid else ""
        gpus.add(gpu)
        if a.state in STATES:
            counts[(gpu, a.state)] += 1
    for gpu in sorted(gpus):
        for state in STATES:
            family.add_metric([gpu, state], counts[(gpu, state)])
    return family


FAMILIES: tuple[Family, ...] = (Family(c.AGENTS, agents),)
INTEGRATED: tuple[Family, ...] = (
    counters(c.GPU_GRAPH_BUSY_SECONDS_TOTAL, lambda t: t.busy.graph_busy_seconds),
    histograms(c.GPU_IDLE_GAP_SECONDS, lambda t: t.busy.idle_gaps),
    counters(c.GPU_ACTIVITY_RECORDS_TOTAL, lambda t: t.busy.activity_records),
    counters(c.AGENT_DROPPED_RECORDS_TOTAL, lambda t: t.busy.dropped_records),
    counter(c.AGENT_MESSAGES_TOTAL, lambda t: t.agent.messages),
    counter(c.AGENT_BAD_MESSAGES_TOTAL, lambda t: t.agent.bad_messages),
    counters(c.AGENT_REFUSED_TOTAL, lambda t: t.agent.refused),
)
