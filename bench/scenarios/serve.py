"""The lab's `vllm serve`: starts one engine core and N API servers, serves vLLM's /metrics, takes commands on stdin.

Started as `python3 bench/scenarios/vllm serve --port P ...` so boundwatch's discovery finds it
like a real `vllm serve`: its children are titled `VLLM::EngineCore` and `VLLM::APIServer_<i>`.
The page carries vLLM's names with vLLM's labels (engine, model_name): running and waiting as
the scheduler published them after its latest step, token counters, and
`vllm:iteration_tokens_total` observed once per step for each API server with output in it (so
with several API servers the count over-counts steps, as vLLM's does).

Commands, one a line; each is answered with `OK <word> <json>`:
  servers N               run N API servers (spawns or stops the difference)
  load KIND CLIENTS [CAP] closed-loop clients spread over the servers; KIND idle|short|long;
                          CAP: emulated CPU quota of all the servers together (cores), or -
  mode graph|eager        the engine's decode (eager = CUDA graphs off)
  cost US                 API-server CPU per prompt token (render + tokenise), held by feedback
  cap CORES|-             emulated CPU quota of the engine core (where no cgroup is writable)
  stop
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import threading
from pathlib import Path
from typing import Any

LABELS = {"engine": "0", "model_name": "lab/toy-16L"}


class Page:
    """vLLM's metric names, fed from the engine's stats."""

    def __init__(self, port: int, max_num_seqs: int) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

        reg = CollectorRegistry()
        names = list(LABELS)

        def lab(metric: Any) -> Any:
            return metric.labels(**LABELS)

        self.running = lab(Gauge("vllm:num_requests_running", "Running requests.", names, registry=reg))
        self.waiting = lab(Gauge("vllm:num_requests_waiting", "Waiting requests.", names, registry=reg))
        self.kv = lab(Gauge("vllm:kv_cache_usage_perc", "KV-cache usage.", names, registry=reg))
        self.prompt = lab(Counter("vllm:prompt_tokens", "Prompt tokens.", names, registry=reg))
        self.gen = lab(Counter("vllm:generation_tokens", "Generation tokens.", names, registry=reg))
        self.success = lab(Counter("vllm:request_success", "Finished requests.", names, registry=reg))
        self.iters = lab(
            Histogram(
                "vllm:iteration_tokens_total",
                "Tokens per engine step.",
                names,
                buckets=(1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384),
                registry=reg,
            )
        )
        info = Gauge(
            "vllm:cache_config_info",
            "Cache config.",
            [*names, "block_size", "max_num_seqs"],
            registry=reg,
        )
        info.labels(**LABELS, block_size="16", max_num_seqs=str(max_num_seqs)).set(1)
        self.last: dict[str, int] = {}
        self.max_num_seqs = max_num_seqs
        start_http_server(port, addr="127.0.0.1", registry=reg)

    def take(self, running: int, waiting: int, stats: dict[str, int], iters: list[int]) -> None:
        """Apply one stats message of the engine."""
        self.running.set(running)
        self.waiting.set(waiting)
        self.kv.set(min(1.0, running / max(1, self.max_num_seqs) * 0.8))
        for key, counter in (("prompt", self.prompt), ("gen", self.gen), ("success", self.success)):
            delta = stats.get(key, 0) - self.last.get(key, 0)
            if delta > 0:
                counter.inc(delta)
        self.last = dict(stats)
        for n in iters:
            self.iters.observe(n)


class Launcher:
    """The engine process, the API-server processes and the page."""

    def __init__(self, args: argparse.Namespace) -> None:
        from bench.scenarios import apiserver, engine

        self.args = args
        self.ctx = multiprocessing.get_context("spawn")
        work = Path(args.work)
        work.mkdir(parents=True, exist_ok=True)
        self.address = str(work / "engine.sock")
        if os.path.exists(self.address):
            os.unlink(self.address)
        self.engine_ctl, child = self.ctx.Pipe()
        overrides = {
            "device": args.device,
            "agent": args.agent,
            "max_num_seqs": args.max_num_seqs,
            "truth_path": str(work / "truth-engine.jsonl"),
            "standin_path": str(work / "standin-gpu.bin") if args.device == "cpu" else "",
            "calibrate": not args.no_calibrate,
            **json.loads(args.engine_json or "{}"),
        }
        self.engine = self.ctx.Process(
            target=engine.run, args=(child, self.address, overrides), name="EngineCore", daemon=True
        )
        self.engine.start()
        kind, self.info = self.engine_ctl.recv()
        assert kind == "ready", kind
        self.page = Page(args.port, args.max_num_seqs)
        self.lock = threading.Lock()
        threading.Thread(target=self._stats, daemon=True).start()
        self.apiserver = apiserver
        self.servers: list[tuple[Any, Any, int]] = []  # (process, control pipe, pid)
        self.cfg = {"us_per_token": args.us_per_token}
        self.set_servers(args.api_servers)

    def _stats(self) -> None:
        while True:
            try:
                msg = self.engine_ctl.recv()
            except (EOFError, OSError):
                return
            if msg[0] == "stats":
                self.page.take(*msg[1:])

    def set_servers(self, n: int) -> list[int]:
        """Run n API servers; return their pids."""
        while len(self.servers) < n:
            i = len(self.servers)
            ctl, child = self.ctx.Pipe()
            p = self.ctx.Process(
                target=self.apiserver.run, args=(i, child, self.address, self.cfg), name=f"APIServer_{i}"
            )
            p.daemon = True
            p.start()
            msg = ctl.recv()
            assert msg[0] == "ready", msg
            self.servers.append((p, ctl, int(p.pid or 0)))
        while len(self.servers) > n:
            p, ctl, _ = self.servers.pop()
            ctl.send(("stop",))
            p.join(10)
        return [pid for _, _, pid in self.servers]

    def load(self, kind: str, clients: int, cap: float | None) -> None:
        """Spread closed-loop clients over the API servers."""
        n = len(self.servers)
        for i, (_, ctl, _) in enumerate(self.servers):
            share = clients // n + (1 if i < clients % n else 0)
            ctl.send(("load", kind, share, cap / n if cap else None))

    def command(self, line: str) -> dict[str, Any] | None:
        """Run one stdin command; None on stop."""
        word, *rest = line.split()
        if word == "stop":
            return None
        if word == "servers":
            return {"pids": self.set_servers(int(rest[0]))}
        if word == "load":
            cap = float(rest[2]) if len(rest) > 2 and rest[2] != "-" else None
            self.load(rest[0], int(rest[1]), cap)
        elif word == "cost":  # API-server CPU per prompt token, every server (and those started later)
            self.cfg["us_per_token"] = float(rest[0])
            for _, ctl, _ in self.servers:
                ctl.send(("cost", float(rest[0])))
        elif word == "mode":
            self.engine_ctl.send(("mode", rest[0]))
        elif word == "cap":
            self.engine_ctl.send(("cap", float(rest[0]) if rest[0] != "-" else None))
        return {}

    def run(self) -> None:
        """Print READY, then serve commands until stop or end of input."""
        ready = {**self.info, "launcher_pid": os.getpid(), "engine_pid": self.engine.pid}
        ready["api_server_pids"] = [pid for _, _, pid in self.servers]
        print("READY " + json.dumps(ready, default=str), flush=True)
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                out = self.command(line)
            except Exception as exc:  # a bad command must not take the lab down
                print(f"ERR {line.strip()} {type(exc).__name__}: {exc}", flush=True)
                continue
            if out is None:
                break
            print(f"OK {line.split()[0]} " + json.dumps(out), flush=True)
        for p, ctl, _ in self.servers:
            ctl.send(("stop",))
            p.join(10)
        self.engine_ctl.send(("stop",))
        self.engine.join(20)


def main(argv: list[str] | None = None) -> int:
    """Parse `serve --port P ...` and run."""
    p = argparse.ArgumentParser(prog="vllm")
    p.add_argument("command", choices=["serve"])
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--agent", default="none", choices=["none", "light", "cupti"])
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--api-servers", type=int, default=1, help="API servers at start")
    p.add_argument("--us-per-token", type=float, default=2.5, help="CPU to render and tokenise one token")
    p.add_argument("--work", default="/tmp/bwlab-serve")
    p.add_argument("--no-calibrate", action="store_true")
    p.add_argument("--engine-json", default="", help="engine settings to override (JSON)")
    args = p.parse_args(argv)
    Launcher(args).run()
    return 0
