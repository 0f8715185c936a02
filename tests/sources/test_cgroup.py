"""The cgroup reader on real v1 and v2 fixture trees and on this machine's own cgroup."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from exporter.sources.cgroup import cgroup_path_of, cgroup_version, read_cgroup_cpu
from tests.fakes.cgroups import remove_cgroups

FIX = Path(__file__).parents[1] / "fixtures" / "cgroup"


def test_v2_fractional_container_quota_is_read_in_cores_with_throttling():
    cg = read_cgroup_cpu(str(FIX / "v2"), "/kubepods.slice/pod1/ctr")
    assert cg is not None
    assert cg.version == 2
    assert cg.quota_cores == pytest.approx(0.5)  # "50000 100000": the seed's fractional default quota
    assert cg.usage_seconds == pytest.approx(31.25)
    assert cg.throttled_seconds == pytest.approx(41.5)
    assert cg.throttled_periods == 870
    assert cg.periods == 1200


def test_v2_pod_quota_binds_when_tighter_than_container_and_root_max_is_unlimited():
    pod = read_cgroup_cpu(str(FIX / "v2"), "/kubepods.slice/pod1")
    root = read_cgroup_cpu(str(FIX / "v2"), "/")
    assert pod is not None and pod.quota_cores == pytest.approx(2.0)
    assert root is not None and root.quota_cores is None


def test_v2_throttling_under_an_ancestors_quota_is_read_where_the_kernel_counts_it(tmp_path):
    """A leaf with no quota of its own under a slice's: the slice's cpu.stat counts the periods and throttling."""
    slice_ = tmp_path / "system.slice" / "vllm.slice"
    leaf = slice_ / "api.service"
    leaf.mkdir(parents=True)
    (tmp_path / "cgroup.controllers").write_text("cpu\n")
    (tmp_path / "cpu.max").write_text("max 100000\n")
    (slice_ / "cpu.max").write_text("30000 100000\n")
    (slice_ / "cpu.stat").write_text(
        "usage_usec 9000000\nnr_periods 50\nnr_throttled 20\nthrottled_usec 900000\n"
    )
    (leaf / "cpu.max").write_text("max 100000\n")
    leaf_stat = "usage_usec 4000000\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n"
    (leaf / "cpu.stat").write_text(leaf_stat)
    for now in (None, 10.0, 10.5):  # uncached, then cached: the binding cgroup is kept with the quota
        cg = read_cgroup_cpu(str(tmp_path), "/system.slice/vllm.slice/api.service", now=now)
        assert cg is not None and cg.quota_cores == pytest.approx(0.3)
        assert (cg.periods, cg.throttled_periods) == (50, 20)
        assert cg.throttled_seconds == pytest.approx(0.9)
        assert cg.usage_seconds == pytest.approx(4.0)  # usage stays the leaf's own
        assert cg.counted_at == "/system.slice/vllm.slice"
    # a tighter quota of the leaf's own binds: its counters, not the slice's
    (leaf / "cpu.max").write_text("10000 100000\n")
    (leaf / "cpu.stat").write_text(
        leaf_stat.replace("nr_periods 0", "nr_periods 7").replace("nr_throttled 0", "nr_throttled 3")
    )
    own = read_cgroup_cpu(str(tmp_path), "/system.slice/vllm.slice/api.service")
    assert own is not None and own.quota_cores == pytest.approx(0.1)
    assert (own.periods, own.throttled_periods, own.throttled_seconds) == (7, 3, 0.0)
    assert own.counted_at == ""


def test_v1_throttling_under_an_ancestors_quota_is_read_where_the_kernel_counts_it(tmp_path):
    cpu = tmp_path / "cpu"
    leaf = cpu / "machine" / "ctr" / "init"
    leaf.mkdir(parents=True)
    (cpu / "machine" / "ctr" / "cpu.cfs_quota_us").write_text("50000\n")
    (cpu / "machine" / "ctr" / "cpu.cfs_period_us").write_text("100000\n")
    (cpu / "machine" / "ctr" / "cpu.stat").write_text(
        "nr_periods 40\nnr_throttled 30\nthrottled_time 2500000000\n"
    )
    (leaf / "cpu.cfs_quota_us").write_text("-1\n")
    (leaf / "cpu.cfs_period_us").write_text("100000\n")
    (leaf / "cpu.stat").write_text("nr_periods 0\nnr_throttled 0\nthrottled_time 0\n")
    cg = read_cgroup_cpu(str(tmp_path), "/machine/ctr/init")
    assert cg is not None and cg.version == 1 and cg.quota_cores == pytest.approx(0.5)
    assert (cg.periods, cg.throttled_periods) == (40, 30)
    assert cg.throttled_seconds == pytest.approx(2.5) and cg.counted_at == "/machine/ctr"


def test_a_v2_quota_is_read_again_only_after_its_interval_and_the_counters_every_time(tmp_path):
    import shutil

    from exporter.sources.cgroup import QUOTA_EVERY_SECONDS

    root = tmp_path / "v2"
    shutil.copytree(FIX / "v2", root)
    leaf = root / "kubepods.slice" / "pod1" / "ctr"
    first = read_cgroup_cpu(str(root), "/kubepods.slice/pod1/ctr", now=50.0)
    (leaf / "cpu.max").write_text("25000 100000\n")
    stat = (leaf / "cpu.stat").read_text().replace("nr_throttled 870", "nr_throttled 871")
    (leaf / "cpu.stat").write_text(stat)
    soon = read_cgroup_cpu(str(root), "/kubepods.slice/pod1/ctr", now=50.0 + QUOTA_EVERY_SECONDS / 2)
    later = read_cgroup_cpu(str(root), "/kubepods.slice/pod1/ctr", now=50.0 + QUOTA_EVERY_SECONDS)
    uncached = read_cgroup_cpu(str(root), "/kubepods.slice/pod1/ctr")
    assert first is not None and soon is not None and later is not None and uncached is not None
    assert (first.quota_cores, soon.quota_cores, later.quota_cores) == (0.5, 0.5, 0.25)
    assert (first.throttled_periods, soon.throttled_periods) == (870, 871)
    assert uncached.quota_cores == 0.25


def test_a_quota_set_on_an_unlimited_cgroup_shows_once_its_periods_move_not_after_the_interval(tmp_path):
    """A cached "no quota" is read again when nr_periods moves: the kernel counts periods only under a quota."""
    import shutil

    root = tmp_path / "v2"
    shutil.copytree(FIX / "v2", root)
    first = read_cgroup_cpu(str(root), "/", now=100.0)
    (root / "cpu.max").write_text("20000 100000\n")
    same = read_cgroup_cpu(str(root), "/", now=100.5)  # periods still 0: the cache holds
    stat = (root / "cpu.stat").read_text()
    (root / "cpu.stat").write_text(
        stat.replace("nr_periods 0", "nr_periods 5").replace("nr_throttled 0", "nr_throttled 5")
    )
    moved = read_cgroup_cpu(str(root), "/", now=101.0)
    assert first is not None and same is not None and moved is not None
    assert (first.quota_cores, same.quota_cores) == (None, None)
    assert moved.quota_cores == pytest.approx(0.2) and moved.throttled_periods == 5
    # a quota known is not read again each tick while its periods move (the interval holds)
    (root / "cpu.max").write_text("40000 100000\n")
    (root / "cpu.stat").write_text(stat.replace("nr_periods 0", "nr_periods 9"))
    assert read_cgroup_cpu(str(root), "/", now=101.5).quota_cores == pytest.approx(0.2)  # type: ignore[union-attr]


def _v2_tree(tmp_path: Path, leaf_max: str) -> tuple[Path, Path]:
    """Return a v2 tree's root and its leaf `/system.slice/vllm.service` (the slice unlimited)."""
    root = tmp_path / "v2"
    leaf = root / "system.slice" / "vllm.service"
    leaf.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu\n")
    (root / "system.slice" / "cpu.max").write_text("max 100000\n")
    (leaf / "cpu.max").write_text(leaf_max)
    stat = "usage_usec 4000000\nnr_periods 100\nnr_throttled 0\nthrottled_usec 0\n"
    (root / "system.slice" / "cpu.stat").write_text(stat.replace("nr_periods 100", "nr_periods 0"))
    (leaf / "cpu.stat").write_text(stat)
    (leaf / "cpu.stat.local").write_text("throttled_usec 0\n")
    return root, leaf


