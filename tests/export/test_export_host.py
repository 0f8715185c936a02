"""The host's families: a cgroup's label is its path, bounded, and one series per label."""

from __future__ import annotations

from exporter.export.host import FAMILIES, MAX_CGROUP_LABEL
from exporter.snapshot.engine import EngineReading
from exporter.snapshot.host import CgroupCpu, HostReading
from tests.fakes.snapshots import first_tick


def _samples(snap):
    out = {}
    for family in FAMILIES:
        for sample in family.render(snap).samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def test_a_cgroup_path_past_the_bound_is_labelled_by_its_end_and_two_such_stay_two_series():
    deep = "/user.slice/" + "d/" * 2000  # a delegated tree, nested as deep as the kernel lets it
    a, b = CgroupCpu(deep + "ctr-a", 0.5, 1.0), CgroupCpu(deep + "ctr-b", 0.25, 2.0)
    own = CgroupCpu("/system.slice/boundwatch.service", None, 3.0)
    snap = first_tick(
        host=HostReading(cpus=8, cpu_busy=0.1, own_cgroup=own),
        engines=(
            EngineReading("vllm:8000", "vllm", cgroups=(a, b)),
            EngineReading("vllm:8001", "vllm", cgroups=(a,)),
        ),
    )
    quota = dict((labels["cgroup"], v) for labels, v in _samples(snap)["boundwatch_cgroup_cpu_quota_cores"])
    assert sorted(quota.values()) == [0.25, 0.5]  # the engines' two cgroups, once each (the own has no quota)
    for label in quota:
        assert (
            len(label) == MAX_CGROUP_LABEL
            and label.startswith("\u2026")
            and label.endswith(("/ctr-a", "/ctr-b"))
        )
    usage = {labels["cgroup"]: v for labels, v in _samples(snap)["boundwatch_cgroup_cpu_usage_seconds_total"]}
    assert usage["/system.slice/boundwatch.service"] == 3.0 and len(usage) == 3
    (info,) = _samples(snap)["boundwatch_self_cgroup_info"]
    assert info == ({"cgroup": "/system.slice/boundwatch.service"}, 1.0)
