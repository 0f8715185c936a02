"""The scenario lab: real workloads that reproduce the field cases, watched by the real sidecar and agent.

One API server (bench/scenarios/apiserver.py, started as `vllm serve` so discovery finds it) feeds
one engine core (bench/scenarios/engine.py, with `exporter.agent.start()` inside); the real daemon
(`python -m exporter`) samples NVML, /proc, cgroups, the engine's /metrics and the agent. The lab
switches the load through the scenarios and reads every tick's verdict from the daemon's
/api/snapshot and /metrics, then scores them (bench/scenarios/score.py).

    python3 bench/scenarios/lab.py                 # on a GPU host (cgroup v2 writable for the quota case)
    python3 bench/scenarios/lab.py --device cpu    # the harness alone: no GPU, verdicts come out unknown

Writes bench/results/scenarios.json (scores, pass/fail, environment) and the daemon's Snapshots
as a recording (`boundwatch replay` reads it).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.scenarios.score import Segment, Tick, passed, score  # noqa: E402
from exporter.commands._live import daemon_answers, from_daemon  # noqa: E402
from exporter.snapshot import Snapshot, codec  # noqa: E402

# (scenario, API-server mode, seconds, expected verdict, expected reason)
SCHEDULE: tuple[tuple[str, str, float, str, str | None], ...] = (
    ("idle", "idle", 8, "idle", None),
    ("gpu_bound_decode", "gpu", 16, "gpu", None),
    ("api_server_saturated", "api", 16, "host", "api_server_saturated"),
    ("gpu_bound_decode_again", "gpu", 12, "gpu", None),
    ("cpu_quota_throttled", "quota", 16, "host", "cpu_quota_throttled"),
    ("eager_decode", "eager", 16, "host", "cuda_graph_fallback"),
    ("idle_again", "idle", 8, "idle", None),
)
QUOTA_CORES = 0.2
H200_COPY_BYTES_PER_SECOND = 4.281e12  # torch copy_ on this H200 (shared/research/device-probe.md)


# Scenarios during which `boundwatch diagnose` reads the daemon (from 3 s in), to show its report.
DIAGNOSE = ("api_server_saturated", "cpu_quota_throttled", "eager_decode")


def diagnose(url: str, seconds: float, env: dict[str, str], into: dict[str, str], name: str) -> None:
    """Run `boundwatch diagnose --url` against the daemon and keep its report."""
    time.sleep(3)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "exporter", "diagnose", "--url", url, "--seconds", f"{seconds:g}"],
            capture_output=True, text=True, env=env, cwd=ROOT, timeout=seconds + 30,
        )  # fmt: skip
        into[name] = done.stdout + (
            f"\n[rc={done.returncode}] {done.stderr[-500:]}" if done.returncode else ""
        )
    except (OSError, subprocess.SubprocessError) as exc:
        into[name] = f"failed: {exc}"


def free_port() -> int:
    """Return a free loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def log(msg: str) -> None:
    """Print a progress line."""
    print(f"[lab {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --- the CPU quota: a real cgroup v2 cpu.max, or an emulation when none is writable -------


class Quota:
    """Put a process under a CPU quota and take it out again."""

    def __init__(self, cores: float, workdir: Path) -> None:
        self.cores = cores
        self.mode = "off"
        self.detail = ""
        self.cg: Path | None = None
        self.fake_root: Path | None = None
        self._sim: threading.Thread | None = None
        self._sim_stop = threading.Event()
        root = Path("/sys/fs/cgroup")
        try:
            if not (root / "cgroup.controllers").exists():
                raise OSError("no cgroup v2 at /sys/fs/cgroup")
            if "cpu" not in (root / "cgroup.controllers").read_text().split():
                raise OSError("the cpu controller is not available at the root")
            if "cpu" not in (root / "cgroup.subtree_control").read_text().split():
                (root / "cgroup.subtree_control").write_text("+cpu")
            cg = root / "boundwatch-lab-quota"
            cg.mkdir(exist_ok=True)
            (cg / "cpu.max").write_text(f"{int(cores * 100000)} 100000")
            self.cg, self.mode = cg, "cgroup_v2"
            self.detail = f"{cg}/cpu.max = {int(cores * 100000)} 100000"
        except OSError as exc:
            self.mode = "emulated"
            self.detail = (
                f"cgroup v2 cpu.max not writable ({exc}); the API server sleeps to {cores:g} cores and the "
                "lab writes the matching cpu.max/cpu.stat in a cgroup tree the daemon reads (host.cgroup_root)"
            )
            self.fake_root = workdir / "cgroupfs"
            self.fake_root.mkdir(parents=True, exist_ok=True)
            (self.fake_root / "cgroup.controllers").write_text("cpu memory\n")

    def daemon_env(self) -> dict[str, str]:
        """Return what the daemon needs to read this quota."""
        return {"BOUNDWATCH_HOST__CGROUP_ROOT": str(self.fake_root)} if self.fake_root else {}

    def prepare(self, pid: int) -> None:
        """Lay out the emulated cgroup of a process (no quota yet)."""
        if self.fake_root is None:
            return
        self._path = self.fake_root / cgroup_of(pid).lstrip("/")
        self._path.mkdir(parents=True, exist_ok=True)
        (self._path / "cpu.max").write_text("max 100000\n")
        self._stat = [0, 0, 0]  # periods, throttled, throttled_usec
        self._write_stat()

    def _write_stat(self) -> None:
        p, t, u = self._stat
        (self._path / "cpu.stat.tmp").write_text(
            f"usage_usec 0\nuser_usec 0\nsystem_usec 0\nnr_periods {p}\nnr_throttled {t}\nthrottled_usec {u}\n"
        )
        os.replace(self._path / "cpu.stat.tmp", self._path / "cpu.stat")

    def _simulate(self) -> None:
        while not self._sim_stop.wait(0.1):
            self._stat[0] += 1
            self._stat[1] += 1
            self._stat[2] += int(100000 * (1 - self.cores))
            self._write_stat()

    def enter(self, pid: int) -> None:
        """Apply the quota to a process."""
        if self.cg is not None:
            self._home = cgroup_of(pid)
            (self.cg / "cgroup.procs").write_text(str(pid))
        elif self.fake_root is not None:
            (self._path / "cpu.max").write_text(f"{int(self.cores * 100000)} 100000\n")
            self._sim_stop.clear()
            self._sim = threading.Thread(target=self._simulate, daemon=True)
            self._sim.start()

    def leave(self, pid: int) -> None:
        """Lift the quota."""
        if self.cg is not None:
            Path("/sys/fs/cgroup", self._home.lstrip("/"), "cgroup.procs").write_text(str(pid))
        elif self.fake_root is not None:
            self._sim_stop.set()
            if self._sim is not None:
                self._sim.join()
            (self._path / "cpu.max").write_text("max 100000\n")

    def remove(self) -> None:
        """Remove the lab's cgroup."""
        if self.cg is not None:
            try:
                self.cg.rmdir()
            except OSError:
                pass


def cgroup_of(pid: int) -> str:
    """Return the unified cgroup path of a process."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line[3:] or "/"
    return "/"


# --- reading the daemon -------------------------------------------------------------------


def scrape_bound(url: str) -> tuple[int | None, str | None, tuple[str, ...]]:
    """Return (ticks_total, verdict, reasons) for GPU 0 from the daemon's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "/metrics", timeout=2) as resp:
        text = resp.read().decode()
    ticks, verdict, reasons = None, None, []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "boundwatch_ticks_total":
                ticks = int(s.value)
            elif s.name == "boundwatch_bound" and s.labels.get("gpu") == "0" and s.value == 1:
                verdict = s.labels["verdict"]
            elif s.name == "boundwatch_bound_reason" and s.labels.get("gpu") == "0" and s.value == 1:
                reasons.append(s.labels["reason"])
    return ticks, verdict, tuple(reasons)


class Watch:
    """Collect the daemon's Snapshots and its /metrics verdicts in the background."""

    def __init__(self, url: str, seconds: float) -> None:
        self.url = url
        self.snaps: list[Snapshot] = []
        self.metrics: dict[int, tuple[str | None, tuple[str, ...]]] = {}
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=lambda: from_daemon(url, seconds, 0.5, self.snaps.append), daemon=True),
            threading.Thread(target=self._scrape, daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _scrape(self) -> None:
        while not self._stop.wait(0.2):
            try:
                ticks, verdict, reasons = scrape_bound(self.url)
            except OSError:
                continue
            if ticks is not None:
                self.metrics[ticks] = (verdict, reasons)

    def stop(self) -> None:
        """Wait for the Snapshot reader to finish and stop scraping."""
        self._threads[0].join()
        self._stop.set()
        self._threads[1].join()


def wait_for(what: str, check: Any, timeout: float) -> Any:
    """Poll check() until it returns something truthy."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = check()
        if got:
            return got
        time.sleep(0.25)
    raise TimeoutError(f"timed out waiting for {what}")


def latest(url: str) -> Snapshot | None:
    """Return the daemon's newest Snapshot."""
    try:
        with urllib.request.urlopen(url + "/api/snapshot", timeout=2) as resp:
            return codec.from_json(json.loads(resp.read()))
    except (OSError, ValueError):
        return None


def gpu_info() -> dict[str, Any]:
    """Return the GPU's name and driver, if NVML answers."""
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        return {"gpu": pynvml.nvmlDeviceGetName(h), "driver": pynvml.nvmlSystemGetDriverVersion()}
    except Exception as exc:
        return {"gpu": None, "nvml": str(exc)}


def main(argv: list[str] | None = None) -> int:
    """Run the lab and write the results."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"), help="results folder")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every scenario's length")
    p.add_argument("--quota-cores", type=float, default=QUOTA_CORES)
    args = p.parse_args(argv)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bwlab-"))
    sock = work / "agent.sock"
    api_port, bw_port = free_port(), free_port()
    url = f"http://127.0.0.1:{bw_port}"
    quota = Quota(args.quota_cores, work)
    log(f"quota: {quota.mode}: {quota.detail}")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.update(
        {
            "PYTHONUNBUFFERED": "1",
            "BOUNDWATCH_AGENT_SOCKET": str(sock),
            "BOUNDWATCH_AGENT_SAMPLING": "off",  # exact kernel records throughout (the eager case launches ~100k/s)
        }
    )
    procs: list[subprocess.Popen[Any]] = []
    results: dict[str, Any] = {"started": time.time(), "host": platform.node(), **gpu_info()}
    try:
        api = subprocess.Popen(
            [sys.executable, str(ROOT / "bench/scenarios/vllm"), "serve", "--port", str(api_port),
             "--device", args.device],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(work / "apiserver.log", "w"),
            text=True, env=env, cwd=ROOT,
        )  # fmt: skip
        procs.append(api)
        lines: list[str] = []
        threading.Thread(target=lambda: lines.extend(api.stdout or ()), daemon=True).start()

        def api_ready() -> str | None:
            if api.poll() is not None:
                raise RuntimeError(f"API server exited: {(work / 'apiserver.log').read_text()[-3000:]}")
            return next((line for line in lines if line.startswith("READY ")), None)

        ready = wait_for("the engine", api_ready, 300)
        info = eval(ready[6:], {})  # our own repr of a dict of literals
        log(f"engine ready: {info}")
        results["engine"] = info
        quota.prepare(api.pid)
        denv = {
            **env,
            **quota.daemon_env(),
            "BOUNDWATCH_VERDICT__MAX_BATCH": "64",
            "BOUNDWATCH_ROOFLINE__WEIGHT_BYTES_PER_STEP": str(info.get("weight_bytes") or ""),
            "BOUNDWATCH_ROOFLINE__HBM_BANDWIDTH_BYTES_PER_SECOND": str(H200_COPY_BYTES_PER_SECOND),
        }
        if not info.get("weight_bytes"):
            denv.pop("BOUNDWATCH_ROOFLINE__WEIGHT_BYTES_PER_STEP")
        daemon = subprocess.Popen(
            [sys.executable, "-m", "exporter", "--address", "127.0.0.1", "--port", str(bw_port),
             "--engine-url", f"http://127.0.0.1:{api_port}/metrics", "--agent-socket", str(sock),
             "--log-level", "warning", "--log-format", "json"],
            stdout=open(work / "daemon.out", "w"), stderr=subprocess.STDOUT, env=denv, cwd=ROOT,
        )  # fmt: skip
        procs.append(daemon)
        wait_for("the daemon", lambda: daemon_answers(url), 60)

        def engine_seen() -> bool:
            snap = latest(url)
            return bool(snap and any(e.api_servers for e in snap.engines))

        wait_for("the daemon to find the API server", engine_seen, 30)
        if args.device == "cuda":
            try:
                wait_for("the agent", lambda: (s := latest(url)) and s.agent and s.agent.agents, 20)
            except TimeoutError as exc:
                log(f"warning: {exc}")
        snap = latest(url)
        results["daemon_sources"] = {s.name: s.up for s in snap.sources} if snap else {}
        results["agents"] = [a.__dict__ for a in snap.agent.agents] if snap and snap.agent else []
        log(f"daemon sources: {results['daemon_sources']}; agents: {results['agents']}")

        total = sum(sec for _, _, sec, _, _ in SCHEDULE) * args.scale
        watch = Watch(url, total + 1.0)
        segments: list[Segment] = []
        reports: dict[str, str] = {}
        in_quota = False
        for name, mode, seconds, verdict, reason in SCHEDULE:
            seconds *= args.scale
            if mode == "quota" and not in_quota:
                quota.enter(api.pid)
                in_quota = True
            elif mode != "quota" and in_quota:
                quota.leave(api.pid)
                in_quota = False
            assert api.stdin is not None
            sim = mode == "quota" and quota.mode == "emulated"
            api.stdin.write((f"quota-sim:{quota.cores:g}" if sim else mode) + "\n")
            api.stdin.flush()
            start = time.time()
            log(
                f"scenario {name}: {mode} for {seconds:g} s (expect {verdict}{' ' + reason if reason else ''})"
            )
            if name in DIAGNOSE and seconds > 8:
                threading.Thread(
                    target=diagnose, args=(url, seconds - 5, denv, reports, name), daemon=True
                ).start()
            time.sleep(seconds)
            segments.append(Segment(name, verdict, reason, start, time.time()))
        if in_quota:
            quota.leave(api.pid)
        watch.stop()

        ticks = [
            Tick(s.seq, s.at, v.verdict, v.reasons) for s in watch.snaps for v in s.verdicts if v.gpu == 0
        ]
        rows = score(ticks, segments)
        agree = [s.seq for s in watch.snaps if s.seq in watch.metrics]
        same = [q for q in agree if watch.metrics[q][0] == gpu0_verdict(snap_of(watch.snaps, q))]
        results.update(
            schedule=[s.__dict__ for s in segments],
            diagnose=reports,
            quota={"mode": quota.mode, "detail": quota.detail, "cores": quota.cores},
            scores=rows,
            verdict_ticks=len(ticks),
            metrics_ticks_matched=len(agree),
            metrics_agree_share=round(len(same) / len(agree), 4) if agree else None,
            passed=passed(rows),
            device=args.device,
            finished=time.time(),
        )
        rec = out / "scenarios-recording.jsonl.gz"
        with gzip.open(rec, "wt") as fh:
            fh.write(codec.header(tick_seconds=0.5, lab=True) + "\n")
            for s in watch.snaps:
                fh.write(codec.dumps(s) + "\n")
        results["recording"] = str(rec.relative_to(ROOT)) if rec.is_relative_to(ROOT) else str(rec)
        if api.stdin is not None:
            api.stdin.write("stop\n")
            api.stdin.flush()
        api.wait(20)
    except Exception as exc:
        import traceback

        results["error"] = "".join(traceback.format_exception(exc))[-4000:]
        log(f"failed: {exc!r}")
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
        quota.remove()
        for name in ("apiserver.log", "daemon.out"):
            if (work / name).exists():
                shutil.copy(work / name, out / f"scenarios-{name}")
    (out / "scenarios.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(table(results))
    ok = results.get("passed", {})
    return 0 if ok.get("every_scenario_right") and ok.get("every_switch_in_time") else 1


def gpu0_verdict(snap: Snapshot) -> str | None:
    """Return GPU 0's verdict in a Snapshot."""
    return next((v.verdict for v in snap.verdicts if v.gpu == 0), None)


def snap_of(snaps: list[Snapshot], seq: int) -> Snapshot:
    """Return the Snapshot with a sequence number."""
    return next(s for s in snaps if s.seq == seq)


def table(results: dict[str, Any]) -> str:
    """Return the scores as a Markdown table."""
    lines = [
        "| scenario | expected | ticks scored | right | verdict right | primary reason | verdict switch | right after |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results.get("scores", []):

        def pct(x: float | None) -> str:
            return "-" if x is None else f"{x:.1%}"

        sw = (
            f"{r['switch_seconds']:.2f} s"
            if r["verdict_changed"] and r["switch_seconds"] is not None
            else "-"
        )
        ra = "-" if r["right_after_seconds"] is None else f"{r['right_after_seconds']:.2f} s"
        lines.append(
            f"| {r['scenario']} | {r['expected']} | {r['ticks_scored']} | {pct(r['right_share'])} | "
            f"{pct(r['verdict_share'])} | {pct(r['primary_reason_share'])} | {sw} | {ra} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
