"""Soak: the real daemon for an hour with 8 GPUs of agent windows, 4 API servers and a changing engine page.

The parts are bench/sidecar_cost.py's, imported and run as their own processes, all in a PID
namespace of its own (re-executed under `unshare --pid --fork --mount-proc`), so discovery sees
only the soak's processes:
- an engine started as `vllm serve --port P` serving a real-size vLLM page whose counters move
  every 0.5 s, with 4 children titled `VLLM::APIServer_<i>` (`part_engine`);
- an agent stand-in sending 8 GPUs' windows over the real wire to the daemon's socket as 8
  workers' agents would: aligned, consecutive 0.5 s windows, closed 1 s after their end
  (`part_agent`); it counts what it sent, so the report can set the daemon's received and
  refused counts beside it;
- the daemon (`serve()` with every source, NVML the tests' stand-in for 8 GPUs; `part_daemon`).
The daemon's VmRSS and utime+stime are read from /proc every `--sample-every` s and its /metrics
is scraped every `--scrape-every` s (as Prometheus would, gzip). The report: RSS at 5 minutes and
at the end, the growth after the first 5 minutes (goal < 5 MB), the mean CPU share of one core,
ticks/s from `boundwatch_ticks_total`, scrape latency and errors, and what the feed refused, by
reason. The JSON is rewritten every minute, so a run cut short still leaves its numbers; every
loop ends at `--minutes`. Each run has a socket directory of its own: two soaks at once never
share a socket. (The 51-minute soak's daemon received 24.8 datagrams/s where one stand-in sends
16 at most; its 27,736 `overlap` refusals match the excess: a second stand-in, of another soak
sharing `/tmp/bw-soak-1` (pid 1 in every namespace), sending the same agents' windows.)

    python bench/soak.py --minutes 60 --out bench/results/soak.json
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.sidecar_cost import (  # noqa: E402
    cpu_seconds,
    free_port,
    part_agent,
    part_daemon,
    part_engine,
    pct,
    rss_bytes,
    start_engine,
    stop_parts,
    wait_port,
)

GPUS = 8
WARMUP_S = 300.0
MIB = 2**20
# summed over their labels on each scrape; the last scrape's values go in the report
WATCH = (
    "boundwatch_ticks_total",
    "boundwatch_agents",
    "boundwatch_agent_messages_total",
    "boundwatch_agent_bad_messages_total",
    "boundwatch_agent_refused_total",
    "boundwatch_engine_api_servers",
    "boundwatch_engine_up",
    "boundwatch_engine_page_refused_total",
)
BY_REASON = "boundwatch_agent_refused_total"  # also kept per reason


def scrape_once(port: int) -> dict[str, Any]:
    """Scrape /metrics once; return latency, bytes, series and the tick counter (or the error)."""
    t = time.perf_counter()
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
        r = c.getresponse()
        body = r.read()
        status = r.status
        enc = r.getheader("Content-Encoding", "")
        c.close()
    except (OSError, http.client.HTTPException) as exc:
        return {"error": repr(exc)}
    dt = time.perf_counter() - t
    if status != 200:
        return {"error": f"HTTP {status}"}
    text = gzip.decompress(body) if enc == "gzip" else body
    series = 0
    gpus_seen = 0
    seen: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith(b"#"):
            continue
        series += 1
        name = line.split(b"{", 1)[0].split(b" ", 1)[0].decode()
        if name in WATCH:
            value = float(line.rsplit(b" ", 1)[1])
            seen[name] = seen.get(name, 0.0) + value
            if name == BY_REASON and b'reason="' in line:
                reason = line.split(b'reason="', 1)[1].split(b'"', 1)[0].decode()
                seen[f"{name}:{reason}"] = value
        if name == "boundwatch_gpu_power_watts":
            gpus_seen += 1
    ticks = seen.pop("boundwatch_ticks_total", None)
    return {
        "latency": dt,
        "bytes": len(body),
        "series": series,
        "ticks": ticks,
        "gpus": gpus_seen,
        "watch": seen,
    }


def start_parts(me: str, eng_port: int, bw_port: int, sock_path: str) -> list[subprocess.Popen[bytes]]:
    """Start the engine, the daemon and (once it listens) the agent; return them, daemon second."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOUNDWATCH")}
    env["PYTHONPATH"] = ROOT
    env["BW_PY"] = sys.executable
    engine = start_engine(os.path.dirname(sock_path), eng_port, env)
    daemon = subprocess.Popen(
        [sys.executable, me, "--part", "daemon", "--port", str(bw_port), "--sock", sock_path],
        env=env,
    )
    procs = [engine, daemon]
    if wait_port(bw_port):
        procs.append(
            subprocess.Popen(
                [sys.executable, me, "--part", "agent", "--sock", sock_path, "--count", sent_path(sock_path)],
                env=env,
            )
        )
    return procs


