"""The lab's engine core: decode steps on a toy model, fed by the API server over a pipe.

It behaves like an inference engine's core loop: requests arrive tokenised from the API server,
each step decodes one token for every running request (a fixed batch shape, padded, as CUDA-graph
engines run), and step outputs go back to the API server, which must process them (detokenise,
stream) and acknowledge; at most `depth` steps may be unacknowledged. So an API server that is
busy elsewhere (tokenising huge prompts) stalls the engine with requests running: the GPU waits
on the host.

Modes: "graph" replays one captured CUDA graph per step; "eager" runs the same model op by op,
with the per-op framework work (views, slices) that graphs remove. With `device="cpu"` (no torch)
a step sleeps for the GPU time instead, so the whole lab runs on a machine without a GPU.

Messages in: ("add", [(rid, max_tokens), ...]), ("ack", step), ("mode", m), ("abort",), ("stop",).
Messages out: ("ready", info), ("out", step, [(rid, token), ...], [finished rids], running, waiting).
"""

from __future__ import annotations

import collections
import os
import time
from typing import Any

DEFAULTS: dict[str, Any] = {
    "device": "cuda",
    "layers": 32,
    "hidden": 2048,
    "ffn": 16384,
    "tiny_ops": 16,  # small kernels per layer (norms, activations, bookkeeping)
    "views": 160,  # CPU-only framework ops per layer in eager mode (views, slices)
    "batch": 64,  # max running requests (max_num_seqs), the captured batch
    "vocab": 32000,
    "depth": 2,  # unacknowledged steps allowed
    "agent": True,
    "cpu_step_ms": 2.0,  # device="cpu": the "GPU" time of a step
    "cpu_eager_ms": 8.0,  # device="cpu": the wall time of an eager step
}


class ToyModel:
    """A decode step of a toy transformer on the GPU, replayable as one CUDA graph."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        import torch

        self.torch = torch
        self.cfg = cfg
        dev = torch.device("cuda")
        b, h, f, v = cfg["batch"], cfg["hidden"], cfg["ffn"], cfg["vocab"]
        gen = torch.Generator(device=dev).manual_seed(0)
        dt = torch.bfloat16
        self.w1 = [
            torch.randn(h, f, device=dev, dtype=dt, generator=gen) * 0.01 for _ in range(cfg["layers"])
        ]
        self.w2 = [
            torch.randn(f, h, device=dev, dtype=dt, generator=gen) * 0.01 for _ in range(cfg["layers"])
        ]
        self.wout = torch.randn(h, v, device=dev, dtype=dt, generator=gen) * 0.01
        self.x = torch.randn(b, h, device=dev, dtype=dt, generator=gen)
        self.side = torch.ones(b, 64, device=dev, dtype=torch.float32)
        self.tokens = torch.zeros(b, device=dev, dtype=torch.int64)
        self.host = [torch.zeros(b, dtype=torch.int64).pin_memory() for _ in range(2)]
        self.events = [torch.cuda.Event() for _ in range(2)]
        self.weight_bytes = sum(w.numel() * w.element_size() for w in (*self.w1, *self.w2, self.wout))
        self.graph: Any = None
        self.i = 0

    def forward(self, views: bool) -> None:
        """Run one decode step into self.tokens."""
        torch = self.torch
        h = self.x
        for w1, w2 in zip(self.w1, self.w2, strict=True):
            a = torch.nn.functional.gelu(h @ w1)
            h = h + a @ w2
            for _ in range(self.cfg["tiny_ops"] // 2):
                self.side.mul_(0.5).add_(0.5)
            if views:
                for k in range(self.cfg["views"]):
                    h.narrow(1, k % 64, 1).squeeze(1)
        self.tokens.copy_((h @ self.wout).argmax(dim=-1))

    def capture(self) -> None:
        """Warm up and capture the step as a CUDA graph."""
        torch = self.torch
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                self.forward(views=False)
        torch.cuda.current_stream().wait_stream(s)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.forward(views=False)
        torch.cuda.synchronize()

    def step(self, mode: str) -> list[int]:
        """Launch this step, then return the tokens of the previous one (keeps one step queued)."""
        if mode == "graph":
            self.graph.replay()
        else:
            self.forward(views=True)
        slot = self.i % 2
        self.host[slot].copy_(self.tokens, non_blocking=True)
        self.events[slot].record()
        prev = (self.i - 1) % 2
        self.i += 1
        if self.i == 1:
            self.events[slot].synchronize()
            return self.host[slot].tolist()
        self.events[prev].synchronize()
        return self.host[prev].tolist()

    def drain(self) -> None:
        """Wait for the queued step (before the engine blocks with nothing to do)."""
        self.torch.cuda.synchronize()
        self.i = 0


class CpuModel:
    """A stand-in without torch: a step sleeps for its GPU time."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.weight_bytes = 0

    def capture(self) -> None:
        """Nothing to capture."""

    def step(self, mode: str) -> list[int]:
        """Sleep like a step and return tokens."""
        ms = self.cfg["cpu_step_ms"] if mode == "graph" else self.cfg["cpu_eager_ms"]
        end = time.perf_counter() + ms / 1000
        if mode == "eager":  # eager steps burn CPU in the framework
            while time.perf_counter() < end:
                pass
        else:
            time.sleep(ms / 1000)
        return [1] * self.cfg["batch"]

    def drain(self) -> None:
        """Nothing queued."""