def test_an_ancestors_quota_set_shows_once_the_leafs_local_throttling_moves(tmp_path):
    """Linux 6.6+: cpu.stat.local counts the leaf's throttling by any quota on its path. A cached "no
    quota" is read again when it moves, where the leaf's own nr_periods never would."""
    root, leaf = _v2_tree(tmp_path, "max 100000\n")
    stat = (root / "system.slice" / "cpu.stat").read_text()  # the slice's: no periods yet
    path = "/system.slice/vllm.service"
    first = read_cgroup_cpu(str(root), path, now=200.0)
    (root / "system.slice" / "cpu.max").write_text("60000 100000\n")  # the slice's CPUQuota=60%
    (root / "system.slice" / "cpu.stat").write_text(stat.replace("nr_periods 0", "nr_periods 5"))
    same = read_cgroup_cpu(str(root), path, now=200.5)  # nothing throttled yet: the cache holds
    (leaf / "cpu.stat.local").write_text("throttled_usec 45000\n")
    (root / "system.slice" / "cpu.stat").write_text(
        stat.replace("nr_periods 0", "nr_periods 10").replace("nr_throttled 0", "nr_throttled 4")
    )
    moved = read_cgroup_cpu(str(root), path, now=201.0)
    assert first is not None and same is not None and moved is not None
    assert (first.quota_cores, same.quota_cores) == (None, None)
    assert moved.quota_cores == pytest.approx(0.6)
    assert (moved.counted_at, moved.throttled_periods) == ("/system.slice", 4)


