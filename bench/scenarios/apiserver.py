"""One lab API server (`VLLM::APIServer_<i>`): renders a chat template and tokenises prompts in pure Python, then hands requests to the engine.

Like a vLLM API server it holds every request until its prompt is tokenised, on its main thread,
with real CPU: a 60-90k-token prompt keeps the thread busy for ~200 ms, and only then does the
engine core (bench/scenarios/engine.py) see the request. Its "clients" are closed loops: each one
sends a request, waits for the last token, and sends the next. So one API server with long
prompts saturates its main thread while the engine's queue reads empty most instants.

Started by the launcher (bench/scenarios/serve.py) with a pipe for control messages:
("load", kind, clients, quota_cores | None), ("cost", us_per_token), ("stop",). Kinds: "idle",
"short", "long" (LOADS). The tokeniser's cost per token is held at its target by feedback on the
thread's own CPU time (`Tokeniser`): a calibration alone missed by 2x on the H200's cores, which
let one API server feed the engine twice as fast as the field's.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from multiprocessing.connection import Client, Connection, wait
from typing import Any

from bench.scenarios.quota import CpuCap
from bench.scenarios.titles import set_title

# kind -> (prompt tokens low, high, max_tokens)
LOADS: dict[str, tuple[int, int, int]] = {
    "idle": (0, 0, 0),
    "short": (8000, 12000, 64),  # still a chat template around a real prompt: ~25 ms to tokenise
    "long": (60000, 90000, 12),
    "light": (2000, 4000, 32),  # short requests, each client thinking THINK_S between them
}
THINK_S: dict[str, float] = {"light": 1.5}  # a client's pause after its answer, by kind (else a closed loop)
WORDS = tuple(
    "the model serves tokens from a long prompt with tool schemas json system user assistant call "
    "function arguments name description type object string required properties".split()
)
TEMPLATE = "<|im_start|>system\nYou are a helpful assistant with {n} tools.<|im_end|>\n<|im_start|>user\n"


def render(n_tokens: int, seed: int) -> list[str]:
    """Render a chat template around a prompt of about n_tokens words (pure Python)."""
    rnd = random.Random(seed)
    words = [TEMPLATE.format(n=93)]
    words.extend(WORDS[rnd.randrange(len(WORDS))] for _ in range(n_tokens))
    return words


# Words tokenised between two calls of `tokenise`'s `pace` (~2 ms of CPU at the lab's costs per token).
PACE_WORDS = 1024


def tokenise(words: list[str], rounds: int, pace: Callable[[], None] | None = None) -> list[int]:
    """Tokenise words the slow way: a byte-pair-like hash per character, `rounds` times (holds the GIL).

    `pace` is called every PACE_WORDS words: where the quota is emulated it sleeps off the CPU
    used beyond it there, as a cgroup's CFS quota throttles within each 100 ms period, rather
    than after a whole 60-90k-token prompt (a burst of ~200 ms and then seconds asleep, which no
    cgroup gives: its use per tick swung between nothing and several times the quota).
    """
    out: list[int] = []
    for i, w in enumerate(words):
        if pace is not None and i % PACE_WORDS == PACE_WORDS - 1:
            pace()
        h = 0
        for _ in range(rounds):
            for ch in w:
                h = (h * 131 + ord(ch)) & 0xFFFFF
        out.append(h % 32000)
    return out


def calibrate(us_per_token: float) -> int:
    """Return the rounds that make render + tokenise cost about us_per_token per token on this core."""
    words = render(4000, 0)
    best = None
    for _ in range(3):
        t = time.perf_counter()
        tokenise(words, 1)
        dt = time.perf_counter() - t
        best = dt if best is None else min(best, dt)
    t = time.perf_counter()
    render(4000, 1)
    render_us = (time.perf_counter() - t) / 4000 * 1e6
    one_round_us = (best or 1e-3) / 4000 * 1e6
    return max(1, round((us_per_token - render_us) / max(one_round_us, 1e-3)))


class Tokeniser:
    """Hold render + tokenise at `us_per_token` of this thread's CPU per token, by feedback on what it costs."""

    def __init__(self, us_per_token: float) -> None:
        self.target_us = us_per_token
        self.rounds_f = float(calibrate(us_per_token))
        self.seen_us: float | None = None  # the last request's cost per token

    @property
    def rounds(self) -> int:
        """Return the hash rounds per token in use."""
        return max(1, round(self.rounds_f))

    def retarget(self, us_per_token: float) -> None:
        """Aim at a new cost per token (rounds scaled at once, then held by feedback)."""
        if us_per_token > 0 and us_per_token != self.target_us:
            self.rounds_f *= us_per_token / self.target_us
            self.target_us = us_per_token

    def run(self, n_tokens: int, seed: int, pace: Callable[[], None] | None = None) -> list[int]:
        """Render and tokenise one prompt (`pace`: see `tokenise`); correct the rounds toward the target from its CPU time."""
        t = time.thread_time()
        ids = tokenise(render(n_tokens, seed), self.rounds, pace)
        used = time.thread_time() - t
        if n_tokens > 0 and used > 0:
            self.seen_us = used / n_tokens * 1e6
            self.rounds_f *= min(2.0, max(0.5, self.target_us / self.seen_us))
        return ids


