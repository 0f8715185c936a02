"""Where a real kernel counts throttling under an ancestor's CPU quota, and what boundwatch reads there.

Needs root and a writable cgroup: v2 at /sys/fs/cgroup (the lent GPU machine), else v1's cpu
hierarchy at /sys/fs/cgroup/cpu (the development VM). Makes `boundwatch-anc/leaf`, puts a 0.2-core
quota on `boundwatch-anc` (the leaf has none), spins a child process in the leaf for `--seconds`,
then reads both cgroups' cpu.stat and `exporter.sources.cgroup.read_cgroup_cpu` on the leaf.
With `--cost N`, also times N reads (`read_cgroup_cpu` with its files kept open and its quota
cached, as the daemon reads each tick) of the leaf and of a cgroup with a quota of its own
(`boundwatch-own`), alternating in 5 rounds: what reading the counters where an ancestor's quota
binds adds to a tick. With `--late`, first the quota is set while the spinner runs, the leaf read
as the daemon reads it each 0.5 s tick (its quota cached) before and after: how many ticks until the
ancestor's quota shows (v2 on Linux 6.6+: the leaf's `cpu.stat.local`). Writes JSON; removes what it made.

    sudo python3 bench/cgroup_ancestor.py --out /tmp/cgroup_ancestor.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exporter.sources.cgroup import read_cgroup_cpu
from exporter.sources.pseudofiles import KeptFiles

ROOT = Path("/sys/fs/cgroup")


def stat(d: Path) -> dict[str, int]:
    """Return a cgroup's cpu.stat as integers."""
    out = {}
    for line in (d / "cpu.stat").read_text().splitlines():
        key, _, value = line.partition(" ")
        if value.isdigit():
            out[key] = int(value)
    return out


def read_cost(base: Path, v2: bool, cores: float, n: int) -> dict[str, Any]:
    """Time `read_cgroup_cpu` on the leaf (ancestor's quota) and on a cgroup with its own quota (us a read)."""
    own = base / "boundwatch-own"
    own.mkdir(exist_ok=True)
    try:
        if v2:
            (own / "cpu.max").write_text(f"{int(cores * 100000)} 100000")
        else:
            (own / "cpu.cfs_quota_us").write_text(str(int(cores * 100000)))
        files = KeptFiles()
        times: dict[str, list[float]] = {"own_quota": [], "ancestor_quota": []}
        for _ in range(5):
            for key, path in (("own_quota", "/boundwatch-own"), ("ancestor_quota", "/boundwatch-anc/leaf")):
                t = time.perf_counter_ns()
                for i in range(n):
                    read_cgroup_cpu(str(ROOT), path, version=2 if v2 else 1, now=1e6 + i * 1e-4, files=files)
                times[key].append((time.perf_counter_ns() - t) / n / 1000)
        files.close()
        return {
            k: {"median": round(statistics.median(v), 2), "rounds": [round(x, 2) for x in v]}
            for k, v in times.items()
        }
    finally:
        own.rmdir()


def late_quota(set_quota: Any, v2: bool, ticks: int = 8) -> dict[str, Any]:
    """Read the leaf as the daemon does (files kept, quota cached) at 0.5 s ticks: 2 before the quota, then `ticks`."""
    files = KeptFiles()
    path, t0, out = "/boundwatch-anc/leaf", time.monotonic(), []
    try:
        for i in range(2 + ticks):
            if i == 2:
                set_quota()
            cg = read_cgroup_cpu(str(ROOT), path, version=2 if v2 else 1, now=time.monotonic(), files=files)
            out.append({"t": round(time.monotonic() - t0, 2), "quota_cores": cg.quota_cores if cg else None})
            time.sleep(0.5)
    finally:
        files.close()
    seen = next((k - 2 for k, r in enumerate(out) if k >= 2 and r["quota_cores"] is not None), None)
    return {"ticks": out, "ticks_until_seen_after_set": seen}


def main() -> int:
    """Run the probe and write its JSON."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--quota-cores", type=float, default=0.2)
    p.add_argument("--cost", type=int, default=0, help="reads to time per round (0: none)")
    p.add_argument("--late", action="store_true", help="set the quota while the leaf is read tick by tick")
    p.add_argument("--out", default="cgroup_ancestor.json")
    args = p.parse_args()
    v2 = (ROOT / "cgroup.controllers").exists()
    base = ROOT if v2 else ROOT / "cpu"
    parent, leaf = base / "boundwatch-anc", base / "boundwatch-anc" / "leaf"
    leaf.mkdir(parents=True, exist_ok=True)
    if v2:
        if "cpu" not in (ROOT / "cgroup.subtree_control").read_text().split():
            (ROOT / "cgroup.subtree_control").write_text("+cpu")
        (parent / "cgroup.subtree_control").write_text("+cpu")
        limits = ("cpu.max",)
    else:
        (parent / "cpu.cfs_period_us").write_text("100000")
        limits = ("cpu.cfs_quota_us", "cpu.cfs_period_us")

    def set_quota() -> None:
        if v2:
            (parent / "cpu.max").write_text(f"{int(args.quota_cores * 100000)} 100000")
        else:
            (parent / "cpu.cfs_quota_us").write_text(str(int(args.quota_cores * 100000)))

    if not args.late:
        set_quota()
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        (leaf / "cgroup.procs").write_text(str(spin.pid))
        late = late_quota(set_quota, v2) if args.late else None
        time.sleep(args.seconds)
        got = {
            "cgroup_version": 2 if v2 else 1,
            "kernel": os.uname().release,
            "quota_cores": args.quota_cores,
            "seconds": args.seconds,
            "parent_limits": {f: (parent / f).read_text().strip() for f in limits},
            "leaf_limits": {f: (leaf / f).read_text().strip() for f in limits},
            "parent_stat": stat(parent),
            "leaf_stat": stat(leaf),
            "read_cgroup_cpu_leaf": read_cgroup_cpu(str(ROOT), "/boundwatch-anc/leaf").__dict__,
            "leaf_stat_local": (leaf / "cpu.stat.local").read_text().split()
            if (leaf / "cpu.stat.local").exists()
            else None,
        }
        if late is not None:
            got["late_quota"] = late
        if args.cost:
            got["read_us"] = read_cost(base, v2, args.quota_cores, args.cost)
    finally:
        spin.kill()
        spin.wait()
        for d in (leaf, parent):
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)
    Path(args.out).write_text(json.dumps(got, indent=1) + "\n")
    print(json.dumps(got, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
