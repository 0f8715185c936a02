"""CPU of the agent datagram path per datagram, per source tree: the socket's receive, the feed's handling, and the decoder.

For each tree (run in a fresh process each, rounds alternating), binds a real `AgentFeed` socket in a
temporary directory, sends it `--gpus` agents' datagrams (the sidecar_cost stand-in's: one window,
100 intervals, one agent per GPU, windows on the 0.5 s grid) and times, in process CPU:
- `receive`: `unixsock.receive` of the waiting datagrams (with credentials),
- `readable`: the feed's whole `_readable` (receive, allow-list, decode, `_take`),
- `decode`: `wire.decode` of the same bytes alone,
- `collect`: one `collect()` after each batch (the tick's hand-out),
each per datagram in us, the 10th percentile of `--reps` batches. `readable - decode` is what the path costs beyond
the decoder. Results go to `--out` (JSON) and a table on stdout.

    .venv/bin/python bench/datagram_path_ab.py /tmp/c10/base,. --rounds 4 --out bench/results/datagram_path_ab.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, os, socket, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
from exporter import wire
from exporter.config import AgentFeedConfig
from exporter.sources import unixsock
from exporter.sources.agent_feed import AgentFeed

gpus, batches = int(sys.argv[2]), int(sys.argv[3])
d = tempfile.mkdtemp(prefix="bw-dg-")
os.chmod(d, 0o755)
path = os.path.join(d, "agent.sock")
W = 500_000_000
t_base = time.time_ns() - 2 * W
t_base -= t_base % W
now = [t_base]  # the feed's wall clock follows the windows (one batch a window), as in the daemon
feed = AgentFeed(AgentFeedConfig(socket=path), merge_wait_s=0.0, wall_ns=lambda: now[0])
feed._bind(path)
tx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
seq = [0] * gpus

def datagrams(k):
    out = []
    t0 = t_base + k * W
    now[0] = t0 + W + 1_000_000_000
    for g in range(gpus):
        iv = wire.pack_intervals([(t0 + j * 5_000_000, t0 + j * 5_000_000 + 4_000_000) for j in range(100)], t0)[0]
        w = wire.Window(dev=0, t0=t0, t1=t0 + W, busy=400_000_000, kernels=8000, graphs=100, iv=iv)
        seq[g] += 1
        msg = wire.Message(pid=10_000 + g, state="running", seq=seq[g], role="vllm_worker",
                           devices=((0, f"GPU-00000000-0000-0000-0000-{g:012d}"),), windows=(w,))
        out.append(wire.encode(msg))
    return out

res = {"receive": [], "readable": [], "decode": [], "collect": []}
k = 0
for b in range(batches):
    # receive alone (the datagrams then go to the feed by hand, so the feed's state moves on as in the daemon)
    data = datagrams(k); k += 1
    for x in data:
        tx.sendto(x, path)
    c = time.process_time()
    got = unixsock.receive(feed._sock, wire.MAX_DATAGRAM_BYTES)
    res["receive"].append((time.process_time() - c) / len(got))
    for x, peer, _ in got:
        feed.receive(x, peer)
    feed.collect()
    # the whole _readable
    data = datagrams(k); k += 1
    for x in data:
        tx.sendto(x, path)
    c = time.process_time()
    feed._readable()
    res["readable"].append((time.process_time() - c) / len(data))
    c = time.process_time()
    feed.collect()
    res["collect"].append((time.process_time() - c) / len(data))
    c = time.process_time()
    for x in data:
        wire.decode(x)
    res["decode"].append((time.process_time() - c) / len(data))
feed.close()
print(json.dumps({k: sorted(v)[len(v) // 10] * 1e6 for k, v in res.items()}))  # 10th percentile, us
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trees", help="source trees, comma-separated (before,after)")
    ap.add_argument(
        "--gpus",
        type=int,
        default=8,
        help="agents (one datagram each per batch; at most the socket queue, net.unix.max_dgram_qlen)",
    )
    ap.add_argument("--reps", type=int, default=200, help="batches per round")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    trees = [os.path.abspath(t) for t in args.trees.split(",")]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "child.py")
        with open(script, "w") as f:
            f.write(CHILD)
        for r in range(args.rounds):
            order = trees if r % 2 == 0 else trees[::-1]
            for tree in order:
                out = subprocess.run(
                    [sys.executable, script, tree, str(args.gpus), str(args.reps)],
                    capture_output=True,
                    text=True,
                    check=True,
                    env=dict(os.environ, PYTHONPATH=tree),
                )
                row = {"tree": tree, "round": r, **json.loads(out.stdout.strip().splitlines()[-1])}
                rows.append(row)
                print(
                    f"round {r} {tree}: receive {row['receive']:.1f} readable {row['readable']:.1f} "
                    f"decode {row['decode']:.1f} beyond decoder {row['readable'] - row['decode']:.1f} "
                    f"collect {row['collect']:.1f} us/datagram",
                    flush=True,
                )
    if args.out:
        sys.path.insert(0, ROOT)
        from bench.ab import write_results

        write_results(args.out, {"rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
