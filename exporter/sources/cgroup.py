"""Read a cgroup's CPU quota and throttling (cgroup v2 `cpu.max`/`cpu.stat`, v1 CFS files).

Roots are injectable so tests read real fixture trees. The effective quota of a cgroup is the
smallest quota on its path to the root: a pod-level limit binds every container below it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from exporter.snapshot.host import CgroupCpu
from exporter.sources.pseudofiles import KeptFiles, read_path

V1_CPU_DIRS = ("cpu,cpuacct", "cpu", "cpuacct,cpu")
V1_ACCT_DIRS = ("cpu,cpuacct", "cpuacct", "cpuacct,cpu")


def cgroup_version(cgroup_root: str) -> int:
    """Return 2 for a unified hierarchy at cgroup_root, else 1."""
    return 2 if os.path.exists(os.path.join(cgroup_root, "cgroup.controllers")) else 1


def cgroup_path_of(proc_root: str, pid: int | str, files: KeptFiles | None = None) -> str:
    """Return the CPU cgroup path of a process ("/" when it cannot be told); `files`: kept open there."""
    path = f"{proc_root}/{pid}/cgroup"
    try:
        text = read_file(path) if files is None else files.read(path).decode(errors="replace")
    except OSError:
        return "/"
    unified = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            unified = path
        elif "cpu" in controllers.split(","):
            return path or "/"
    return unified or "/"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def read_file(path: str) -> str:
    """Return a /proc or cgroup file's text (raises OSError), without pathlib's per-call cost."""
    return read_path(path).decode(errors="replace")


def _read_str(path: str, files: KeptFiles | None = None) -> str | None:
    """Return a small file's text, stripped (None when it cannot be read); `files`: kept open there."""
    try:
        if files is not None:
            return files.read(path).decode(errors="replace").strip()
        return read_file(path).strip()
    except OSError:
        return None


