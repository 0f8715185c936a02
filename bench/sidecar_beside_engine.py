"""The daemon's own CPU and memory beside a serving engine, with real NVML, scraped every 15 s.

One lab engine (bench/scenarios: a `VLLM::EngineCore` with CUDA graphs, 4 `VLLM::APIServer_<i>`
processes, 32 clients, a full batch) serves while the real daemon runs beside it with its defaults
(discovery, NVML, /proc, cgroups, the engine's page, the agent socket). After a warm-up, the
daemon's utime + stime and RSS are read from /proc over `--seconds`, while /metrics is scraped
every `--scrape-every` seconds as Prometheus would (gzip). Also reported: the daemon's NVML read
time per tick (`boundwatch_source_duration_seconds{source="nvml"}`).

    python3 bench/sidecar_beside_engine.py --out bench/results/sidecar_beside_engine_h200.json
    python3 bench/sidecar_beside_engine.py --trees .side-base,. --rounds 2 --seconds 45   # before/after, paired
    python3 bench/sidecar_beside_engine.py --trees .,.+BOUNDWATCH_NVML__GRAPHICS_ESTIMATE=true --rounds 2
    python3 bench/sidecar_beside_engine.py --trees .,floor,floor:nvml,floor:engine,floor:procs,floor:none

With `--trees`, each checkout's daemon runs in turn beside the one engine (same machine, same load),
so a change's effect is a ratio taken in one run. A tree given as `PATH+KEY=VALUE[+...]` runs its
daemon with those variables set (a setting that only one side knows: an older tree refuses it).
`floor[:PARTS]` runs bench/read_floor.py in the daemon's place instead: the same inputs (NVML, the
engine's page, the API servers' /proc and cgroup files; PARTS of `nvml,engine,procs,none`) read at the
same cadence by one bare thread, so the daemon's CPU less the floor's is what the daemon's own design
costs (no scrapes: the floor serves nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.scenarios import lab  # noqa: E402
from exporter.commands._live import daemon_answers  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """Return a process's utime + stime in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def thread_cpu(pid: int) -> dict[str, float]:
    """Return each thread's utime + stime in seconds, by thread name (names shared are summed)."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            comm = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[comm] = out.get(comm, 0.0) + (int(fields[11]) + int(fields[12])) / TICKS
    return out


def rss_mib(pid: int) -> float:
    """Return a process's resident set in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def scrape(url: str) -> tuple[int, dict[str, float]]:
    """Scrape /metrics with gzip; return the bytes on the wire and each source's last read time."""
    req = urllib.request.Request(url + "/metrics", headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        body = resp.read()
    import gzip

    text = gzip.decompress(body).decode() if body[:2] == b"\x1f\x8b" else body.decode()
    reads: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith('boundwatch_source_duration_seconds{source="'):
            reads[line.split('"')[1]] = float(line.rsplit(" ", 1)[1])
    return len(body), reads


def measure_floor(
    args: argparse.Namespace, env: dict[str, str], spec: str, stack: lab.Stack
) -> dict[str, Any]:
    """Run bench/read_floor.py (`floor[:PARTS]`) beside the serving engine in the daemon's place; measure it."""
    parts = spec.partition(":")[2] or "nvml,engine,procs"
    if args.device == "cpu":  # no NVML here: the lab's stand-in answers for the GPU
        parts = ",".join(x for x in parts.split(",") if x != "nvml") or "none"
    cmd = [sys.executable, str(ROOT / "bench/read_floor.py"), "--parts", parts, "--report", "3600",
           "--engine-url", f"http://127.0.0.1:{stack.port}/metrics", "--pids", ",".join(map(str, stack.api_pids))]  # fmt: skip
    floor = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=ROOT, text=True
    )
    try:
        time.sleep(args.warmup)
        c0, t0 = cpu_seconds(floor.pid), time.monotonic()
        time.sleep(args.seconds)
        c1, t1 = cpu_seconds(floor.pid), time.monotonic()
        r1 = rss_mib(floor.pid)
    finally:
        floor.terminate()
        out, _ = floor.communicate(timeout=10)
    last = (
        json.loads(out.strip().splitlines()[-1]) if out.strip().startswith("{") else {"output": out[-2000:]}
    )
    return {
        "tree": spec,
        "seconds": round(t1 - t0, 2),
        "daemon_cpu_share": round((c1 - c0) / (t1 - t0), 5),
        "rss_mib": [r1, r1],
        "floor_parts": parts,
        "floor_last": last,
    }


