"""The daemon's CPU beside processes that look like engines and never serve (a page read refused each time).

Any local user can start `python3 -c ... vllm serve m --port N`: discovery finds it as an engine (at
most 32 at once) and the daemon reads its page, refused, every tick. This bench starts `--engines`
such look-alikes, each on a port of its own with nothing listening, then each tree's daemon in turn
(alternating over `--rounds`), and reads the daemon's utime + stime over `--seconds` after
`--warmup`, with how many page reads it started (`boundwatch_engine_scrape_duration_seconds`
series as a check that it found them).

Run it in PID and network namespaces of its own, so that no other process on the machine is found
and no port is shared:

    unshare --pid --fork --mount-proc --net .venv/bin/python bench/down_engines.py \
        --trees /tmp/base,. --engines 32 --rounds 3 --out bench/results/down_engines.json
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """Return a process's utime + stime, s."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def metric_lines(port: int, prefix: str) -> list[str]:
    """Return the daemon's /metrics lines that start with `prefix`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return [ln for ln in r.read().decode().splitlines() if ln.startswith(prefix)]


def run_tree(tree: str, port: int, seconds: float, warmup: float) -> dict[str, object]:
    """Run one tree's daemon beside the look-alikes and return its CPU share and what it saw."""
    run_dir = tempfile.mkdtemp(prefix="bw-down-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOUNDWATCH")}
    env["PYTHONPATH"] = tree
    argv = [sys.executable, "-m", "exporter", "--port", str(port), "--address", "127.0.0.1", "--no-nvml"]
    argv += ["--agent-socket", os.path.join(run_dir, "agent.sock"), "--log-level", "error"]
    daemon = subprocess.Popen(argv, env=env, cwd=tree)
    try:
        time.sleep(warmup)
        c0, t0 = cpu_seconds(daemon.pid), time.monotonic()
        time.sleep(seconds)
        c1, t1 = cpu_seconds(daemon.pid), time.monotonic()
        engines = metric_lines(port, "boundwatch_engine_up{")
        over = metric_lines(port, 'boundwatch_source_over_bound{source="engine"}')
    finally:
        daemon.terminate()
        daemon.wait(timeout=10)
    return {
        "tree": tree,
        "cpu_share_of_core": round((c1 - c0) / (t1 - t0), 5),
        "engines_seen": len(engines),
        "engines_up": sum(1 for ln in engines if ln.endswith(" 1.0") or ln.endswith(" 1")),
        "over_bound": over[0].split()[-1] if over else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trees", default=".", help="comma-separated checkouts whose daemon runs in turn")
    ap.add_argument("--engines", type=int, default=32, help="look-alike engines started")
    ap.add_argument("--rounds", type=int, default=2, help="times through --trees, alternating")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--warmup", type=float, default=8.0, help="seconds from the daemon's start to the span")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if os.getpid() != 1 and not os.environ.get("BW_DOWN_ANY_NAMESPACE"):
        sys.exit("run under `unshare --pid --fork --mount-proc --net` (see the module's doc)")
    subprocess.run(["ip", "link", "set", "lo", "up"], check=False)
    trees = [os.path.abspath(t) for t in args.trees.split(",")]
    hold = "import time; time.sleep(3600)"
    fakes = [
        subprocess.Popen([sys.executable, "-c", hold, "vllm", "serve", "m", "--port", str(18000 + i)])
        for i in range(args.engines)
    ]
    rows: list[dict[str, object]] = []
    try:
        for r in range(args.rounds):
            order = trees if r % 2 == 0 else trees[::-1]
            for tree in order:
                row = run_tree(tree, 9600 + len(rows), args.seconds, args.warmup)
                row["round"] = r
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        for fake in fakes:
            fake.kill()
    summary = {
        t: statistics.median(float(row["cpu_share_of_core"]) for row in rows if row["tree"] == t) * 100  # type: ignore[arg-type]
        for t in trees
    }
    result = {"bench": "down_engines", "engines": args.engines, "rows": rows, "median_pct_by_tree": summary}
    print(json.dumps({"median_pct_by_tree": summary}))
    if args.out:
        with open(args.out, "w") as out:
            json.dump(result, out, indent=1)


if __name__ == "__main__":
    main()
