"""Render the host reading, boundwatch's own cgroup, and the cgroups of the engines."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.metrics_core import Metric

from exporter import catalogue as c
from exporter.export.families import Family
from exporter.snapshot import Snapshot
from exporter.snapshot.host import CgroupCpu


def cpus(snap: Snapshot) -> Metric:
    """Render the host's logical CPUs."""
    fam = c.gauge(c.HOST_CPUS)
    if snap.host is not None:
        fam.add_metric([], snap.host.cpus)
    return fam


def cpu_ratio(snap: Snapshot) -> Metric:
    """Render the host's CPU busy share over the last tick."""
    fam = c.gauge(c.HOST_CPU_RATIO)
    if snap.host is not None and snap.host.cpu_busy is not None:
        fam.add_metric([], snap.host.cpu_busy)
    return fam


MAX_CGROUP_LABEL = 256  # characters of a cgroup's path in its label (Kubernetes' run to ~200)


def cgroup_label(path: str) -> str:
    """Return a cgroup's label: its path, or past MAX_CGROUP_LABEL its end (where a container's id is) after an ellipsis.

    A process that may make cgroups (delegated to a container, or systemd's user slices) names
    them, up to the kernel's path length: the label is bounded, as every label from outside is.
    """
    return path if len(path) <= MAX_CGROUP_LABEL else "\u2026" + path[-(MAX_CGROUP_LABEL - 1) :]


def own_cgroup(snap: Snapshot) -> Metric:
    """Render boundwatch_self_cgroup_info{cgroup="/kubepods.slice/pod1/ctr"} 1."""
    fam = c.gauge(c.SELF_CGROUP_INFO)
    if snap.host is not None and snap.host.own_cgroup is not None:
        fam.add_metric([cgroup_label(snap.host.own_cgroup.path)], 1.0)
    return fam


def cgroups_of(snap: Snapshot) -> list[tuple[str, CgroupCpu]]:
    """Return every cgroup the Snapshot knows once, by label: its own cgroup, then the engines' cgroups."""
    groups: dict[str, CgroupCpu] = {}
    if snap.host is not None and snap.host.own_cgroup is not None:
        groups[cgroup_label(snap.host.own_cgroup.path)] = snap.host.own_cgroup
    for engine in snap.engines:
        for cg in engine.cgroups:
            groups.setdefault(cgroup_label(cg.path), cg)
    return list(groups.items())


def _per_cgroup(spec: c.MetricSpec, value: Callable[[CgroupCpu], float | None]) -> Family:
    """Return a family of one sample per cgroup whose value is known."""

    def render(snap: Snapshot) -> Metric:
        fam = c.number(spec)
        for label, cg in cgroups_of(snap):
            v = value(cg)
            if v is not None:
                fam.add_metric([label], float(v))
        return fam

    return Family(spec, render)


FAMILIES: tuple[Family, ...] = (
    Family(c.HOST_CPUS, cpus),
    Family(c.HOST_CPU_RATIO, cpu_ratio),
    Family(c.SELF_CGROUP_INFO, own_cgroup),
    _per_cgroup(c.CGROUP_CPU_QUOTA_CORES, lambda cg: cg.quota_cores),
    _per_cgroup(c.CGROUP_CPU_USAGE_SECONDS_TOTAL, lambda cg: cg.usage_seconds),
    _per_cgroup(c.CGROUP_CPU_THROTTLED_SECONDS_TOTAL, lambda cg: cg.throttled_seconds),
    _per_cgroup(c.CGROUP_CPU_THROTTLED_PERIODS_TOTAL, lambda cg: cg.throttled_periods),
    _per_cgroup(c.CGROUP_CPU_PERIODS_TOTAL, lambda cg: cg.periods),
)
INTEGRATED: tuple[Family, ...] = ()