def test_a_tighter_ancestor_quota_over_a_leafs_own_shows_once_the_leaf_is_throttled_beyond_it(tmp_path):
    """The leaf's own 2-core quota is cached; the slice then gets 0.6 cores. The leaf's cpu.stat.local
    gains throttled time its own cpu.stat does not count: another quota binds, read again at once."""
    root, leaf = _v2_tree(tmp_path, "200000 100000\n")
    path = "/system.slice/vllm.service"
    assert read_cgroup_cpu(str(root), path, now=400.0).quota_cores == pytest.approx(2.0)  # type: ignore[union-attr]
    (root / "system.slice" / "cpu.max").write_text("60000 100000\n")
    (leaf / "cpu.stat.local").write_text("throttled_usec 20000\n")  # within the slack: no more than noise
    assert read_cgroup_cpu(str(root), path, now=400.5).quota_cores == pytest.approx(2.0)  # type: ignore[union-attr]
    (leaf / "cpu.stat.local").write_text("throttled_usec 420000\n")  # 0.4 s throttled beyond the leaf's own
    seen = read_cgroup_cpu(str(root), path, now=401.0)  # the reading that sees it: the cache goes
    moved = read_cgroup_cpu(str(root), path, now=401.5)
    assert seen is not None and moved is not None
    assert seen.quota_cores == pytest.approx(2.0)
    assert (moved.quota_cores, moved.counted_at) == (pytest.approx(0.6), "/system.slice")


def test_a_leafs_own_quota_throttling_it_reads_no_quota_again(tmp_path, monkeypatch):
    """Throttled by its own quota, the leaf's cpu.stat.local and cpu.stat move together: the cached
    quota holds (no read of the path's quota files each tick)."""
    from exporter.sources import cgroup

    root, leaf = _v2_tree(tmp_path, "50000 100000\n")
    path = "/system.slice/vllm.service"
    reads = []
    real = cgroup._v2_quota
    monkeypatch.setattr(cgroup, "_v2_quota", lambda *a: reads.append(a) or real(*a))
    stat = (leaf / "cpu.stat").read_text()
    for k in range(8):
        throttled = 400_000 * k
        (leaf / "cpu.stat.local").write_text(f"throttled_usec {throttled}\n")
        (leaf / "cpu.stat").write_text(
            stat.replace("nr_periods 100", f"nr_periods {100 + 5 * k}").replace(
                "throttled_usec 0", f"throttled_usec {throttled}"
            )
        )
        got = read_cgroup_cpu(str(root), path, now=500.0 + 0.5 * k)
        assert got is not None and got.quota_cores == pytest.approx(0.5)
    assert len(reads) == 1