def measure(
    args: argparse.Namespace,
    url: str,
    port: int,
    env: dict[str, str],
    work: Path,
    spec: str,
    stack: lab.Stack | None = None,
) -> dict[str, Any]:
    """Start the daemon of one tree (`PATH[+KEY=VALUE...]`) beside the serving engine, measure it, stop it."""
    if spec == "floor" or spec.startswith("floor:"):
        assert stack is not None, "a floor reads the engine's page and API servers: it needs the stack"
        return measure_floor(args, env, spec, stack)
    path, *assigned = spec.split("+")
    tree = (ROOT / path).resolve()
    env = {**env, **dict(a.split("=", 1) for a in assigned)}
    if args.cost_stats:  # the same daemon, its parts timed (bench/sidecar_cost.py's BW_COST_STATS)
        stats = f"{args.cost_stats}.{tree.name or 'tree'}"
        denv = {**env, "PYTHONPATH": f"{tree}{os.pathsep}{env['PYTHONPATH']}", "BW_COST_STATS": stats}
        daemon = subprocess.Popen(
            [sys.executable, str(ROOT / "bench/sidecar_cost.py"), "--part", "daemon", "--port", str(port),
             "--sock", env["BOUNDWATCH_AGENT_SOCKET"], "--gpus", "0"],
            stdout=open(work / "daemon.out", "a"), stderr=subprocess.STDOUT, env=denv, cwd=tree,
        )  # fmt: skip
    else:
        daemon = lab.start_daemon(args, port, env, work, tree=tree)
    try:
        lab.wait_for("the daemon", lambda: daemon_answers(url), 60)
        time.sleep(args.warmup)
        th0 = thread_cpu(daemon.pid)
        c0, r0, t0 = cpu_seconds(daemon.pid), rss_mib(daemon.pid), time.monotonic()
        sizes, reads = [], []
        while time.monotonic() - t0 < args.seconds:
            size, n = scrape(url)
            sizes.append(size)
            reads.append(n)
            time.sleep(max(0.0, min(args.scrape_every, args.seconds - (time.monotonic() - t0))))
        c1, r1, t1 = cpu_seconds(daemon.pid), rss_mib(daemon.pid), time.monotonic()
        th1 = thread_cpu(daemon.pid)
        snap = lab.latest(url)
        text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    finally:
        if daemon.poll() is None:
            daemon.terminate()
            daemon.wait(10)
    estimated = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("boundwatch_gpu_graphics_active_estimated{")
    ]
    return {
        "tree": spec,
        "seconds": round(t1 - t0, 2),
        "daemon_cpu_share": round((c1 - c0) / (t1 - t0), 5),
        "rss_mib": [round(r0, 1), round(r1, 1)],
        "scrapes": len(sizes),
        "gzip_bytes": sizes[-1] if sizes else None,
        "nvml_read_seconds": [r.get("nvml", 0.0) for r in reads],
        "source_read_ms_median": {
            k: round(1e3 * statistics.median(r[k] for r in reads if k in r), 3)
            for k in sorted({k for r in reads for k in r})
        },
        "thread_cpu_share": {  # utime + stime over the window, by thread name (the readers name theirs)
            k: round((th1[k] - th0.get(k, 0.0)) / (t1 - t0), 5) for k in sorted(th1)
        },
        "graphics_estimated_at_end": estimated,
        "busy": {v.gpu: (v.verdict, v.busy_ratio, v.busy_source) for v in snap.verdicts} if snap else {},
        "engines": [(e.name, len(e.api_servers)) for e in snap.engines] if snap else [],
        "sources": {s.name: s.up for s in snap.sources} if snap else {},
    }


def main(argv: list[str] | None = None) -> int:
    """Run the engine and the daemon (each tree's in turn), measure the daemon, write JSON."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--warmup", type=float, default=15.0)
    p.add_argument("--scrape-every", type=float, default=15.0)
    p.add_argument(
        "--trees",
        default=".",
        help="comma-separated checkouts whose daemon runs in turn beside the one engine (. = this one), "
        "e.g. .side-base,. for a before/after pair on the same machine and load; PATH+KEY=VALUE sets a "
        "variable for that tree's daemon (.,.+BOUNDWATCH_NVML__GRAPHICS_ESTIMATE=true: one setting off and on)",
    )
    p.add_argument("--rounds", type=int, default=1, help="times through --trees, alternating")
    p.add_argument(
        "--cost-stats",
        default="",
        help="PATH: run each daemon with its parts timed (BW_COST_STATS of bench/sidecar_cost.py, real NVML), "
        "written to PATH.<tree>.0 (read with bench/cost_stats.py); the timing adds CPU, so not for the headline "
        "(with --device cpu the daemon then has no NVML stand-in)",
    )
    p.add_argument("--out", default=str(ROOT / "bench/results/sidecar_beside_engine.json"))
    args = p.parse_args(argv)
    trees = args.trees.split(",")
    work = Path(tempfile.mkdtemp(prefix="bwside-"))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.update(PYTHONUNBUFFERED="1", BOUNDWATCH_AGENT_SOCKET=str(work / "agent.sock"))
    stack_args = argparse.Namespace(device=args.device, agent="light", us_per_token=2.5, engine_json="")
    url = f"http://127.0.0.1:{(port := lab.free_port())}"
    result: dict[str, Any] = {
        "bench": "sidecar_beside_engine",
        **lab.gpu_info(),
        "scrape_every": args.scrape_every,
        "trees": trees,
    }
    stack = None
    runs: list[dict[str, Any]] = []
    try:
        stack = lab.Stack(stack_args, lab.free_port(), work, env)
        stack.send("servers 4")
        stack.send("load short 32 -")
        for _ in range(args.rounds):
            for tree in trees:
                runs.append(measure(args, url, port, env, work, tree, stack))
                print(
                    json.dumps(
                        {k: runs[-1].get(k) for k in ("tree", "daemon_cpu_share", "source_read_ms_median")}
                    )
                )
        result.update(runs[0] if len(runs) == 1 else {"runs": runs})
        if len(trees) > 1:
            result["cpu_share_by_tree"] = {
                t: [r["daemon_cpu_share"] for r in runs if r["tree"] == t] for t in trees
            }
            result["ratio_last_over_first_by_round"] = [
                round(runs[i + len(trees) - 1]["daemon_cpu_share"] / runs[i]["daemon_cpu_share"], 3)
                for i in range(0, len(runs), len(trees))
                if runs[i]["daemon_cpu_share"] > 0
            ]
    except Exception as exc:
        import traceback

        result["error"] = "".join(traceback.format_exception(exc))[-3000:]
        if runs:
            result["runs"] = runs
    finally:
        if stack is not None:
            stack.stop()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(
        json.dumps({k: v for k, v in result.items() if k not in ("error", "runs")}),
        result.get("error", "")[-1500:],
    )
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    raise SystemExit(main())