def run(conn: Any, overrides: dict[str, Any]) -> None:
    """Serve the API server on conn until ("stop",)."""
    cfg = {**DEFAULTS, **overrides}
    info: dict[str, Any] = {"pid": os.getpid(), "device": cfg["device"]}
    recorder = None
    if cfg["device"] == "cuda":
        import torch  # noqa: F401  (first, as the agent's own benchmarks do: the agent reuses torch's libcupti)
    if cfg["agent"]:
        try:
            from exporter import agent

            info["agent"] = agent.start(
                role="generic", mode="cupti"
            )  # before CUDA: GRAPH_TRACE stays possible
            a = agent.current()
            if a is not None:
                info["agent_mode"] = getattr(a, "mode", "")
                recorder = a.steps
        except Exception as exc:  # the lab still runs, the sidecar falls back to NVML
            info["agent"] = f"failed: {type(exc).__name__}: {exc}"
    model: Any = ToyModel(cfg) if cfg["device"] == "cuda" else CpuModel(cfg)
    t = time.perf_counter()
    model.capture()
    info["capture_seconds"] = round(time.perf_counter() - t, 3)
    info["weight_bytes"] = model.weight_bytes
    conn.send(("ready", info))

    mode = "graph"
    queue: collections.deque[tuple[int, int]] = collections.deque()
    running: dict[int, int] = {}  # rid -> tokens left
    step_no = acked = 0
    queued_step: list[int] | None = None  # rids of the step still on the GPU

    def handle(msg: tuple[Any, ...]) -> bool:
        nonlocal mode, acked, queued_step
        kind = msg[0]
        if kind == "add":
            queue.extend(msg[1])
        elif kind == "ack":
            acked = max(acked, msg[1])
        elif kind == "mode":
            mode = msg[1]
        elif kind == "abort":
            queue.clear()
            running.clear()
        elif kind == "stop":
            return False
        return True

    while True:
        idle = not running and not queue
        if idle or step_no - acked >= cfg["depth"]:
            if idle and queued_step is not None:
                model.drain()
                queued_step = None
            if not handle(conn.recv()):
                break
        while conn.poll():
            if not handle(conn.recv()):
                return
        if (not running and not queue) or step_no - acked >= cfg["depth"]:
            continue
        while queue and len(running) < cfg["batch"]:
            rid, n = queue.popleft()
            running[rid] = n
        rids = list(running)
        t0 = time.time_ns()
        tokens = model.step(mode)
        t1 = time.time_ns()
        step_no += 1
        if recorder is not None:
            recorder.record("vllm", t0, t1, len(rids), len(rids))
        out, finished = [], []
        for i, rid in enumerate(rids):
            left = running.get(rid)
            if left is None:
                continue
            out.append((rid, tokens[i % len(tokens)]))
            if left <= 1:
                del running[rid]
                finished.append(rid)
            else:
                running[rid] = left - 1
        queued_step = rids
        conn.send(("out", step_no, out, finished, len(running), len(queue)))