def test_throttling_by_a_quota_this_namespace_cannot_see_reads_the_path_once_per_interval(
    tmp_path, monkeypatch
):
    """A quota above the cgroup namespace's root throttles the leaf: its cpu.stat.local moves every tick
    and no quota on the path it can read is found. One read of the path's quotas on the first move,
    then none until the interval, not one each tick."""
    from exporter.sources import cgroup

    root, leaf = _v2_tree(tmp_path, "max 100000\n")
    path = "/system.slice/vllm.service"
    reads = []
    real = cgroup._v2_quota
    monkeypatch.setattr(cgroup, "_v2_quota", lambda *a: reads.append(a) or real(*a))
    for k in range(12):  # 6 s of ticks
        (leaf / "cpu.stat.local").write_text(f"throttled_usec {300_000 * k}\n")
        got = read_cgroup_cpu(str(root), path, now=600.0 + 0.5 * k)
        assert got is not None and got.quota_cores is None
    assert len(reads) == 2  # the first read, and the one the first move asked for


def test_without_cpu_stat_local_an_ancestors_quota_waits_for_the_interval(tmp_path):
    """A kernel before 6.6 keeps no cpu.stat.local: the file is looked for once, and the quota is read
    at its interval as before."""
    from exporter.sources.cgroup import QUOTA_EVERY_SECONDS

    root = tmp_path / "v2"
    leaf = root / "app"
    leaf.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu\n")
    (leaf / "cpu.max").write_text("max 100000\n")
    (leaf / "cpu.stat").write_text("usage_usec 1\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n")
    assert read_cgroup_cpu(str(root), "/app", now=300.0).quota_cores is None  # type: ignore[union-attr]
    (leaf / "cpu.max").write_text("50000 100000\n")  # its periods do not move in a fixture: only the interval
    soon = read_cgroup_cpu(str(root), "/app", now=300.0 + QUOTA_EVERY_SECONDS / 2)
    later = read_cgroup_cpu(str(root), "/app", now=300.0 + QUOTA_EVERY_SECONDS)
    assert soon is not None and later is not None
    assert (soon.quota_cores, later.quota_cores) == (None, pytest.approx(0.5))


def test_a_v1_quota_is_read_again_only_after_its_interval(tmp_path):
    import shutil

    from exporter.sources.cgroup import QUOTA_EVERY_SECONDS

    root = tmp_path / "v1"
    shutil.copytree(FIX / "v1", root)
    quota = next(p for p in root.rglob("docker/abc/cpu.cfs_quota_us"))
    first = read_cgroup_cpu(str(root), "/docker/abc", now=7.0)
    quota.write_text("50000\n")
    soon = read_cgroup_cpu(str(root), "/docker/abc", now=7.0 + QUOTA_EVERY_SECONDS / 2)
    later = read_cgroup_cpu(str(root), "/docker/abc", now=7.0 + QUOTA_EVERY_SECONDS)
    assert first is not None and soon is not None and later is not None
    assert (first.quota_cores, soon.quota_cores) == (1.5, 1.5)
    assert later.quota_cores is not None and later.quota_cores < 1.5
    assert later.usage_seconds == first.usage_seconds == 7.25


def test_v1_split_cpu_and_cpuacct_hierarchies():
    cg = read_cgroup_cpu(str(FIX / "v1"), "/docker/abc")
    assert cg is not None
    assert cg.version == 1
    assert cg.quota_cores == pytest.approx(1.5)
    assert cg.throttled_seconds == pytest.approx(3.5)
    assert cg.throttled_periods == 120
    assert cg.periods == 500
    assert cg.usage_seconds == pytest.approx(7.25)


def test_missing_cgroup_reads_as_none():
    assert read_cgroup_cpu(str(FIX / "v2"), "/no/such/group") is None
    assert read_cgroup_cpu(str(FIX / "v1"), "/docker/gone") is None


def test_version_detection():
    assert cgroup_version(str(FIX / "v2")) == 2
    assert cgroup_version(str(FIX / "v1")) == 1


