"""The scenario lab, as hard as the field: API servers that hold requests before the engine, quotas, eager decode.

bench/scenarios/serve.py (started as `vllm serve`) runs a `VLLM::EngineCore` process (a 16-layer
bf16 decoder with per-batch CUDA graphs, engine.py / model.py) behind 1 or 4 `VLLM::APIServer_<i>`
processes that render a chat template and tokenise 60-90k-token prompts in pure Python on their
main thread before the engine sees a request (apiserver.py). The real daemon (`python -m
exporter`, its defaults: discovery finds the engine and its API servers) samples NVML, /proc,
cgroups, the page and the agent; the lab reads every tick's verdict, records the engine's and
the API servers' truth beside it, and scores the verdicts after each scenario's first 2 s.

    python3 bench/scenarios/lab.py --agent none|light|cupti      # on the GPU host (cgroup v2, root)
    python3 bench/scenarios/lab.py --device cpu --scale 0.25     # without a GPU: NVML stand-in

Writes <out>/<name>.json (scores, truth, environment) and <out>/<name>.jsonl.gz (the daemon's
Snapshots, `boundwatch record` format, the schedule in its header); name defaults to
scenarios-field-<agent> (scenarios-field-cpu-<agent> on the CPU path).
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.scenarios import truth as tr  # noqa: E402
from bench.scenarios.quota import Quota  # noqa: E402
from bench.scenarios.score import Segment, Tick, passed, premise, score  # noqa: E402
from exporter.commands._live import daemon_answers  # noqa: E402
from exporter.snapshot import Snapshot, codec  # noqa: E402


@dataclass(frozen=True)
class Scenario:
    """One scenario: API servers, load, engine mode, quota, expected verdict and reason."""

    name: str
    servers: int
    load: str  # idle | short | long | light (apiserver.LOADS)
    clients: int
    mode: str  # graph | eager
    quota: str | None  # None | "api" (the API servers alone) | "container" (engine + API servers)
    verdict: str
    reason: str | None
    reason_no_agent: str | None = None  # the reason the evidence supports without any agent, if another

    def expected_reason(self, agent: str) -> str | None:
        """Return the reason expected in an agent mode: without an agent nothing sees CUDA graphs."""
        if agent == "none" and self.reason_no_agent is not None:
            return self.reason_no_agent
        return self.reason


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("api_server_saturated", 1, "long", 8, "graph", None, "host", "api_server_saturated"),
    Scenario("gpu_bound_decode", 4, "short", 32, "graph", None, "gpu", None),
    Scenario("fix_four_api_servers", 4, "long", 8, "graph", None, "gpu", None),
    # Without an agent the graph mode is invisible (it is switched at run time, not on the command
    # line): the queue full while the GPU starves says the host time is in the engine's own step.
    Scenario("eager_decode", 4, "short", 32, "eager", None, "host", "cuda_graph_fallback", "step_overhead"),
    Scenario("quota_api_servers", 4, "long", 8, "graph", "api", "host", "cpu_quota_throttled"),
    Scenario("quota_container", 4, "short", 32, "graph", "container", "host", "cpu_quota_throttled"),
    Scenario("idle", 4, "idle", 0, "graph", None, "idle", None),
)
# Beyond the field's seven, run only when named (--only).
EXTRA: tuple[Scenario, ...] = (
    # Two clients thinking 1.5 s between short requests: the engine empty most of the time, nothing
    # waiting, the API server idle; nothing on the host holds the GPU back. The verdict's rule offers
    # work for its offered window after each request while the busy share is the latest tick's, so
    # part of its ticks read host / admission_stalled (docs/verdict.md): a known disagreement, kept
    # measurable here.
    Scenario("light_load", 1, "light", 2, "graph", None, "idle", None),
)
SECONDS = 30.0
# The field's saturated API server (issue 9, seed 000): the GPU 0.44-0.47 busy, the engine's running
# 0.27-0.42 / waiting 0, the server's main thread at a full core.
SATURATED_BUSY = 0.45
WARMUP_SECONDS = 12.0
BIN_SECONDS = 0.25


def free_port() -> int:
    """Return a free loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def log(msg: str) -> None:
    """Print a progress line."""
    print(f"[lab {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Stack:
    """The lab's `vllm serve` process: commands in on stdin, answers out on stdout."""

    def __init__(self, args: argparse.Namespace, port: int, work: Path, env: dict[str, str]) -> None:
        cmd = [
            sys.executable, str(ROOT / "bench/scenarios/vllm"), "serve", "--port", str(port),
            "--device", args.device, "--agent", args.agent, "--max-num-seqs", "8", "--api-servers", "1",
            "--us-per-token", str(args.us_per_token or 2.5), "--work", str(work / "serve"),
        ]  # fmt: skip
        if args.engine_json:
            cmd += ["--engine-json", args.engine_json]
        self.port = port  # where the engine's page is served
        self.log_path = work / "serve.log"
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(self.log_path, "w"),
            text=True, env=env, cwd=ROOT,
        )  # fmt: skip
        self.lines: collections.deque[str] = collections.deque()
        self.cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()
        ready = self.expect("READY ", 600)
        self.info: dict[str, Any] = json.loads(ready[6:])
        self.api_pids: list[int] = list(self.info["api_server_pids"])

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def expect(self, prefix: str, timeout: float) -> str:
        """Return the next stdout line starting with prefix (raise if the process exits first)."""
        end = time.monotonic() + timeout
        with self.cond:
            while True:
                while self.lines:
                    line = self.lines.popleft()
                    if line.startswith(prefix):
                        return line
                    if line.startswith("ERR "):
                        raise RuntimeError(line)
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the lab server exited: {self.log_path.read_text()[-3000:]}")
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no {prefix!r} from the lab server")
                self.cond.wait(min(left, 1.0))

    def send(self, line: str, timeout: float = 120) -> dict[str, Any]:
        """Send one command and return its answer."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        got = self.expect(f"OK {line.split()[0]} ", timeout)
        out: dict[str, Any] = json.loads(got.split(" ", 2)[2])
        if "pids" in out:
            self.api_pids = list(out["pids"])
        return out

    def pids(self) -> list[int]:
        """Return the launcher, the engine and the API servers."""
        return [self.proc.pid, int(self.info["engine_pid"]), *self.api_pids]

    def stop(self) -> None:
        """Stop the stack."""
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write("stop\n")
                self.proc.stdin.flush()
                self.proc.wait(30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(10)


class ApiSampler:
    """Sample every API server's main-thread CPU and demand (cores) every 0.25 s (the truth beside the daemon's)."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.rows: list[tr.ApiSample] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        prev: dict[int, tuple[float, int, int]] = {}
        while not self._stop.wait(0.25):
            now, row = time.time(), {}
            for pid in list(self.stack.api_pids):
                got = tr.main_thread_ns("/proc", pid)
                if got is None:
                    continue
                if pid in prev and now > prev[pid][0]:
                    span = (now - prev[pid][0]) * 1e9
                    cpu = (got[0] - prev[pid][1]) / span
                    row[pid] = (cpu, cpu + (got[1] - prev[pid][2]) / span)
                prev[pid] = (now, *got)
            if row:
                self.rows.append((now, row))

    def stop(self) -> None:
        """Stop sampling."""
        self._stop.set()
        self._t.join()


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
    """Collect the daemon's Snapshots (every tick) and its /metrics verdicts in the background until end()."""

    def __init__(self, url: str, seconds: float) -> None:
        self.url = url
        self.snaps: list[Snapshot] = []
        self.metrics: dict[int, tuple[str | None, tuple[str, ...]]] = {}
        self._stop = threading.Event()
        self._deadline = time.monotonic() + seconds
        self._threads = [
            threading.Thread(target=self._snapshots, daemon=True),
            threading.Thread(target=self._scrape, daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _snapshots(self) -> None:
        seen = -1
        while not self._stop.wait(0.2) and time.monotonic() < self._deadline:
            snap = latest(self.url)
            if snap is not None and snap.seq != seen:
                seen = snap.seq
                self.snaps.append(snap)

    def _scrape(self) -> None:
        while not self._stop.wait(0.5) and time.monotonic() < self._deadline:
            try:
                ticks, verdict, reasons = scrape_bound(self.url)
            except OSError:
                continue
            if ticks is not None:
                self.metrics[ticks] = (verdict, reasons)

    def end(self) -> None:
        """Stop collecting."""
        self._stop.set()
        for t in self._threads:
            t.join()


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


SECRET_WORDS = ("SECRET", "TOKEN", "PASSWORD", "KEY", "AUTH")  # settings the results never keep


def start_daemon(
    args: argparse.Namespace, port: int, env: dict[str, str], work: Path, tree: Path = ROOT
) -> subprocess.Popen[Any]:
    """Start the real daemon with its defaults (discovery finds the lab's `vllm serve`), from `tree`'s exporter/."""
    denv = dict(env)
    if tree != ROOT:
        denv["PYTHONPATH"] = f"{tree}{os.pathsep}{env['PYTHONPATH']}"
    if args.device == "cpu":  # NVML stand-in: the engine's "GPU" busy time (bench/scenarios/standin)
        denv["PYTHONPATH"] = f"{ROOT / 'bench/scenarios/standin'}{os.pathsep}{denv['PYTHONPATH']}"
        denv["LAB_NVML_STANDIN"] = str(work / "serve" / "standin-gpu.bin")
    return subprocess.Popen(
        [sys.executable, "-m", "exporter", "--address", "127.0.0.1", "--port", str(port),
         "--agent-socket", env["BOUNDWATCH_AGENT_SOCKET"], "--log-level", "warning", "--log-format", "json"],
        stdout=open(work / "daemon.out", "a"), stderr=subprocess.STDOUT, env=denv, cwd=tree,
    )  # fmt: skip


def long_prompt_cost(info: dict[str, Any], busy: float) -> float:
    """Return the API-server CPU per prompt token (us) at which one server keeps the GPU `busy` with long prompts.

    One long request costs the GPU its prefill chunks and its decode steps at batch 1 (the engine's
    calibrated figures); one saturated server sends one request per (prompt tokens x cost).
    """
    from bench.scenarios.apiserver import LOADS
    from bench.scenarios.engine import DEFAULTS

    lo, hi, max_tokens = LOADS["long"]
    prompt = (lo + hi) / 2
    chunk = float(info.get("chunk_tokens") or DEFAULTS["chunk_tokens"])
    graph_ms = info.get("graph_ms") or {}
    step_ms = float(graph_ms.get("1") or graph_ms.get(1) or DEFAULTS["cpu_decode_ms"] * 0.7)
    chunk_ms = float(info.get("prefill_chunk_ms") or DEFAULTS["cpu_prefill_ms"])
    gpu_ms = -(-prompt // chunk) * chunk_ms + (max_tokens - 1) * step_ms
    return gpu_ms * 1000 / busy / prompt


def api_servers_seen(url: str, n: int) -> bool:
    """Say whether the daemon's newest Snapshot shows n API servers of the engine."""
    snap = latest(url)
    return bool(snap and any(len(e.api_servers) == n for e in snap.engines))


def switch(stack: Stack, quota: Quota, sc: Scenario, args: argparse.Namespace, url: str) -> dict[str, Any]:
    """Set the stack up for a scenario (servers, load, engine mode, quota); return what was done."""
    done: dict[str, Any] = {}
    if quota.active:
        quota.leave()
        if quota.emulated:
            stack.send("cap -")
    if len(stack.api_pids) != sc.servers:
        stack.send(f"servers {sc.servers}")
        stack.send(f"load short {8 * sc.servers}")  # warm, unscored, until the daemon sees them all
        t = time.monotonic()
        try:
            wait_for(
                f"the daemon to see {sc.servers} API servers", lambda: api_servers_seen(url, sc.servers), 20
            )
        except TimeoutError as exc:
            log(f"warning: {exc}")
        time.sleep(max(0.0, 2.0 - (time.monotonic() - t)))
        done["transition_seconds"] = round(time.monotonic() - t, 2)
        quota.prepare(stack.pids())
    cap: float | None = None
    if sc.quota == "api":
        cores = args.api_quota_cores
        done["quota"] = quota.enter("api", cores, stack.api_pids)
        cap = cores if quota.emulated else None
    elif sc.quota == "container":
        cores = args.container_quota_cores
        done["quota"] = quota.enter("container", cores, stack.pids())
        if quota.emulated:  # share the emulated quota: API servers 4/5, the engine 1/5
            cap = cores * 0.8
            stack.send(f"cap {cores * 0.2:g}")
    stack.send(f"load {sc.load} {sc.clients} {cap if cap else '-'}")
    stack.send(f"mode {sc.mode}")
    return done


def observed(snaps: list[Snapshot]) -> dict[str, Any]:
    """Return the medians of what the daemon read over a scenario's scored ticks."""

    def med(vals: list[float | None]) -> float | None:
        got = sorted(v for v in vals if v is not None)
        return round(got[len(got) // 2], 3) if got else None

    gpm: list[float | None] = []
    nvml: list[float | None] = []
    agent: list[float | None] = []
    running: list[float | None] = []
    waiting: list[float | None] = []
    api: list[float | None] = []
    for s in snaps:
        g = s.gpu(0)
        if g is not None and g.gpm is not None:
            gpm.append(g.gpm.graphics)
        if g is not None:
            nvml.append(g.utilization)
        if s.agent is not None:
            for a in s.agent.activity:
                if a.gpu == 0 and a.observed_ns:
                    agent.append(a.busy_ns / a.observed_ns)
        for e in s.engines:
            running.append(e.running)
            waiting.append(e.waiting)
            threads = [p.busiest_thread.cpu for p in e.api_servers if p.busiest_thread is not None]
            if threads:
                api.append(max(threads))
    return {"gpm_busy": med(gpm), "nvml_busy": med(nvml), "agent_busy": med(agent), "page_running": med(running),
            "page_waiting": med(waiting), "api_busiest_thread": med(api)}  # fmt: skip


def said(ticks: list[Tick]) -> str:
    """Return what boundwatch said most often, with its share."""
    if not ticks:
        return "-"
    counts = collections.Counter((t.verdict, t.reasons[:2]) for t in ticks)
    (verdict, reasons), n = counts.most_common(1)[0]
    text = verdict + (f" ({', '.join(reasons)})" if reasons else "")
    return f"{text} {n / len(ticks):.0%}"


def run_schedule(
    args: argparse.Namespace, stack: Stack, quota: Quota, url: str, scenarios: list[Scenario]
) -> tuple[list[Segment], dict[str, Any], list[Snapshot]]:
    """Run every scenario while a Watch collects the daemon's Snapshots."""
    seconds = args.seconds * args.scale
    watch = Watch(url, len(scenarios) * (seconds + 25) + 30)
    segments: list[Segment] = []
    notes: dict[str, Any] = {}
    try:
        for i, sc in enumerate(scenarios):
            notes[sc.name] = switch(stack, quota, sc, args, url)
            if i == 0 and sc.load != "idle":
                # Unscored: the first clients' requests reach a cold engine at once (GPU ~0.97 busy for
                # ~8 s on the H200), a burst the field's steady state never shows.
                time.sleep(WARMUP_SECONDS)
            start = time.time()
            reason = sc.expected_reason(args.agent)
            exp = sc.verdict + (f" {reason}" if reason else "")
            log(f"scenario {sc.name}: {sc.servers} API servers, {sc.load} x{sc.clients}, {sc.mode}, "
                f"quota {sc.quota or '-'} for {seconds:g} s (expect {exp}) {notes[sc.name]}")  # fmt: skip
            time.sleep(seconds)
            segments.append(Segment(sc.name, sc.verdict, reason, start, time.time()))
        if quota.active:
            quota.leave()
    finally:
        watch.end()
    return segments, notes, watch.snaps


def analyse(
    segments: list[Segment], snaps: list[Snapshot], bins: list[dict[str, float]], api: list[tr.ApiSample]
) -> tuple[list[dict[str, Any]], list[list[Any]]]:
    """Score the verdicts and put the truth and what the daemon read beside each scenario."""
    ticks = [Tick(s.seq, s.at, v.verdict, tuple(v.reasons)) for s in snaps for v in s.verdicts if v.gpu == 0]
    rows = score(ticks, segments)
    per_tick: list[list[Any]] = []
    for row, seg in zip(rows, segments, strict=True):
        scored = [s for s in snaps if seg.start + 2.0 <= s.at < seg.end and s.dt > 0]
        truths = [tr.tick_truth(s.at, s.dt, bins, BIN_SECONDS, api) for s in scored]
        row["truth"] = tr.summarise(truths)
        row["truth_text"] = tr.describe(row["truth"])
        row["premise_failed"] = premise(seg.verdict, row["truth"])
        row["observed"] = observed(scored)
        row["said"] = said([t for t in ticks if seg.start + 2.0 <= t.at < seg.end])
        for s, t in zip(scored, truths, strict=True):
            v = next((v for v in s.verdicts if v.gpu == 0), None)
            per_tick.append(
                [s.seq, seg.name, round(t["busy"] or 0, 3), round(t["running"] or 0, 2),
                 round(t["waiting"] or 0, 2), [round(a, 2) for a in t["api_main"]],
                 v.verdict if v else None, list(v.reasons) if v else []]
            )  # fmt: skip
    return rows, per_tick


def write_recording(path: Path, snaps: list[Snapshot], meta: dict[str, Any]) -> None:
    """Write the Snapshots as a gzip recording (`boundwatch replay` reads it)."""
    with gzip.open(path, "wt", compresslevel=9) as fh:
        fh.write(codec.header(tick_seconds=0.5, lab=True, **meta) + "\n")
        for s in snaps:
            fh.write(codec.dumps(s) + "\n")


def parse(argv: list[str] | None) -> argparse.Namespace:
    """Return the lab's arguments."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--agent", choices=["none", "light", "cupti"], default="none")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"), help="results folder")
    p.add_argument("--name", default="", help="result file name (default scenarios-field[-cpu]-<agent>)")
    p.add_argument("--seconds", type=float, default=SECONDS, help="length of each scenario")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every scenario's length")
    p.add_argument(
        "--only",
        default="",
        help="comma-separated scenario names (default the field's seven, in order; light_load only when named)",
    )
    p.add_argument("--api-quota-cores", type=float, default=0.2)
    p.add_argument("--container-quota-cores", type=float, default=0.6)
    p.add_argument(
        "--us-per-token",
        type=float,
        default=0.0,
        help="API-server CPU per prompt token (default: what keeps the GPU --saturated-busy busy "
        "behind one saturated server, from the engine's calibrated step times)",
    )
    p.add_argument(
        "--saturated-busy",
        type=float,
        default=SATURATED_BUSY,
        help="the GPU busy share behind one saturated API server with long prompts",
    )
    p.add_argument(
        "--engine-json", default="", help="engine settings to override (JSON, see engine.DEFAULTS)"
    )
    p.add_argument(
        "--tree",
        default="",
        help="a checkout whose exporter/ the engine's agent and the daemon import (a before/after; the lab's "
        "own bench/ stays this tree's)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the lab and write the results."""
    args = parse(argv)
    name = args.name or f"scenarios-field-{'cpu-' if args.device == 'cpu' else ''}{args.agent}"
    only = [n for n in args.only.split(",") if n]
    scenarios = [sc for sc in SCENARIOS if not only or sc.name in only]
    scenarios += [sc for sc in EXTRA if sc.name in only]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bwlab-"))
    url = f"http://127.0.0.1:{(bw_port := free_port())}"
    quota = Quota(work)
    log(f"quota: {quota.mode}: {quota.detail}")
    tree = Path(args.tree).resolve() if args.tree else ROOT
    if not (tree / "exporter" / "__init__.py").is_file():
        raise SystemExit(f"--tree {args.tree}: no exporter/ package there")
    paths = ([str(tree)] if tree != ROOT else []) + [str(ROOT), os.environ.get("PYTHONPATH", "")]
    # the tree's exporter/ first, then this checkout's bench/ (no empty entry: it would add the cwd)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    env.update(PYTHONUNBUFFERED="1", BOUNDWATCH_AGENT_SOCKET=str(work / "agent.sock"))
    results: dict[str, Any] = {"name": name, "started": time.time(), "host": platform.node(), **gpu_info(),
                               "agent_mode": args.agent, "device": args.device, "tree": args.tree,
                               "daemon_env": {k: v for k, v in sorted(os.environ.items())
                                              if k.startswith("BOUNDWATCH_") and not any(w in k for w in SECRET_WORDS)}}  # fmt: skip
    stack: Stack | None = None
    daemon: subprocess.Popen[Any] | None = None
    try:
        stack = Stack(args, free_port(), work, env)
        log(f"engine ready: {stack.info}")
        results["engine"] = stack.info
        cost = args.us_per_token or long_prompt_cost(stack.info, args.saturated_busy)
        stack.send(f"cost {cost:.3f}")
        results["us_per_token"] = round(cost, 3)
        log(f"API-server cost: {cost:.3f} us per prompt token (target busy {args.saturated_busy})")
        quota.prepare(stack.pids())
        daemon = start_daemon(args, bw_port, {**env, **quota.daemon_env()}, work, tree=tree)
        wait_for("the daemon", lambda: daemon_answers(url), 60)
        wait_for("the daemon to find the API server", lambda: api_servers_seen(url, 1), 30)
        if args.agent != "none":
            try:
                wait_for("the agent", lambda: (s := latest(url)) and s.agent and s.agent.agents, 20)
            except TimeoutError as exc:
                log(f"warning: {exc}")
        snap = latest(url)
        results["daemon_sources"] = {s.name: s.up for s in snap.sources} if snap else {}
        results["agents"] = [asdict(a) for a in snap.agent.agents] if snap and snap.agent else []
        log(f"daemon sources: {results['daemon_sources']}; agents: {results['agents']}")
        sampler = ApiSampler(stack)
        segments, notes, snaps = run_schedule(args, stack, quota, url, scenarios)
        sampler.stop()
        stack.stop()
        bins = tr.read_bins(work / "serve" / "truth-engine.jsonl")
        rows, per_tick = analyse(segments, snaps, bins, sampler.rows)
        kept = [s for s in snaps if segments and segments[0].start - 1 <= s.at <= segments[-1].end + 1]
        schedule = [asdict(s) for s in segments]
        results.update(
            schedule=schedule, scenarios=[asdict(sc) for sc in scenarios], notes=notes,
            quota={"mode": quota.mode, "detail": quota.detail, "api_cores": args.api_quota_cores,
                   "container_cores": args.container_quota_cores},
            scores=rows, passed=passed(rows), verdict_ticks=len(per_tick), truth_ticks=per_tick,
            finished=time.time(),
        )  # fmt: skip
        rec = out / f"{name}.jsonl.gz"
        write_recording(rec, kept, {"schedule": schedule, "agent_mode": args.agent, "device": args.device})
        results["recording"] = rec.name
        results["recording_bytes"] = rec.stat().st_size
    except Exception as exc:
        import traceback

        results["error"] = "".join(traceback.format_exception(exc))[-4000:]
        log(f"failed: {exc!r}")
    finally:
        if stack is not None:
            stack.stop()
        if daemon is not None and daemon.poll() is None:
            daemon.terminate()
            try:
                daemon.wait(10)
            except subprocess.TimeoutExpired:
                daemon.kill()
        quota.remove()
        for log_name in ("serve.log", "daemon.out"):
            if (work / log_name).exists():
                results[f"{log_name.replace('.', '_')}_tail"] = (work / log_name).read_text()[-3000:]
    (out / f"{name}.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(table(results))
    ok = results.get("passed", {})
    return 0 if ok.get("every_scenario_right") else 1


def table(results: dict[str, Any]) -> str:
    """Return the scores as a Markdown table, with the issue's columns."""
    lines = [
        f"agent: {results.get('agent_mode')}",
        "| scenario | expected | truth: GPU busy, running / waiting, API main thread | right "
        "| NVML busy (GPM) | agent busy | what boundwatch said |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results.get("scores", []):
        o = r.get("observed", {})
        share = "-" if r["right_share"] is None else f"{r['right_share']:.0%}"
        if r.get("premise_failed"):
            share += f" (label's premise failed here: {r['premise_failed']})"

        def f(x: float | None) -> str:
            return "-" if x is None else f"{x:.2f}"

        lines.append(
            f"| {r['scenario']} | {r['expected']} | {r.get('truth_text', '-')} | {share} | "
            f"{f(o.get('nvml_busy'))} ({f(o.get('gpm_busy'))}) | {f(o.get('agent_busy'))} | {r.get('said', '-')} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
