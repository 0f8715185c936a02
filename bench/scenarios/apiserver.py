"""The lab's API server: admits requests (tokenising their prompts in pure Python), feeds the engine, serves /metrics.

Like a vLLM API server it is one Python event loop that tokenises prompts, hands requests to the
engine core (a child process, bench/scenarios/engine.py), processes each step's outputs
(detokenise, stream, acknowledge) and serves a vLLM-style /metrics page
(vllm:num_requests_running / waiting, token counters, iteration_tokens_total) on 127.0.0.1.
Started as `python3 bench/scenarios/vllm serve --port P` so boundwatch's engine discovery finds
it like a real `vllm serve`.

The load it generates (its own "clients", `concurrency` requests in flight) follows a mode read
from stdin, one word a line:
  gpu    short prompts, the engine replays CUDA graphs: the GPU is the bottleneck
  api    60k-word prompts: tokenising one blocks the loop ~60 ms, step outputs wait, the engine stalls
  quota  like api; the lab puts this process in a cgroup with a CPU quota
  quota-sim:C  like quota where no cgroup is writable: the loop sleeps to use at most C cores
  eager  short prompts, the engine runs eager (no CUDA graphs)
  idle   abort every request, admit none
  stop   shut down
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import threading
import time

WORDS = ("the", "model", "serves", "tokens", "from", "a", "long", "prompt", "with", "tool", "schemas", "json")


def tokenise(n_words: int, seed: int = 0) -> list[int]:
    """Tokenise a prompt of n words the slow way (pure Python, one core, holds the GIL)."""
    out: list[int] = []
    h = seed
    for i in range(n_words):
        w = WORDS[(i + seed) % len(WORDS)]
        for ch in w:
            h = (h * 131 + ord(ch)) & 0xFFFFF
        out.append(h % 32000)
    return out


def calibrate(target_ms: float) -> int:
    """Return how many words take target_ms to tokenise on this core."""
    n = 20000
    t = time.perf_counter()
    tokenise(n)
    per_word = (time.perf_counter() - t) / n
    return max(1000, int(target_ms / 1000 / per_word))


class Server:
    """One API server: clients, the engine pipe, metrics."""

    def __init__(self, args: argparse.Namespace) -> None:
        from prometheus_client import Counter, Gauge, Histogram, start_http_server

        self.args = args
        labels = ["model_name"]
        self.g_running = Gauge("vllm:num_requests_running", "Requests running.", labels).labels("toy")
        self.g_waiting = Gauge("vllm:num_requests_waiting", "Requests waiting.", labels).labels("toy")
        self.c_prompt = Counter("vllm:prompt_tokens", "Prompt tokens.", labels).labels("toy")
        self.c_gen = Counter("vllm:generation_tokens", "Generation tokens.", labels).labels("toy")
        self.h_iter = Histogram(
            "vllm:iteration_tokens_total",
            "Tokens per engine step.",
            labels,
            buckets=(1, 8, 16, 32, 64, 128, 256),
        ).labels("toy")
        start_http_server(args.port, addr="127.0.0.1")
        self.mode = "idle"
        self.cores: float | None = None
        self.budget_at, self.cpu_at = time.monotonic(), time.process_time()
        self.modes: list[str] = []
        self.lock = threading.Lock()
        self.inflight: set[int] = set()
        self.next_rid = 0
        self.long_words = calibrate(args.long_prompt_ms)
        self.short_words = 200
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        from bench.scenarios import engine

        overrides = {"device": args.device, "batch": args.batch}
        self.engine = ctx.Process(
            target=engine.run, args=(child, overrides), name="EngineCore_0", daemon=True
        )
        self.engine.start()
        kind, info = self.conn.recv()
        assert kind == "ready", kind
        info.update(long_prompt_words=self.long_words, pid=os.getpid(), engine_pid=self.engine.pid)
        print("READY " + repr(info), flush=True)

    def read_modes(self) -> None:
        """Take modes from stdin (a thread)."""
        for line in sys.stdin:
            word = line.strip()
            if word:
                with self.lock:
                    self.modes.append(word)
        with self.lock:
            self.modes.append("stop")

    def set_mode(self, mode: str) -> None:
        """Switch the load and the engine mode."""
        if mode == "idle":
            self.conn.send(("abort",))
            self.inflight.clear()
            self.g_running.set(0)
            self.g_waiting.set(0)
        self.conn.send(("mode", "eager" if mode == "eager" else "graph"))
        self.mode, _, cores = mode.partition(":")
        self.cores = float(cores) if cores else None
        self.budget_at, self.cpu_at = time.monotonic(), time.process_time()

    def admit(self) -> None:
        """Admit requests up to the concurrency; a long prompt blocks the loop while it tokenises."""
        if self.mode == "idle":
            return
        long = self.mode in ("api", "quota", "quota-sim")
        batch: list[tuple[int, int]] = []
        while len(self.inflight) + len(batch) < self.args.concurrency:
            ids = tokenise(self.long_words if long else self.short_words, self.next_rid)
            self.c_prompt.inc(len(ids))
            batch.append((self.next_rid, self.args.max_tokens))
            self.next_rid += 1
            if long:
                break  # one huge prompt per turn of the loop, then outputs get their turn
        if batch:
            self.conn.send(("add", batch))
            self.inflight.update(rid for rid, _ in batch)

    def outputs(self, timeout: float) -> None:
        """Process every step output that is ready: detokenise, count, acknowledge."""
        if not self.conn.poll(timeout):
            return
        while self.conn.poll():
            msg = self.conn.recv()
            if msg[0] != "out":
                continue
            _, step, out, finished, running, waiting = msg
            text = [WORDS[token % len(WORDS)] for _, token in out]  # detokenise
            self.c_gen.inc(len(text))
            self.h_iter.observe(len(out))
            for rid in finished:
                self.inflight.discard(rid)
            if self.mode != "idle":
                self.g_running.set(running)
                self.g_waiting.set(waiting)
            self.conn.send(("ack", step))

    def serve(self) -> None:
        """Run the loop until stop."""
        threading.Thread(target=self.read_modes, daemon=True).start()
        while True:
            with self.lock:
                todo, self.modes = self.modes, []
            for mode in todo:
                if mode == "stop":
                    self.conn.send(("stop",))
                    self.engine.join(10)
                    return
                self.set_mode(mode)
            self.admit()
            self.outputs(0.001 if self.inflight else 0.02)
            self.throttle()

    def throttle(self) -> None:
        """Under quota-sim, sleep off the CPU used beyond `cores` (what the kernel's CFS quota does)."""
        if self.cores is None:
            return
        used = time.process_time() - self.cpu_at
        allowed = (time.monotonic() - self.budget_at) * self.cores
        if used > allowed:
            time.sleep((used - allowed) / self.cores)


def main(argv: list[str] | None = None) -> int:
    """Parse `serve --port P ...` and run."""
    p = argparse.ArgumentParser(prog="vllm")
    p.add_argument("command", choices=["serve"])
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--batch", type=int, default=64, help="max_num_seqs of the engine")
    p.add_argument("--concurrency", type=int, default=72, help="requests the clients keep in flight")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--long-prompt-ms", type=float, default=60.0, help="CPU time to tokenise one long prompt")
    args = p.parse_args(argv)
    Server(args).serve()
    return 0