def _stat(text: str | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        try:
            out[key] = int(value)
        except ValueError:
            continue
    return out


def _ancestors(rel_path: str) -> list[str]:
    """Return rel_path and each parent up to the root, leaf first."""
    parts = [p for p in rel_path.strip("/").split("/") if p]
    return ["/" + "/".join(parts[:i]) if i else "/" for i in range(len(parts), -1, -1)]


Quota = tuple[float | None, str | None]  # the effective quota in cores and the cgroup that sets it


def _smallest_on_path(rel_path: str, cores_at: Callable[[str], float | None]) -> Quota:
    """Return the smallest quota on a cgroup's path to the root and the cgroup that sets it (the deepest on a tie)."""
    quota: float | None = None
    binding: str | None = None
    for path in _ancestors(rel_path):  # the leaf first
        cores = cores_at(path)
        if cores is not None and (quota is None or cores < quota):
            quota, binding = cores, path
    return quota, binding


def _v2_cores(cgroup_root: str, path: str) -> float | None:
    """Return the quota one cgroup's own cpu.max sets, in cores (None: unlimited or unreadable)."""
    fields = (_read_str(os.path.join(cgroup_root, path.lstrip("/"), "cpu.max")) or "").split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    try:
        return int(fields[0]) / int(fields[1])
    except (ValueError, ZeroDivisionError):
        return None


def _v2_quota(cgroup_root: str, rel_path: str) -> Quota:
    """Return the effective quota in cores and the cgroup that sets it (the leaf's own where it binds)."""
    return _smallest_on_path(rel_path, lambda path: _v2_cores(cgroup_root, path))


def _v1_dir(cgroup_root: str, names: tuple[str, ...] = V1_CPU_DIRS) -> Path | None:
    for name in names:
        candidate = Path(cgroup_root, name)
        if candidate.is_dir():
            return candidate
    return None


def _v1_cores(base: Path, path: str) -> float | None:
    """Return the quota one v1 cgroup's own cfs files set, in cores (None: unlimited or unreadable)."""
    d = base / path.lstrip("/")
    q, p = _read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")
    if q is None or p is None:
        return None
    try:
        q_us, p_us = int(q), int(p)
    except ValueError:
        return None
    return q_us / p_us if q_us > 0 and p_us > 0 else None


def _v1_quota(base: Path, rel_path: str) -> Quota:
    """Return the effective quota in cores and the cgroup that sets it (the leaf's own where it binds)."""
    return _smallest_on_path(rel_path, lambda path: _v1_cores(base, path))


QUOTA_EVERY_SECONDS = 10.0  # a quota (one file per ancestor) is read again this often; counters every call
# (root, path) -> (read at, (cores, the cgroup that sets them), the cgroup's counters then: `periods`)
_quotas: dict[tuple[str, str], tuple[float, Quota, object]] = {}
_MAX_QUOTAS = 1024


def _quota_cached(
    cgroup_root: str,
    rel_path: str,
    now: float | None,
    read: Callable[[], Quota],
    periods: int | tuple[int | None, ...] | None = None,
) -> Quota:
    """Return a cgroup's effective quota and the cgroup that sets it, read at most every QUOTA_EVERY_SECONDS.

    Without `now` it is read every call. A cached "no quota" is read again at once when the
    cgroup's enforcement periods (`periods`, its nr_periods) have moved since: the kernel counts
    them only under a quota, so one was set (`docker update --cpus`, a systemd CPUQuota=, a pod
    resized in place; the lab's quota scenarios) and its throttling would otherwise show for up to
    QUOTA_EVERY_SECONDS without the quota that it is measured against. `periods` may be a tuple of
    such counters (v2: nr_periods and cpu.stat.local's throttled_usec, which also moves under an
    ancestor's quota), any of which moving reads it again.
    """
    if now is None:
        return read()
    key = (cgroup_root, rel_path)
    hit = _quotas.get(key)
    fresh = hit is not None and now - hit[0] < QUOTA_EVERY_SECONDS  # read again only as a counter moved
    if hit is not None and fresh:
        _, quota, seen = hit
        if quota[0] is not None or periods is None or seen is None or periods == seen:
            return quota
    if len(_quotas) >= _MAX_QUOTAS:
        _quotas.clear()
    quota = read()
    if hit is not None and fresh and quota[0] is None:
        # the counters moved and still no quota is seen (one set above the cgroup namespace's root,
        # which this daemon cannot read): no trigger again until the interval, not a read each tick
        _quotas[key] = (hit[0], quota, None)
    else:
        _quotas[key] = (now, quota, periods)
    return quota


LOCAL_SLACK_USEC = 50_000  # throttled time the leaf may gain beyond its binding quota's between two reads


def _tighter_elsewhere(key: tuple[str, str], local: int | None, bound: int | None) -> None:
    """Drop a cached quota when the leaf is throttled beyond what its binding cgroup counts (v2, Linux 6.6+).

    `local`: the leaf's cpu.stat.local throttled_usec (its throttling by any quota on its path);
    `bound`: the throttled_usec of the cgroup whose quota was cached as binding. Where the leaf gained
    more than LOCAL_SLACK_USEC beyond it since the last read, another quota throttles it: one set
    since on another ancestor, tighter than the cached one. The next read then reads the quotas
    again (at once, not up to QUOTA_EVERY_SECONDS later). Two counters read a moment apart can
    differ by a period's update: that costs one read of the quotas, never a wrong quota.
    """
    prev = _locals.get(key)
    if len(_locals) >= _MAX_QUOTAS and prev is None:
        _locals.clear()
    _locals[key] = (local, bound)
    if prev is None or None in (local, bound, *prev):
        return
    if (local - prev[0]) - (bound - prev[1]) > LOCAL_SLACK_USEC:  # type: ignore[operator]
        _quotas.pop(key, None)


_locals: dict[tuple[str, str], tuple[int | None, int | None]] = {}  # (root, path) -> the last two counters


_v1_dirs: dict[tuple[str, tuple[str, ...]], tuple[float, Path | None]] = {}


def _v1_dir_cached(cgroup_root: str, names: tuple[str, ...], now: float | None) -> Path | None:
    """Return a v1 hierarchy's directory, looked for at most every QUOTA_EVERY_SECONDS (every call without `now`)."""
    if now is None:
        return _v1_dir(cgroup_root, names)
    hit = _v1_dirs.get((cgroup_root, names))
    if hit is not None and now - hit[0] < QUOTA_EVERY_SECONDS:
        return hit[1]
    if len(_v1_dirs) >= _MAX_QUOTAS:
        _v1_dirs.clear()
    found = _v1_dir(cgroup_root, names)
    _v1_dirs[(cgroup_root, names)] = (now, found)
    return found


def _local_throttled(leaf: str, now: float | None, files: KeptFiles | None) -> int | None:
    """Return a v2 cgroup's cpu.stat.local throttled_usec (None without one, or without a quota cache: `now`).

    Linux 6.6+ counts there the time the cgroup's own run queues were throttled by any quota on its
    path, an ancestor's too (cpu.stat counts only the cgroup's own quota): so an ancestor's quota set
    while the processes stay (a systemd slice's CPUQuota=) reads again at once, not up to
    QUOTA_EVERY_SECONDS later. An older kernel has no such file: one failed open per cgroup, then
    it is not looked for again there (`_NO_LOCAL`).
    """
    if now is None or leaf in _NO_LOCAL:
        return None
    text = _read_str(os.path.join(leaf, "cpu.stat.local"), files)
    if text is None:
        if not os.path.isfile(os.path.join(leaf, "cpu.stat")):  # the cgroup gone, not the kernel's file
            return None
        if len(_NO_LOCAL) >= _MAX_QUOTAS:
            _NO_LOCAL.clear()
        _NO_LOCAL.add(leaf)
        return None
    return _stat(text).get("throttled_usec")


_NO_LOCAL: set[str] = set()  # v2 cgroup directories without cpu.stat.local (a kernel before 6.6)


def _counted_where_set(
    hierarchy: str, rel_path: str, stat: dict[str, int], binding: str | None, files: KeptFiles | None
) -> tuple[dict[str, int], str]:
    """Return the cpu.stat whose throttling counters count and where it was read ('': the cgroup's own)."""
    if binding is None or binding == rel_path:
        return stat, ""
    return _stat(_read_str(os.path.join(hierarchy, binding.lstrip("/"), "cpu.stat"), files)), binding


def read_cgroup_cpu(
    cgroup_root: str,
    rel_path: str,
    version: int | None = None,
    now: float | None = None,
    files: KeptFiles | None = None,
) -> CgroupCpu | None:
    """Return the CPU quota and throttling counters of one cgroup, or None when it is not there.

    The quota is the smallest on the path to the root, and the throttling counters (periods,
    throttled periods and time) are those of the cgroup that sets it: the leaf's own, or the
    ancestor's whose quota binds (one more cpu.stat read a call, only then). The kernel counts
    them in the cgroup whose quota enforces them, v1 and v2 alike: a leaf under an ancestor's quota
    (a systemd slice's CPUQuota=, a container whose processes sit in a child cgroup) reads 0
    periods and 0 throttled while the ancestor throttles it. Usage is the leaf's.
    With `now` (monotonic seconds) the quota (and where a v1 hierarchy is) comes from a cache
    younger than QUOTA_EVERY_SECONDS (they change rarely; the counters are read every call).
    With `files` the counters' files are read through it (kept open, one pread each).
    """
    version = version or cgroup_version(cgroup_root)
    rel_path = rel_path or "/"
    if version == 2:
        leaf = os.path.join(cgroup_root, rel_path.lstrip("/"))
        stat_text = _read_str(os.path.join(leaf, "cpu.stat"), files)
        if stat_text is None and not os.path.isdir(leaf):
            return None
        stat = _stat(stat_text)
        local = _local_throttled(leaf, now, files)
        quota, binding = _quota_cached(
            cgroup_root,
            rel_path,
            now,
            lambda: _v2_quota(cgroup_root, rel_path),
            (stat.get("nr_periods"), local),
        )
        counts, counted_at = _counted_where_set(cgroup_root, rel_path, stat, binding, files)
        if local is not None and quota is not None:
            _tighter_elsewhere((cgroup_root, rel_path), local, counts.get("throttled_usec"))
        return CgroupCpu(
            path=rel_path,
            quota_cores=quota,
            usage_seconds=stat["usage_usec"] / 1e6 if "usage_usec" in stat else None,
            throttled_seconds=counts["throttled_usec"] / 1e6 if "throttled_usec" in counts else None,
            throttled_periods=counts.get("nr_throttled"),
            periods=counts.get("nr_periods"),
            version=2,
            counted_at=counted_at,
        )
    base = _v1_dir_cached(cgroup_root, V1_CPU_DIRS, now)
    if base is None:
        return None
    v1_leaf = os.path.join(base, rel_path.lstrip("/"))
    stat_text = _read_str(os.path.join(v1_leaf, "cpu.stat"), files)
    if stat_text is None and not os.path.isdir(v1_leaf):
        return None
    stat = _stat(stat_text)
    quota, binding = _quota_cached(
        cgroup_root, rel_path, now, lambda: _v1_quota(base, rel_path), stat.get("nr_periods")
    )
    counts, counted_at = _counted_where_set(str(base), rel_path, stat, binding, files)
    acct = _v1_dir_cached(cgroup_root, V1_ACCT_DIRS, now)
    usage_path = os.path.join(acct, rel_path.lstrip("/"), "cpuacct.usage") if acct is not None else None
    usage = _read_str(usage_path, files) if usage_path is not None else None
    return CgroupCpu(
        path=rel_path,
        quota_cores=quota,
        usage_seconds=int(usage) / 1e9 if usage and usage.isdigit() else None,
        throttled_seconds=counts["throttled_time"] / 1e9 if "throttled_time" in counts else None,
        throttled_periods=counts.get("nr_throttled"),
        periods=counts.get("nr_periods"),
        version=1,
        counted_at=counted_at,
    )
