"""CPU quotas for the lab: a real cgroup v2 `cpu.max` per quota, or an emulation where none is writable.

Real: `/sys/fs/cgroup/boundwatch-lab-<name>` with `cpu.max = <cores x 100000> 100000`; the
processes move in (all their threads) and back to their own cgroups afterwards. Emulated (no
writable cgroup v2, e.g. a CI machine): the lab writes the matching `cpu.max` / `cpu.stat` in a
cgroup tree the daemon reads instead (`host.cgroup_root`), and the processes sleep off the CPU
they use beyond the quota themselves.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100000


def cgroup_of(pid: int) -> str:
    """Return the unified cgroup path of a process."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line[3:] or "/"
    return "/"


class Quota:
    """Put processes under a CPU quota and take them out again (one quota at a time)."""

    def __init__(self, workdir: Path) -> None:
        self.mode = "cgroup_v2"
        self.detail = ""
        self.fake_root: Path | None = None
        self.made: list[Path] = []
        self.homes: dict[int, str] = {}
        self.active: tuple[str, float] | None = None
        self._sim: threading.Thread | None = None
        self._stop = threading.Event()
        self._fake_dirs: list[Path] = []
        # the emulated cpu.stat counters, cumulative over every quota entered, as a cgroup's never go back
        self._stat = [0, 0, 0]
        try:
            if not (ROOT / "cgroup.controllers").exists():
                raise OSError("no cgroup v2 at /sys/fs/cgroup")
            if "cpu" not in (ROOT / "cgroup.controllers").read_text().split():
                raise OSError("the cpu controller is not available at the root")
            if "cpu" not in (ROOT / "cgroup.subtree_control").read_text().split():
                (ROOT / "cgroup.subtree_control").write_text("+cpu")
            probe = ROOT / "boundwatch-lab-probe"
            probe.mkdir(exist_ok=True)
            (probe / "cpu.max").write_text(f"max {PERIOD_US}")
            probe.rmdir()
            self.detail = "cgroup v2 cpu.max under /sys/fs/cgroup/boundwatch-lab-<name>"
        except OSError as exc:
            self.mode = "emulated"
            self.detail = (
                f"cgroup v2 cpu.max not writable ({exc}); the processes sleep to the quota and the lab "
                "writes cpu.max / cpu.stat in a cgroup tree the daemon reads (host.cgroup_root)"
            )
            self.fake_root = workdir / "cgroupfs"
            self.fake_root.mkdir(parents=True, exist_ok=True)
            (self.fake_root / "cgroup.controllers").write_text("cpu memory\n")

    @property
    def emulated(self) -> bool:
        """Say whether quotas are emulated."""
        return self.fake_root is not None

    def daemon_env(self) -> dict[str, str]:
        """Return what the daemon needs to read the emulated quotas."""
        return {"BOUNDWATCH_HOST__CGROUP_ROOT": str(self.fake_root)} if self.fake_root else {}

    def prepare(self, pids: list[int]) -> None:
        """Lay out the emulated cgroups of processes (no quota yet)."""
        if self.fake_root is None:
            return
        for pid in pids:
            d = self.fake_root / cgroup_of(pid).lstrip("/")
            d.mkdir(parents=True, exist_ok=True)
            if not (d / "cpu.max").exists():
                (d / "cpu.max").write_text(f"max {PERIOD_US}\n")
                self._write_stat(d, (0, 0, 0))

    @staticmethod
    def _write_stat(d: Path, stat: tuple[int, int, int]) -> None:
        p, t, u = stat
        (d / "cpu.stat.tmp").write_text(
            f"usage_usec 0\nuser_usec 0\nsystem_usec 0\nnr_periods {p}\nnr_throttled {t}\nthrottled_usec {u}\n"
        )
        os.replace(d / "cpu.stat.tmp", d / "cpu.stat")

    def _simulate(self, dirs: list[Path], cores: float) -> None:
        stat = self._stat
        while not self._stop.wait(0.1):
            stat[0] += 1
            stat[1] += 1
            stat[2] += int(PERIOD_US * max(0.0, 1 - cores))
            for d in dirs:
                self._write_stat(d, (stat[0], stat[1], stat[2]))

    def enter(self, name: str, cores: float, pids: list[int]) -> str:
        """Put processes under one quota of `cores`; return where it is."""
        self.active = (name, cores)
        if self.fake_root is None:
            cg = ROOT / f"boundwatch-lab-{name}"
            cg.mkdir(exist_ok=True)
            if cg not in self.made:
                self.made.append(cg)
            (cg / "cpu.max").write_text(f"{int(cores * PERIOD_US)} {PERIOD_US}")
            for pid in pids:
                self.homes[pid] = cgroup_of(pid)
                (cg / "cgroup.procs").write_text(str(pid))
            return f"{cg}/cpu.max = {int(cores * PERIOD_US)} {PERIOD_US}"
        dirs = sorted({self.fake_root / cgroup_of(pid).lstrip("/") for pid in pids})
        self.prepare(pids)
        for d in dirs:
            (d / "cpu.max").write_text(f"{int(cores * PERIOD_US)} {PERIOD_US}\n")
        self._fake_dirs = dirs
        self._stop.clear()
        self._sim = threading.Thread(target=self._simulate, args=(dirs, cores), daemon=True)
        self._sim.start()
        return f"emulated in {', '.join(map(str, dirs))}"

    def leave(self) -> None:
        """Lift the quota: processes back home (real) or cpu.max back to max (emulated)."""
        self.active = None
        if self.fake_root is None:
            for pid, home in self.homes.items():
                try:
                    Path(ROOT, home.lstrip("/"), "cgroup.procs").write_text(str(pid))
                except OSError:
                    pass
            self.homes = {}
            return
        self._stop.set()
        if self._sim is not None:
            self._sim.join()
        for d in self._fake_dirs:
            (d / "cpu.max").write_text(f"max {PERIOD_US}\n")

    def remove(self) -> None:
        """Remove the lab's cgroups."""
        if self.active:
            self.leave()
        for cg in self.made:
            try:
                cg.rmdir()
            except OSError:
                pass


class CpuCap:
    """An emulated CPU quota on one process (where no cgroup is writable): `pay` sleeps off the CPU used beyond it.

    As CFS throttles within each period, quota left unused does not carry past a period (a process
    idle for a while would otherwise bank a burst, and its GPU read busy as no quota lets it).
    """

    def __init__(self) -> None:
        self.cores: float | None = None
        self._at, self._cpu = time.monotonic(), time.process_time()

    def set(self, cores: float | None) -> None:
        """Put the process under `cores` (None: no quota), from now."""
        self.cores = cores
        self._at, self._cpu = time.monotonic(), time.process_time()

    def pay(self) -> None:
        """Sleep off the CPU this process used beyond its quota (at most a second at a time)."""
        if self.cores is None:
            return
        now, cpu = time.monotonic(), time.process_time()
        used, allowed = cpu - self._cpu, (now - self._at) * self.cores
        period = PERIOD_US / 1e6
        if used > allowed:
            time.sleep(min(1.0, (used - allowed) / self.cores))
        elif allowed - used > period * self.cores:
            self._at, self._cpu = now - period, cpu
