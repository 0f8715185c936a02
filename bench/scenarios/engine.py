"""The lab's engine core (`VLLM::EngineCore`): a vLLM-like scheduler over a 16-layer bf16 decoder, one plain torch process.

Requests come from the API servers (bench/scenarios/apiserver.py) over a Unix socket, already
tokenised. Every step admits waiting requests up to `max_num_seqs`, decodes one token for every
request past its prefill, and runs one prefill chunk (`chunk_tokens` of a prompt) for the first
request still prefilling. In "graph" mode decode replays a CUDA graph captured per batch size
(1, 2, 4, 8, padded up, like vLLM's capture sizes; about 800 kernels each) and prefill replays a
captured chunk graph; in "eager" mode (CUDA graphs off) the same model runs op by op, with the
framework's per-op CPU work (views) that graphs remove. After each step the gauges are published
(running, waiting as vLLM's scheduler stats show them) and outputs go to the API servers; the
engine never waits for them.

The only call into boundwatch is `exporter.agent.start()` (mode none / light / cupti), after CUDA
has initialised and before any graph is captured, as the field lab did.

Truth: every step's GPU time (CUDA events around the step; for eager steps also the captured
graph's GPU time for the same work, since events there include launch gaps), the scheduler's
running / waiting, binned in 0.25 s of wall time into `truth_path` (JSON lines).

With `device="cpu"` (no torch) a step sleeps for its GPU time (an eager step spins; a graph-mode
step spins its host side, `cpu_host_ms`, while its GPU time runs), and the
cumulative busy time goes to a small shared file that the lab's NVML stand-in reads
(bench/scenarios/standin/pynvml.py), so the lab runs on a machine without a GPU.
"""

from __future__ import annotations

import collections
import json
import mmap
import os
import struct
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, Listener, wait
from typing import Any

from bench.scenarios import cpugraphs
from bench.scenarios.quota import CpuCap
from bench.scenarios.titles import set_title

DEFAULTS: dict[str, Any] = {
    "device": "cuda",
    "agent": "none",  # none | light | cupti
    "max_num_seqs": 8,
    "capture_sizes": (1, 2, 4, 8),
    "layers": 16,
    "hidden": 2048,
    "ffn": 8192,  # grown at calibration until the eager step is near GPU-bound
    "ctx": 256,  # toy KV-cache positions attended per decode step
    "vocab": 32000,
    "tiny_ops": 8,  # bookkeeping kernels per layer
    "views": 0,  # CPU-only framework ops per layer in eager mode (calibrated)
    "chunk_tokens": 8192,  # prompt tokens per prefill chunk (vLLM's max_num_batched_tokens)
    "prefill_chunk_ms": 4.5,  # GPU time of one prefill chunk (rows calibrated to it)
    "eager_target_busy": 0.78,  # calibrate the eager decode step's busy share to this (GPM where NVML has it)
    "calibrate": True,
    "cpu_decode_ms": 4.0,  # device="cpu": "GPU" time of a decode step at the largest batch
    "cpu_prefill_ms": 4.5,
    "cpu_graphs": True,  # device="cpu": graph-mode steps replay stand-in CUDA graphs (bench/scenarios/cpugraphs)
    "cpu_eager_ms": 6.0,  # device="cpu": wall time of an eager decode step (spins), 78% of it "GPU"
    # device="cpu": host CPU of a graph-mode decode step at the largest batch (scheduling, sampling, the
    # launch), spun while its "GPU" time runs: what a CPU quota on the engine's process throttles
    "cpu_host_ms": 1.5,
    "truth_path": "",
    "standin_path": "",  # device="cpu": where the cumulative busy time goes for the NVML stand-in
    "bin_seconds": 0.25,
}


@dataclass
class Req:
    """One request inside the engine."""

    server: int
    rid: int
    prefill_left: int
    decode_left: int


