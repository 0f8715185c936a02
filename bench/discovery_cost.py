"""CPU of one discovery pass (`find_engines`) for an engine started without `--port`, per source tree.

vLLM's default `vllm serve MODEL` names no port, so discovery finds it from the sockets the engine's
processes hold: it reads the network namespace's TCP table, which walks the kernel's whole socket
hash. This bench starts such an engine (a `vllm serve m` process listening on 8000 and 4 children
titled `VLLM::APIServer_<i>` holding its socket) beside `--connections` loopback connections, then
times `find_engines("/proc")` `--passes` times in a fresh process per tree, trees alternating over
`--rounds`. Every run prints the targets it found: trees that agree find the same.

Run it in PID and network namespaces of its own:

    unshare --pid --fork --mount-proc --net .venv/bin/python bench/discovery_cost.py \
        --trees /tmp/base,. --connections 100 --out bench/results/discovery_cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

ENGINE = r"""
import socket, subprocess, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8000))
s.listen(64)
kids = [
    subprocess.Popen([f"VLLM::APIServer_{i}", "-c", "import time; time.sleep(3600)"],
                     executable=sys.executable, pass_fds=[s.fileno()])
    for i in range(4)
]
time.sleep(3600)
"""

CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from exporter.sources.engine_discovery import find_engines
found = find_engines("/proc")[0]
n = int(sys.argv[2])
c = time.process_time()
for _ in range(n):
    find_engines("/proc")
ms = (time.process_time() - c) / n * 1e3
print(json.dumps({"ms_per_pass": round(ms, 3), "targets": [[t.name, t.url, list(t.api_server_pids)] for t in found]}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trees", default=".", help="comma-separated checkouts, each timed in a fresh process")
    ap.add_argument("--connections", type=int, default=100, help="loopback connections held open beside it")
    ap.add_argument("--passes", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if os.getpid() != 1:
        sys.exit("run under `unshare --pid --fork --mount-proc --net` (see the module's doc)")
    subprocess.run(["ip", "link", "set", "lo", "up"], check=False)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4096)
    held = []
    for _ in range(args.connections):
        client = socket.create_connection(srv.getsockname())
        held += [client, srv.accept()[0]]
    engine = subprocess.Popen([sys.executable, "-c", ENGINE, "vllm", "serve", "m"])
    time.sleep(2)  # its API servers started and titled
    trees = [os.path.abspath(t) for t in args.trees.split(",")]
    rows = []
    try:
        for r in range(args.rounds):
            for tree in trees if r % 2 == 0 else trees[::-1]:
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, tree, str(args.passes)],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                row = {"tree": tree, "round": r, **json.loads(out.stdout)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        engine.kill()
    summary = {t: statistics.median(float(x["ms_per_pass"]) for x in rows if x["tree"] == t) for t in trees}
    print(json.dumps({"median_ms_per_pass_by_tree": summary}))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {
                    "bench": "discovery_cost",
                    "connections": args.connections,
                    "rows": rows,
                    "median_ms_per_pass_by_tree": summary,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
