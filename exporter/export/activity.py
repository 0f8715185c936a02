"""Render the agents' gauges: how many agents report per GPU and state (counters are in totals)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import Metric

from exporter.catalogue import gauge
from exporter.snapshot import Snapshot

STATES = ("running", "preempted", "unavailable", "stale")


def render(snap: Snapshot) -> Iterator[Metric]:
    """Yield boundwatch_agents{gpu,state}: every state of every GPU an agent reported on, zeros included."""
    if snap.agent is None:
        return
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
    family = gauge("boundwatch_agents")
    for gpu in sorted(gpus):
        for state in STATES:
            family.add_metric([gpu, state], counts[(gpu, state)])
    yield family