def sent_path(sock_path: str) -> str:
    """Return where the agent stand-in writes what it sent."""
    return os.path.join(os.path.dirname(sock_path), "agent-sent.json")


def read_sent(sock_path: str) -> dict[str, int]:
    """Return the agent stand-in's counts of what it sent (empty before its first write)."""
    try:
        with open(sent_path(sock_path)) as f:
            return {k: int(v) for k, v in json.load(f).items()}
    except (OSError, ValueError):
        return {}


def summarise(
    samples: list[dict[str, Any]], scrapes: list[dict[str, Any]], meta: dict[str, Any]
) -> dict[str, Any]:
    """Reduce the samples and scrapes to the report's numbers."""
    out: dict[str, Any] = dict(meta)
    if not samples:
        return out
    first, last = samples[0], samples[-1]
    span = last["t"] - first["t"]
    at5 = next((s for s in samples if s["t"] >= WARMUP_S), None)
    out["seconds"] = round(last["t"], 1)
    out["rss_mib_start"] = round(first["rss"] / MIB, 2)
    out["rss_mib_end"] = round(last["rss"] / MIB, 2)
    out["rss_mib_max"] = round(max(s["rss"] for s in samples) / MIB, 2)
    if at5 is not None:
        after = [s for s in samples if s["t"] >= WARMUP_S]
        out["rss_mib_at_5min"] = round(at5["rss"] / MIB, 2)
        out["rss_growth_mb_after_5min"] = round((last["rss"] - at5["rss"]) / 1e6, 3)
        out["rss_max_growth_mb_after_5min"] = round((max(s["rss"] for s in after) - at5["rss"]) / 1e6, 3)
        out["growth_goal_mb"] = 5.0
        out["growth_within_goal"] = out["rss_max_growth_mb_after_5min"] < 5.0
        if last["t"] > at5["t"]:
            cpu_after = (last["cpu"] - at5["cpu"]) / (last["t"] - at5["t"])
            out["cpu_share_of_core_after_5min"] = round(cpu_after, 5)
    if span > 0:
        out["cpu_share_of_core_mean"] = round((last["cpu"] - first["cpu"]) / span, 5)
    good = [s for s in scrapes if "error" not in s]
    ticked = [s for s in good if s.get("ticks") is not None]
    if len(ticked) >= 2 and ticked[-1]["t"] > ticked[0]["t"]:
        out["ticks_per_second"] = round(
            (ticked[-1]["ticks"] - ticked[0]["ticks"]) / (ticked[-1]["t"] - ticked[0]["t"]), 4
        )
    out["scrapes"] = len(scrapes)
    out["scrape_errors"] = [s["error"] for s in scrapes if "error" in s][:20]
    out["scrape_error_count"] = len(scrapes) - len(good)
    if good:
        lat = [s["latency"] for s in good]
        out["scrape_ms_median"] = round(pct(lat, 0.5) * 1e3, 2)
        out["scrape_ms_p99"] = round(pct(lat, 0.99) * 1e3, 2)
        out["scrape_ms_max"] = round(max(lat) * 1e3, 2)
        out["metrics_series_last"] = good[-1]["series"]
        out["metrics_gzip_bytes_last"] = good[-1]["bytes"]
        out["gpus_on_page_min"] = min(s["gpus"] for s in good)
        last_watch = dict(good[-1]["watch"])
        out["agent_refused_by_reason"] = {
            k.split(":", 1)[1]: v for k, v in last_watch.items() if k.startswith(BY_REASON + ":")
        }
        out["last_scrape"] = {k: v for k, v in last_watch.items() if ":" not in k}
        if good[-1].get("sent"):
            out["standin_sent_at_last_scrape"] = good[-1]["sent"]
    out["rss_mib_by_minute"] = [
        round(s["rss"] / MIB, 2) for s in samples if int(s["t"]) % 60 < 10 or s is last
    ]
    return out


