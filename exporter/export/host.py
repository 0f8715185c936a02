"""Render the host reading and boundwatch's own cgroup."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.metrics_core import Metric

from exporter import catalogue as c
from exporter.snapshot import Snapshot
from exporter.snapshot.host import CgroupCpu


def render_cgroups(groups: Iterable[tuple[str, CgroupCpu]]) -> Iterator[Metric]:
    """Yield quota and throttling families for labelled cgroups."""
    quota = c.gauge("boundwatch_cgroup_cpu_quota_cores")
    usage = c.counter("boundwatch_cgroup_cpu_usage_seconds_total")
    throttled = c.counter("boundwatch_cgroup_cpu_throttled_seconds_total")
    throttled_periods = c.counter("boundwatch_cgroup_cpu_throttled_periods_total")
    periods = c.counter("boundwatch_cgroup_cpu_periods_total")
    seen: set[str] = set()
    for label, cg in groups:
        if label in seen:
            continue
        seen.add(label)
        if cg.quota_cores is not None:
            quota.add_metric([label], cg.quota_cores)
        for fam, value in (
            (usage, cg.usage_seconds),
            (throttled, cg.throttled_seconds),
            (throttled_periods, cg.throttled_periods),
            (periods, cg.periods),
        ):
            if value is not None:
                fam.add_metric([label], float(value))
    yield from (quota, usage, throttled, throttled_periods, periods)


def cgroups_of(snap: Snapshot) -> list[tuple[str, CgroupCpu]]:
    """Return every cgroup the Snapshot knows, labelled by path (own cgroup, engines' cgroups)."""
    groups: list[tuple[str, CgroupCpu]] = []
    if snap.host is not None and snap.host.own_cgroup is not None:
        groups.append((snap.host.own_cgroup.path, snap.host.own_cgroup))
    for engine in snap.engines:
        groups.extend((cg.path, cg) for cg in engine.cgroups)
    return groups


def render(snap: Snapshot) -> Iterator[Metric]:
    """Yield host CPU and cgroup families.

    boundwatch_cgroup_cpu_quota_cores{cgroup="/kubepods.slice/pod1/ctr"} 0.5
    """
    if snap.host is not None:
        cpus = c.gauge("boundwatch_host_cpus")
        cpus.add_metric([], snap.host.cpus)
        yield cpus
        if snap.host.cpu_busy is not None:
            busy = c.gauge("boundwatch_host_cpu_ratio")
            busy.add_metric([], snap.host.cpu_busy)
            yield busy
    if snap.host is not None and snap.host.own_cgroup is not None:
        own = c.gauge("boundwatch_self_cgroup_info")
        own.add_metric([snap.host.own_cgroup.path], 1.0)
        yield own
    groups = cgroups_of(snap)
    if groups:
        yield from render_cgroups(groups)
