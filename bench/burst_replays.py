"""A graph engine whose work comes in bursts: does the light agent send every replay, and how long is it silent?

One process per run (a fresh agent): the lab's stand-in CUDA graphs (bench/scenarios/cpugraphs, torch
2.x's shape) replayed by a loop that drives the agent as a torch engine with no step hook does, the
agent's messages received on a socket of its own. Patterns:
- `slow`: a request's 1-12 steps, 25-60 ms apart, then 0-0.8 s with none, for 20 s;
- `fast`: 4 s of steady steps 4.5 ms apart, 3 s eager (no replay), then 12 s of 3-15 steps 4.5 ms apart
  with 0-0.8 s between bursts (what is scored is that last part);
- `sparse`: a request's 1-6 steps, 25-60 ms apart, then 0.5-2.5 s with none, for 30 s (as the lab's
  engine behind API servers under a 0.05-core quota each: the agent goes quiet between bursts).
For each seed: replays made (in the scored part and in the whole run) and sent (the whole run),
messages in the scored part, and the longest stretch there with a replay made and no message (the sidecar reads a light agent silent past its silent_ms, 1.25 s, as quiet); and, for each
burst that resumes a quiet agent, how long from its first replay to the agent's next message that is
not quiet (`resume_lag_*`) and the replays made meanwhile, which the sidecar reads as none.

    .venv/bin/python bench/burst_replays.py --pattern slow,fast --seeds 1,2,3 [--tree /tmp/base] --out F.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# pattern -> (seconds scored, steps a burst (low, high), seconds between bursts (low, high))
PATTERNS = {
    "fast": (12.0, (3, 15), (0.0, 0.8)),
    "slow": (20.0, (1, 12), (0.0, 0.8)),
    "sparse": (30.0, (1, 6), (0.5, 2.5)),
}


def child(pattern: str, seed: int) -> dict[str, Any]:
    """Run one pattern in this process (the agent started here) and return what was made and sent."""
    from bench.scenarios import cpugraphs

    cuda = cpugraphs.install()
    from exporter import agent, wire
    from exporter.agent import hooks

    t0 = time.monotonic()
    got: list[tuple[float, str, int]] = []
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(os.environ["BOUNDWATCH_AGENT_SOCKET"])

    def receive() -> None:
        while True:
            m = wire.decode(rx.recv(wire.MAX_DATAGRAM_BYTES))
            got.append((time.monotonic() - t0, m.state, m.graphs.replays if m.graphs else 0))

    threading.Thread(target=receive, daemon=True).start()
    agent.start(role="generic")
    g = cpugraphs.capture(cuda, (8,))[8]
    rng = random.Random(seed)
    made: list[float] = []
    scored_from = 0.0
    steady = 0
    if pattern == "fast":
        end = time.monotonic() + 4.0
        while time.monotonic() < end:
            g.replay()
            steady += 1
            time.sleep(0.0045)
        time.sleep(3.0)
        scored_from = time.monotonic() - t0
    seconds, steps, idle = PATTERNS[pattern]
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(rng.randint(*steps)):
            g.replay()
            made.append(time.monotonic() - t0)
            time.sleep(0.0045 if pattern == "fast" else rng.uniform(0.025, 0.06))
        time.sleep(rng.uniform(*idle))
    scored_to = time.monotonic() - t0
    time.sleep(2.0)
    times = [t for t, _, _ in got if t > scored_from]
    edges = [scored_from, *times, scored_to]
    silence = max((b - a for a, b in itertools.pairwise(edges) if any(a < t < b for t in made)), default=0.0)
    lags = resume_lags(made, got)
    return {
        "pattern": pattern,
        "seed": seed,
        "replays_made": len(made),
        "replays_made_whole_run": steady + len(made),
        "replays_sent_whole_run": sum(r for _, _, r in got),
        "messages": len(times),
        "quiet_messages": sum(1 for t, s, _ in got if s == "quiet" and t > scored_from),
        "longest_silence_with_replays_s": round(silence, 3),
        "resumes": len(lags),
        "replays_read_quiet": sum(n for _, n in lags),
        "resume_lag_max_s": round(max((lag for lag, _ in lags), default=0.0), 4),
        "resume_lag_median_s": round(sorted(lag for lag, _ in lags)[len(lags) // 2], 4) if lags else 0.0,
        "replays_exact": getattr(hooks, "replays_exact", lambda: None)(),
    }


def resume_lags(made: list[float], got: list[tuple[float, str, int]]) -> list[tuple[float, int]]:
    """Return, for each first replay after a quiet message, how long until the agent's next other message, and the replays made meanwhile.

    Over that stretch the sidecar still reads the agent quiet and counts its silence as no replay
    (exporter.sources.agent_feed), so the page's steps of those replays read as eager.
    """
    out: list[tuple[float, int]] = []
    msgs = sorted((t, state) for t, state, _ in got)
    i = 0
    quiet = False  # the agent's last message said quiet
    pending: list[float] = []
    for t in sorted(made):
        while i < len(msgs) and msgs[i][0] <= t:
            at, state = msgs[i]
            i += 1
            if state == "quiet":
                quiet = True
            elif quiet:
                if pending:
                    out.append((at - pending[0], len(pending)))
                quiet, pending = False, []
        if quiet:
            pending.append(t)
    if pending and i < len(msgs):
        out.append((msgs[i][0] - pending[0], len(pending)))
    return out


def main() -> int:
    """Run each pattern and seed in a fresh process (from --tree's exporter/) and write the results."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pattern", default="slow,fast")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--tree", default="", help="a checkout whose exporter/ the agent imports (a before/after)")
    p.add_argument("--out", default="")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]))))
        return 0
    tree = str(Path(args.tree).resolve()) if args.tree else str(ROOT)
    rows = []
    for pattern in args.pattern.split(","):
        for seed in (int(x) for x in args.seeds.split(",")):
            with tempfile.TemporaryDirectory() as tmp:
                env = {k: v for k, v in os.environ.items() if not k.startswith("BOUNDWATCH")}
                env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([tree, str(ROOT)]))
                env["BOUNDWATCH_AGENT_SOCKET"] = f"{tmp}/agent.sock"
                r = subprocess.run(
                    [sys.executable, __file__, "--child", pattern, str(seed)],
                    env=env, capture_output=True, text=True, timeout=120, check=True,
                )  # fmt: skip
                row = json.loads(r.stdout.strip().splitlines()[-1])
            print(json.dumps(row))
            rows.append(row)
    if args.out:
        Path(args.out).write_text(json.dumps({"tree": tree, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
