"""Render the agents: how many report per GPU and state, and what their CUPTI windows and messages add up to."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from prometheus_client.core import Metric

from exporter import catalogue as c
from exporter.export.families import Family, counter, counters, histograms
from exporter.snapshot import Snapshot
from exporter.snapshot.agent import AgentState

STATES = ("running", "quiet", "preempted", "unavailable", "stale")


def _placed(snap: Snapshot, engine_cores: bool = False) -> list[tuple[str, AgentState]]:
    """Return each agent with the GPU label it reports under ('' while it names no GPU yet).

    The label is the agent's `gpu` as analysis.pipeline.resolve_agent_gpus named it: a CUPTI agent's
    windows' device, a light agent's the device its graph counts name (it sends no windows), so that
    each GPU worker's agent counts for its own GPU (an agent gone from one of eight GPUs is missed there).
    A steps-only agent in vLLM's EngineCore drives no GPU (its process has no CUDA device): left out,
    unless `engine_cores` (what it dropped or refused is summed under '' with the other agents that
    name no GPU).
    """
    if snap.agent is None:
        return []
    out = []
    for a in snap.agent.agents:
        if a.gpu >= 0:
            gpu = str(a.gpu)
        elif a.role == "vllm_engine" and not engine_cores:
            continue
        else:
            gpu = ""
        out.append((gpu, a))
    return out


def agents(snap: Snapshot) -> Metric:
    """Render boundwatch_agents{gpu,state}: every state of every GPU an agent reported on, zeros included."""
    family = c.gauge(c.AGENTS)
    counts: Counter[tuple[str, str]] = Counter()
    gpus: set[str] = set()
    for gpu, a in _placed(snap):
        gpus.add(gpu)
        if a.state in STATES:
            counts[(gpu, a.state)] += 1
    for gpu in sorted(gpus):
        for state in STATES:
            family.add_metric([gpu, state], counts[(gpu, state)])
    return family


def per_gpu_sum(spec: c.MetricSpec, value: Callable[[AgentState], int]) -> Callable[[Snapshot], Metric]:
    """Return a renderer of the gauge `spec`{gpu}: value(agent) summed over the agents reporting on each GPU.

    vLLM's EngineCore agents count too, under gpu '': theirs are the light agents' steps there, and so
    the stale ones.
    """

    def render(snap: Snapshot) -> Metric:
        family = c.gauge(spec)
        totals: Counter[str] = Counter()
        for gpu, a in _placed(snap, engine_cores=True):
            totals[gpu] += value(a)
        for gpu in sorted(totals):
            family.add_metric([gpu], totals[gpu])
        return family

    return render


FAMILIES: tuple[Family, ...] = (
    Family(c.AGENTS, agents),
    # an agent's out-of-bounds settings; the messages it dropped rather than block (the sidecar's queue full);
    # the steps a light agent counted before a long stop and dropped as too old to send
    Family(c.AGENT_SETTINGS_REJECTED, per_gpu_sum(c.AGENT_SETTINGS_REJECTED, lambda a: a.settings_rejected)),
    Family(c.AGENT_UNSENT_MESSAGES, per_gpu_sum(c.AGENT_UNSENT_MESSAGES, lambda a: a.dropped_messages)),
    Family(c.AGENT_STALE_STEPS, per_gpu_sum(c.AGENT_STALE_STEPS, lambda a: a.stale_steps)),
)
INTEGRATED: tuple[Family, ...] = (
    counters(c.GPU_GRAPH_BUSY_SECONDS_TOTAL, lambda t: t.busy.graph_busy_seconds),
    histograms(c.GPU_IDLE_GAP_SECONDS, lambda t: t.busy.idle_gaps),
    counters(c.GPU_ACTIVITY_RECORDS_TOTAL, lambda t: t.busy.activity_records),
    counters(c.AGENT_DROPPED_RECORDS_TOTAL, lambda t: t.busy.dropped_records),
    counter(c.AGENT_MESSAGES_TOTAL, lambda t: t.agent.messages),
    counter(c.AGENT_BAD_MESSAGES_TOTAL, lambda t: t.agent.bad_messages),
    counters(c.AGENT_REFUSED_TOTAL, lambda t: t.agent.refused),
)