def test_cgroup_path_of_process_for_both_versions():
    proc = str(FIX / "proc")
    assert cgroup_path_of(proc, 4242) == "/kubepods.slice/pod1/ctr"
    assert cgroup_path_of(proc, 777) == "/docker/abc"
    assert cgroup_path_of(proc, 1) == "/"  # no such process: the root


def test_own_cgroup_on_this_machine_reads():
    path = cgroup_path_of("/proc", "self")
    cg = read_cgroup_cpu("/sys/fs/cgroup", path)
    if cg is None:
        pytest.skip("no readable CPU cgroup on this machine")
    assert cg.version in (1, 2)
    assert cg.quota_cores is None or cg.quota_cores > 0


def _kernel_cgroup(tmp_name: str) -> tuple[str, Path, list[Path], int]:
    """Make real cgroups `tmp_name`/leaf on this machine's CPU hierarchies; skip where none is writable.

    Returns the cgroup root, the quota's cgroup, the leaves to put a process in (v1 with cpu and
    cpuacct mounted apart: one in each) and the version.
    """
    root = Path("/sys/fs/cgroup")
    version = cgroup_version(str(root))
    if version == 2:
        bases = [root / tmp_name]
    else:
        mounts = [root / n for n in ("cpu,cpuacct", "cpu", "cpuacct") if (root / n).is_dir()]
        bases = [m / tmp_name for m in mounts if not m.is_symlink()][:2]
    made: list[Path] = []
    try:
        for b in bases:
            for d in (b, b / "leaf"):
                d.mkdir()
                made.append(d)
    except OSError as e:
        remove_cgroups(made)
        pytest.skip(f"cannot make a cgroup here: {e}")
    if not bases:
        pytest.skip("no CPU cgroup hierarchy here")
    return str(root), bases[0], [b / "leaf" for b in bases], version


def _set_quota(base: Path, version: int, cores: float) -> None:
    if version == 2:
        (base.parent / "cgroup.subtree_control").write_text("+cpu")  # the cpu controller in base's files
        (base / "cgroup.subtree_control").write_text("+cpu")
        (base / "cpu.max").write_text(f"{int(cores * 100_000)} 100000")
    else:
        (base / "cpu.cfs_period_us").write_text("100000")
        (base / "cpu.cfs_quota_us").write_text(str(int(cores * 100_000)))


def test_a_busy_process_under_a_real_kernel_quota_reads_the_quota_its_throttling_and_its_use():
    """The kernel's own files, not a fixture: a 0.1-core quota on a parent, a spinning child in its leaf.

    The quota binds at the parent, so the throttling must be read there (the kernel counts it there,
    the leaf's own counters stay 0) and the use from the leaf; both must move while the child spins.
    """
    name = f"bw-cgtest-{os.getpid()}"
    root, base, leaves, version = _kernel_cgroup(name)
    child = None
    try:
        try:
            _set_quota(base, version, 0.1)
        except OSError as e:
            pytest.skip(f"cannot set a CPU quota here: {e}")
        rel = f"/{name}/leaf"
        before = read_cgroup_cpu(root, rel, version)
        assert before is not None and before.quota_cores == pytest.approx(0.1)
        assert before.counted_at == f"/{name}"  # the ancestor whose quota binds
        child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for leaf in leaves:
            (leaf / "cgroup.procs").write_text(str(child.pid))
        time.sleep(1.0)
        after = read_cgroup_cpu(root, rel, version)
    finally:
        if child is not None:
            child.kill()
            child.wait()
        remove_cgroups([d for leaf in leaves for d in (leaf, leaf.parent)])
    assert after is not None and after.quota_cores == pytest.approx(0.1)
    assert after.periods is not None and before.periods is not None and after.periods - before.periods >= 5
    assert after.throttled_periods is not None and before.throttled_periods is not None
    # a spinner under 0.1 core is throttled in most periods
    assert after.throttled_periods - before.throttled_periods >= 5
    assert after.throttled_seconds is not None and before.throttled_seconds is not None
    assert after.throttled_seconds > before.throttled_seconds
    used = (after.usage_seconds or 0.0) - (before.usage_seconds or 0.0)
    assert 0.03 <= used <= 0.3  # about 0.1 core over 1 s: the quota held, and the use is the leaf's