class ApiServer:
    """Clients, the engine connection and the tokeniser of one API server."""

    def __init__(self, index: int, ctl: Connection, engine_address: str, cfg: dict[str, Any]) -> None:
        self.index = index
        self.ctl = ctl
        self.cfg = cfg
        self.engine = Client(engine_address, family="AF_UNIX")
        self.engine.send(("hello", index, os.getpid()))
        self.tok = Tokeniser(cfg.get("us_per_token", 2.5))
        self.kind = "idle"
        self.clients = 0
        self.pending: list[int] = []  # clients whose next request is not tokenised yet
        self.ready_at: dict[int, float] = {}  # client -> when it sends again (a load with think time)
        self.inflight: dict[int, int] = {}  # rid -> client
        self.next_rid = index * 10_000_000
        self.rnd = random.Random(index)
        self.cap = CpuCap()  # emulated CPU quota where no cgroup is writable
        self.gen_tokens = 0

    def set_load(self, kind: str, clients: int, cap: float | None) -> None:
        """Switch what the clients send; idle aborts every request."""
        if kind != self.kind or clients != self.clients:
            self.engine.send(("abort", self.index))
            self.inflight.clear()
            self.kind, self.clients = kind, clients if kind != "idle" else 0
            self.pending = list(range(self.clients))
            self.ready_at.clear()  # a new load's clients send at once
        self.cap.set(cap)

    def thinking(self) -> bool:
        """Say whether the next client to send still thinks (a load with think time).

        The head is the earliest ready: clients queue in the order they finish, each with the same think
        time (its kind's), so no ready client waits behind a thinking one.
        """
        return self.ready_at.get(self.pending[0], 0.0) > time.monotonic()

    def admit_one(self) -> None:
        """Render and tokenise one client's prompt on this (main) thread, then hand it to the engine."""
        if not self.pending or self.kind == "idle" or self.thinking():
            return
        client = self.pending.pop(0)
        lo, hi, max_tokens = LOADS[self.kind]
        n = self.rnd.randint(lo, hi)
        ids = self.tok.run(n, self.next_rid, self.cap.pay if self.cap.cores is not None else None)
        self.engine.send(("add", self.index, self.next_rid, len(ids), max_tokens))
        self.inflight[self.next_rid] = client
        self.next_rid += 1

    def outputs(self) -> None:
        """Process the engine's step outputs: detokenise, stream, and start a finished client's next request."""
        while self.engine.poll():
            msg = self.engine.recv()
            if msg[0] != "out":
                continue
            _, tokens, finished = msg
            text = "".join(WORDS[t % len(WORDS)] + " " for _, t in tokens)  # detokenise, stream
            self.gen_tokens += len(tokens) if text else 0
            for rid in finished:
                client = self.inflight.pop(rid, None)
                if client is not None and client < self.clients:
                    self.pending.append(client)
                    self.ready_at[client] = time.monotonic() + THINK_S.get(self.kind, 0.0)

    def serve(self) -> None:
        """Run the main loop until ("stop",)."""
        while True:
            while self.ctl.poll():
                msg = self.ctl.recv()
                if msg[0] == "stop":
                    return
                if msg[0] == "load":
                    self.set_load(msg[1], msg[2], msg[3])
                elif msg[0] == "cost":
                    self.tok.retarget(float(msg[1]))
            self.outputs()
            self.admit_one()
            self.cap.pay()
            if not self.pending or self.kind == "idle" or self.thinking():
                wait([self.ctl, self.engine], timeout=0.05)


def run(index: int, ctl: Connection, engine_address: str, cfg: dict[str, Any]) -> None:
    """Process entry: title the process, connect to the engine and serve."""
    set_title(f"VLLM::APIServer_{index}")
    server = ApiServer(index, ctl, engine_address, cfg)
    ctl.send(("ready", index, os.getpid(), server.tok.rounds))
    try:
        server.serve()
    except (EOFError, OSError):
        pass