def write(path: str, report: dict[str, Any]) -> None:
    """Write the report atomically, if a path was given."""
    if not path:
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def soak(minutes: float, sample_every: float, scrape_every: float, out_path: str) -> dict[str, Any]:
    """Run the parts for `minutes`, sampling and scraping; return the report."""
    me = os.path.abspath(__file__)
    eng_port, bw_port = free_port(), free_port()
    # pid 1 in the namespace: a directory named after the pid would be every soak's
    sock_dir = tempfile.mkdtemp(prefix="bw-soak-")
    os.chmod(sock_dir, 0o755)
    sock_path = os.path.join(sock_dir, "agent.sock")
    meta: dict[str, Any] = {
        "argv": sys.argv[1:],
        "minutes_asked": minutes,
        "gpus": GPUS,
        "api_servers": 4,
        "sample_every_s": sample_every,
        "scrape_every_s": scrape_every,
        "cpus": os.cpu_count(),
        "machine": platform.node(),
        "python": platform.python_version(),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    procs = start_parts(me, eng_port, bw_port, sock_path)
    daemon = procs[1]
    samples: list[dict[str, Any]] = []
    scrapes: list[dict[str, Any]] = []
    try:
        if len(procs) < 3:
            meta["error"] = "daemon did not listen"
            return meta
        t0 = time.monotonic()
        end = t0 + minutes * 60.0
        next_sample, next_scrape, next_write = t0, t0 + 1.0, t0 + 60.0
        while time.monotonic() < end:
            if any(p.poll() is not None for p in procs):
                meta["error"] = f"a part exited: {[p.poll() for p in procs]}"
                break
            now = time.monotonic()
            if now >= next_sample:
                samples.append({"t": now - t0, "rss": rss_bytes(daemon.pid), "cpu": cpu_seconds(daemon.pid)})
                next_sample += sample_every
            if now >= next_scrape:
                sent = read_sent(sock_path)  # written every 5 s: a few seconds behind the scrape
                s = scrape_once(bw_port)
                s["t"] = time.monotonic() - t0
                s["sent"] = sent
                scrapes.append(s)
                next_scrape += scrape_every
            if now >= next_write:
                write(out_path, dict(summarise(samples, scrapes, meta), partial=True))
                next_write += 60.0
            time.sleep(max(0.05, min(next_sample, next_scrape, end) - time.monotonic()))
        samples.append(
            {"t": time.monotonic() - t0, "rss": rss_bytes(daemon.pid), "cpu": cpu_seconds(daemon.pid)}
        )
    finally:
        stop_parts(procs, sock_dir)
    meta["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    report = summarise(samples, scrapes, meta)
    write(out_path, report)
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=60.0, help="how long to soak")
    ap.add_argument("--sample-every", type=float, default=10.0, help="RSS/CPU sample period, s")
    ap.add_argument("--scrape-every", type=float, default=15.0, help="/metrics scrape period, s")
    ap.add_argument("--out", default="", help="JSON report path (rewritten every minute)")
    ap.add_argument("--part", default="", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--sock", default="", help=argparse.SUPPRESS)
    ap.add_argument("--count", default="", help=argparse.SUPPRESS)
    args, _rest = ap.parse_known_args()
    if args.part == "engine":
        part_engine(args.port)
        return 0
    if args.part == "agent":
        part_agent(args.sock, GPUS, args.count)
        return 0
    if args.part == "daemon":
        part_daemon(args.port, args.sock, GPUS)
        return 0
    if os.getpid() != 1 and os.environ.get("BW_SOAK_NS") != "1":
        if not shutil.which("unshare") or os.geteuid() != 0:
            print("needs root and unshare(1) for a PID namespace of its own", file=sys.stderr)
            return 2
        env = dict(os.environ, BW_SOAK_NS="1")
        return subprocess.call(
            ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, *sys.argv], env=env
        )
    if args.out:
        args.out = os.path.abspath(args.out)
    report = soak(args.minutes, args.sample_every, args.scrape_every, args.out)
    print(json.dumps({k: v for k, v in report.items() if k != "rss_mib_by_minute"}), flush=True)
    return 1 if "error" in report else 0


if __name__ == "__main__":
    raise SystemExit(main())
