"""CPU of one `EngineSource.read()` against the bench's real-size changing page, per source tree, alternating.

Each tree (an unpacked commit, or this checkout) reads the page of `sidecar_cost.py`'s engine
stand-in 150 times, 0.1 s apart, in a fresh process; the process's utime + stime over those reads
(every thread: the event loop and the engine source's own) per read, in ms. Rounds alternate the
order of the trees, so both meet the same load.

    python3 bench/engine_read_ab.py /tmp/base,. --rounds 6

`--discover`: the source finds the engine and its 4 titled API servers itself (discovery, their
threads' CPU, cgroups), as in the daemon; run it in a PID namespace of its own, so that it finds
only the stand-in: `unshare --pid --fork --mount-proc python3 bench/engine_read_ab.py ... --discover`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.sidecar_cost import free_port, start_engine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import asyncio, resource, sys
sys.path.insert(0, sys.argv[1])
from exporter.config import Config, EngineConfig, HostConfig, load
from exporter.sources.engine import EngineSource

async def main() -> None:
    discover = sys.argv[3] == "1"
    cfg = load(overrides={}, environ={}) if discover else Config(
        engine=EngineConfig(urls=(sys.argv[2],), discover=False),
        host=HostConfig(proc_root="/proc", cgroup_root="/sys/fs/cgroup"),
    )
    src = EngineSource(cfg)
    for _ in range(10):
        await src.read()
        await asyncio.sleep(0.1)
    r0, n = resource.getrusage(resource.RUSAGE_SELF), 150
    for _ in range(n):
        (r,) = await src.read()
        assert not r.error, r.error
        assert not discover or len(r.api_servers) == 4, r.api_servers
        await asyncio.sleep(0.1)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    await src.aclose()
    print((r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / n * 1e3)

asyncio.run(main())
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trees", help="source trees, comma-separated")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument(
        "--discover", action="store_true", help="find the engine and its API servers (PID namespace)"
    )
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    trees = [os.path.abspath(t) for t in args.trees.split(",")]
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="bw-engine-read-")
    # started as `vllm serve --port P`, so discovery finds it as it finds a real engine
    engine = start_engine(workdir, port, dict(os.environ, BW_PY=sys.executable, PYTHONPATH=ROOT))
    out: dict[str, list[float]] = {t: [] for t in trees}
    try:
        time.sleep(2)
        for k in range(args.rounds):
            for tree in trees if k % 2 == 0 else trees[::-1]:
                url = f"http://127.0.0.1:{port}/metrics"
                argv = [sys.executable, "-c", CHILD, tree, url, "1" if args.discover else "0"]
                ms = float(subprocess.check_output(argv, stderr=subprocess.DEVNULL).split()[-1])
                out[tree].append(round(ms, 3))
                print(tree, round(ms, 3), flush=True)
    finally:
        engine.kill()
        engine.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(out))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"ms_per_read": out, "rounds": args.rounds, "discover": args.discover}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