class Truth:
    """Bin the GPU's busy time and the scheduler's counts by wall time; append finished bins as JSON lines."""

    def __init__(self, path: str, bin_s: float, standin: str = "") -> None:
        self.path, self.bin = path, bin_s
        self.bins: dict[int, dict[str, float]] = {}
        self.at = time.time()
        self.running = self.waiting = 0
        self.flushed_at = time.monotonic()
        self.busy_total = 0.0
        self._mm: mmap.mmap | None = None
        if standin:
            with open(standin, "wb") as fh:
                fh.write(b"\0" * 32)
            fd = os.open(standin, os.O_RDWR)
            self._mm = mmap.mmap(fd, 32)
            os.close(fd)
            self._publish()

    def _row(self, k: int) -> dict[str, float]:
        return self.bins.setdefault(
            k, {"busy": 0.0, "busy_span": 0.0, "running": 0.0, "waiting": 0.0, "steps": 0, "graph_steps": 0}
        )

    def _spread(self, key: str, t0: float, t1: float, weight: float = 1.0) -> None:
        """Add weight x the overlap of [t0, t1) with each bin."""
        k = int(t0 // self.bin)
        while t0 < t1:
            edge = min(t1, (k + 1) * self.bin)
            self._row(k)[key] += (edge - t0) * weight
            t0, k = edge, k + 1

    def state(self, running: int, waiting: int) -> None:
        """Integrate the scheduler's counts up to now, then take the new ones."""
        now = time.time()
        if self.running:
            self._spread("running", self.at, now, self.running)
        if self.waiting:
            self._spread("waiting", self.at, now, self.waiting)
        self.at, self.running, self.waiting = now, running, waiting

    def gpu(self, t0: float, t1: float, span: tuple[float, float], graph: bool) -> None:
        """Count one step's GPU time [t0, t1) (and its event span) in the bins."""
        if t1 > t0:
            self._spread("busy", t0, t1)
            self.busy_total += t1 - t0
        if span[1] > span[0]:
            self._spread("busy_span", *span)
        row = self._row(int(t1 // self.bin))
        row["steps"] += 1
        row["graph_steps"] += int(graph)
        self._publish()

    def _publish(self) -> None:
        if self._mm is not None:  # seqlock-free: the stand-in rereads until two reads agree
            self._mm[0:16] = struct.pack("dd", time.time(), self.busy_total)

    def flush(self, force: bool = False) -> None:
        """Append the bins older than one bin to the truth file (every second)."""
        if not force and time.monotonic() - self.flushed_at < 1.0:
            return
        self.flushed_at = time.monotonic()
        self.state(self.running, self.waiting)
        done = int(time.time() // self.bin) - (0 if force else 1)
        rows = [(k, self.bins.pop(k)) for k in sorted(self.bins) if k < done or force]
        if self.path and rows:
            with open(self.path, "a") as fh:
                for k, r in rows:
                    fh.write(json.dumps({"t": round(k * self.bin, 3), **r}) + "\n")


class CpuModel:
    """A stand-in without torch: a step sleeps for its GPU time less its host side, which spins (an eager decode step spins whole)."""

    def __init__(self, cfg: dict[str, Any], truth: Truth, cuda: Any = None) -> None:
        """cuda: the stand-in torch.cuda (bench/scenarios/cpugraphs), whose graphs graph-mode steps replay."""
        self.cfg, self.truth = cfg, truth
        self.caps = tuple(sorted(cfg["capture_sizes"]))
        self.graphs = cpugraphs.capture(cuda, (*self.caps, 0))  # 0: the prefill chunk's graph
        self.info: dict[str, Any] = {"weight_bytes": 0, "cpu_graphs": len(self.graphs)}

    def calibrate(self) -> None:
        """Nothing to calibrate."""

    def step(self, b: int, prefill: bool, mode: str) -> list[int]:
        """Run a step: decode b sequences and maybe one prefill chunk."""
        t0 = time.time()
        gpu = 0.0
        if b:
            cap = max(self.cfg["capture_sizes"])
            gpu += self.cfg["cpu_decode_ms"] / 1000 * (0.7 + 0.3 * b / cap)
        if prefill:
            gpu += self.cfg["cpu_prefill_ms"] / 1000
        if mode == "eager" and b:
            wall = gpu / self.cfg["eager_target_busy"]
            end = time.perf_counter() + wall
            while time.perf_counter() < end:  # eager steps burn CPU in the framework
                pass
            t1 = time.time()
            self.truth.gpu(t1 - gpu, t1, (t0, t1), graph=False)
        else:
            start = time.perf_counter()
            if self.graphs and b:  # the padded batch's graph, as vLLM's capture sizes
                self.graphs[next((c for c in self.caps if c >= b), self.caps[-1])].replay()
            if self.graphs and prefill:
                self.graphs[0].replay()
            # the step's host side overlaps its GPU time (launched asynchronously); only a host side
            # longer than the GPU's, or one held back by a CPU quota (Engine.cap), idles the GPU
            host = self.cfg["cpu_host_ms"] / 1000 * (0.5 + 0.5 * b / max(self.caps)) if b else 0.0
            while time.perf_counter() < start + host:
                pass
            time.sleep(max(0.0, start + gpu - time.perf_counter()))
            t1 = time.time()
            self.truth.gpu(t1 - gpu, t1, (t0, t1), graph=True)
        return [7] * b


def _agent_start(mode: str) -> str:
    """Start boundwatch's agent the way an operator would (the engine's only call into boundwatch)."""
    if mode == "none":
        return "off"
    try:
        from exporter import agent

        if mode == "cupti":
            try:
                return str(agent.start(role="generic", mode="cupti"))
            except TypeError:
                return str(agent.start(role="generic")) + " (no mode argument)"
        return str(agent.start(role="generic"))
    except Exception as exc:  # the lab still runs; the sidecar falls back to NVML
        return f"failed: {type(exc).__name__}: {exc}"


class Engine:
    """The scheduler loop: API-server connections in, steps on the model, gauges and outputs out."""

    def __init__(self, cfg: dict[str, Any], ctl: Connection, listener: Listener) -> None:
        self.cfg, self.ctl, self.listener = cfg, ctl, listener
        self.truth = Truth(cfg["truth_path"], cfg["bin_seconds"], cfg["standin_path"])
        self.model: Any = None
        self.mode = "graph"
        self.waiting: collections.deque[Req] = collections.deque()
        self.running: list[Req] = []
        self.servers: dict[int, Connection] = {}
        self.conns: list[Connection] = []
        self.stats = {"steps": 0, "prompt": 0, "gen": 0, "success": 0}
        self.iters: list[int] = []  # tokens per (step, API server with output in it): vLLM's page
        self.stats_at = time.monotonic()
        self.new_conns: list[Connection] = []
        self.cap = CpuCap()  # emulated CPU quota where no cgroup is writable

    def accept(self) -> None:
        """Take API-server connections as they come (a thread: accept blocks)."""
        while True:
            try:
                self.new_conns.append(self.listener.accept())
            except OSError:
                return

    def handle(self, conn: Connection) -> None:
        """Read everything an API server sent."""
        try:
            while conn.poll():
                msg = conn.recv()
                kind = msg[0]
                if kind == "hello":
                    self.servers[msg[1]] = conn
                elif kind == "add":
                    _, server, rid, n_prompt, max_tokens = msg
                    self.waiting.append(Req(server, rid, n_prompt, max_tokens))
                    self.stats["prompt"] += n_prompt
                elif kind == "abort":
                    self.waiting = collections.deque(r for r in self.waiting if r.server != msg[1])
                    self.running = [r for r in self.running if r.server != msg[1]]
        except (EOFError, OSError):
            self.conns.remove(conn)
            self.servers = {i: c for i, c in self.servers.items() if c is not conn}

    def control(self) -> bool:
        """Read the launcher's messages; False on stop."""
        while self.ctl.poll():
            msg = self.ctl.recv()
            if msg[0] == "stop":
                return False
            if msg[0] == "mode":
                self.mode = msg[1]
            elif msg[0] == "cap":
                self.cap.set(msg[1])
        return True

    def step(self) -> None:
        """Schedule and run one step, then publish the gauges and send the outputs."""
        while self.waiting and len(self.running) < self.cfg["max_num_seqs"]:
            self.running.append(self.waiting.popleft())
        decode = [r for r in self.running if r.prefill_left <= 0]
        prefill = next((r for r in self.running if r.prefill_left > 0), None)
        tokens = self.model.step(len(decode), prefill is not None, self.mode)
        out: dict[int, list[tuple[int, int]]] = collections.defaultdict(list)
        finished: dict[int, list[int]] = collections.defaultdict(list)
        sched: dict[int, int] = collections.Counter()
        for r, tok in zip(decode, tokens, strict=False):
            out[r.server].append((r.rid, tok))
            sched[r.server] += 1
            r.decode_left -= 1
        if prefill is not None:
            chunk = min(self.cfg["chunk_tokens"], prefill.prefill_left)
            prefill.prefill_left -= chunk
            sched[prefill.server] += chunk
            if prefill.prefill_left <= 0:  # the last chunk samples the first token
                out[prefill.server].append((prefill.rid, 1))
                prefill.decode_left -= 1
        self.stats["gen"] += sum(len(v) for v in out.values())
        still = []
        for r in self.running:
            if r.prefill_left <= 0 and r.decode_left <= 0:
                finished[r.server].append(r.rid)
                self.stats["success"] += 1
            else:
                still.append(r)
        self.running = still
        self.stats["steps"] += 1
        self.iters.extend(sched.values())
        self.truth.state(len(self.running), len(self.waiting))
        for server in set(out) | set(finished):
            conn = self.servers.get(server)
            if conn is not None:
                try:
                    conn.send(("out", out.get(server, []), finished.get(server, [])))
                except OSError:
                    pass

    def publish(self, force: bool = False) -> None:
        """Send the launcher what vLLM's stat loggers see (every 50 ms)."""
        if not force and time.monotonic() - self.stats_at < 0.05:
            return
        self.stats_at = time.monotonic()
        self.ctl.send(("stats", len(self.running), len(self.waiting), dict(self.stats), self.iters))
        self.iters = []
        self.truth.flush()

    def serve(self) -> None:
        """Run until stop."""
        threading.Thread(target=self.accept, daemon=True).start()
        while True:
            while self.new_conns:
                self.conns.append(self.new_conns.pop())
            busy = bool(self.running or self.waiting)
            for r in wait([self.ctl, *self.conns], timeout=0 if busy else 0.05):
                if r is self.ctl:
                    if not self.control():
                        self.publish(force=True)
                        self.truth.flush(force=True)
                        return
                else:
                    self.handle(r)  # type: ignore[arg-type]
            if self.running or self.waiting:
                self.step()
            else:
                self.truth.state(0, 0)
            self.publish()
            self.cap.pay()


def run(ctl: Connection, address: str, overrides: dict[str, Any]) -> None:
    """Process entry: title, agent, model, calibration, then serve API servers at `address`."""
    set_title("VLLM::EngineCore")
    cfg = {**DEFAULTS, **overrides}
    info: dict[str, Any] = {"pid": os.getpid(), "device": cfg["device"], "agent_mode": cfg["agent"]}
    listener = Listener(address, family="AF_UNIX")
    engine = Engine(cfg, ctl, listener)
    if cfg["device"] == "cuda":
        import torch

        torch.cuda.init()
        torch.zeros(1, device="cuda")  # CUDA initialised before the agent, as in the field lab
        info["agent"] = _agent_start(cfg["agent"])
        from bench.scenarios.model import GpuModel

        engine.model = GpuModel(cfg, engine.truth)
    else:
        cuda = cpugraphs.install() if cfg["cpu_graphs"] else None  # before the agent, as torch's import
        info["agent"] = _agent_start(cfg["agent"])
        engine.model = CpuModel(cfg, engine.truth, cuda)  # its graphs captured with the hooks in
    t = time.perf_counter()
    engine.model.calibrate()
    info["calibrate_seconds"] = round(time.perf_counter() - t, 3)
    info.update(engine.model.info)
    info["kernels_per_decode_step"] = engine.model.info.get("kernels_per_decode_step")
    ctl.send(("ready", info))
    try:
        engine.serve()
    finally:
        listener.close()
