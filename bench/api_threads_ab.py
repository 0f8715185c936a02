"""CPU of `procs.CpuTracker.sample()` over 4 titled API servers of 8 threads, every thread each tick or the hot ones.

The bench's API-server stand-ins (`sidecar_cost.API_SERVER`: one thread at ~30% of a core in
server 0, 2% in the others, 7 sleeping threads each) are sampled by two trackers in turn, order
alternating, every 0.25 s: one reading every thread each tick, one with `hot_every` =
`procs.HOT_LIST_SECONDS`. Prints each tracker's CPU (`time.thread_time`) per sample of the 4
servers and the files read.

    python3 bench/api_threads_ab.py --samples 240
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.sidecar_cost import API_SERVER
from exporter.sources import procs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=240)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    kids = [
        subprocess.Popen([f"VLLM::APIServer_{i}", "-c", API_SERVER, str(i)], executable=sys.executable)
        for i in range(4)
    ]
    try:
        time.sleep(1)
        infos = [info for k in kids if (info := procs.proc_info("/proc", k.pid)) is not None]
        trackers = {"every": procs.CpuTracker(), "hot": procs.CpuTracker(hot_every=procs.HOT_LIST_SECONDS)}
        cpu = dict.fromkeys(trackers, 0.0)
        for i in range(args.samples):
            for name in ("every", "hot") if i % 2 else ("hot", "every"):
                t = time.thread_time()
                trackers[name].sample(infos)
                cpu[name] += time.thread_time() - t
            time.sleep(0.25)
    finally:
        for k in kids:
            k.kill()
            k.wait()
    res = {
        name: {
            "us_per_sample": round(cpu[name] / args.samples * 1e6, 1),
            "schedstat_reads": t.schedstat_reads,
            "stat_reads": t.stat_reads,
            "listings": t.listings,
        }
        for name, t in trackers.items()
    }
    print(json.dumps(res))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
