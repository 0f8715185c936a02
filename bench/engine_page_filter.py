"""What asking an engine's page for only the samples read saves, the engine and the sidecar, side by side.

The engine: vLLM 0.33's families (`tests/fakes/engine/vllm_sim.py`, two engines, the HTTP
instrumentator's, the process and GC collectors) in one single-process prometheus_client registry,
served by prometheus_client's own WSGI app (the code vLLM mounts at `/metrics`) from a process of its
own. The sidecar: `EnginePageClient` reading it over one kept-alive connection and `raw_from_bytes`
parsing each page, as the engine source's thread does each tick. Rounds alternate the whole page
(`engine.page_filter = false`) and the filtered one (the default), `--reads` reads each, 0.01 s
apart; per read: the server process' CPU (utime + stime from /proc) and the reading thread's CPU.

    python3 bench/engine_page_filter.py --rounds 10 --reads 200
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "fakes" / "engine"))

SERVER = r"""
import sys
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[1] + "/tests/fakes/engine")
from wsgiref.simple_server import WSGIRequestHandler, make_server
from prometheus_client import GC_COLLECTOR, PROCESS_COLLECTOR, CollectorRegistry, make_wsgi_app
import vllm_sim
reg = CollectorRegistry(auto_describe=True)
vllm_sim.fill(vllm_sim.define("0.33", registry=reg), engines=("0", "1"))
vllm_sim.fill_http(vllm_sim.define_http(registry=reg))
for c in (GC_COLLECTOR, PROCESS_COLLECTOR):
    reg.register(c)
class Quiet(WSGIRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
srv = make_server("127.0.0.1", 0, make_wsgi_app(reg), handler_class=Quiet)
print(srv.server_address[1], flush=True)
srv.serve_forever()
"""


def proc_cpu(pid: int) -> float:
    """Return a process' utime + stime in seconds."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_round(url: str, pid: int, filtered: bool, reads: int) -> dict[str, Any]:
    from exporter.sources.engine_scrape import page_client, raw_from_bytes

    client = page_client(url, 5.0, ask=filtered, kind="vllm")
    for _ in range(3):  # connect; a filtered client asks from its first read (discovery named the kind)
        raw_from_bytes(client.get())
    sizes = set()
    s0, c0 = proc_cpu(pid), time.thread_time()
    for _ in range(reads):
        data = client.get()
        raw_from_bytes(data)
        sizes.add(len(data))
        time.sleep(0.01)
    c1, s1 = time.thread_time(), proc_cpu(pid)
    client.close()
    assert not client.filter_off or not filtered, client.filter_off
    return {
        "sidecar_ms_per_read": (c1 - c0) / reads * 1e3,
        "engine_ms_per_read": (s1 - s0) / reads * 1e3,
        "bytes": sorted(sizes),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--reads", type=int, default=200)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "engine_page_filter.json"))
    args = ap.parse_args()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(ROOT)], stdout=subprocess.PIPE)
    assert server.stdout is not None
    url = f"http://127.0.0.1:{int(server.stdout.readline())}/metrics"
    rounds: list[dict[str, Any]] = []
    try:
        for i in range(args.rounds):
            order = (False, True) if i % 2 == 0 else (True, False)
            for filtered in order:
                rounds.append(
                    {"round": i, "filtered": filtered, **one_round(url, server.pid, filtered, args.reads)}
                )
    finally:
        server.kill()
        server.wait()

    def med(key: str, filtered: bool) -> float:
        return statistics.median(r[key] for r in rounds if r["filtered"] is filtered)

    def ratios(key: str) -> list[float]:
        by = {(r["round"], r["filtered"]): r[key] for r in rounds}
        return sorted(round(by[(i, True)] / by[(i, False)], 3) for i in range(args.rounds))

    summary = {
        key: {"whole": round(med(key, False), 3), "filtered": round(med(key, True), 3), "ratios": ratios(key)}
        for key in ("sidecar_ms_per_read", "engine_ms_per_read")
    }
    summary["bytes"] = {
        "whole": next(r["bytes"] for r in rounds if not r["filtered"]),
        "filtered": next(r["bytes"] for r in rounds if r["filtered"]),
    }
    result = {
        "command": "python3 bench/engine_page_filter.py " + " ".join(sys.argv[1:]),
        "machine": {
            "nproc": os.cpu_count(),
            "python": platform.python_version(),
            "load_average": os.getloadavg(),
        },
        "summary": summary,
        "rounds": rounds,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
