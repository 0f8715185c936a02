"""The lab engine's GPU model: a 16-layer bf16 decoder, per-batch decode CUDA graphs, a prefill-chunk graph, self-calibration.

Decode at batch b runs about 50 kernels a layer (RMS norms, fused QKV, a rotary mix, a toy
attention over a ring KV cache, SwiGLU MLP, bookkeeping), ~800 a step. Calibration (at start,
with the agent already running, so its cost is included):
1. grow the MLP until the graph step's GPU time is >= 90% of an eager step's wall time (the
   eager step is then close to GPU-bound, the way a real model's is);
2. capture decode graphs for every capture size and a prefill graph whose rows make one chunk
   take `prefill_chunk_ms`;
3. add CPU-only framework work (views) to the eager step until its busy share (NVML GPM where
   the GPU has it, else the graph time over the step's wall time) reads `eager_target_busy`.
"""

from __future__ import annotations

import statistics
import time
from typing import Any


class Gpm:
    """GPM GRAPHICS_UTIL of this process's GPU between two samples (None where NVML or GPM is missing)."""

    def __init__(self, torch: Any) -> None:
        self.nvml: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = None
            uuid = str(getattr(torch.cuda.get_device_properties(0), "uuid", "") or "")
            if uuid:
                try:
                    handle = pynvml.nvmlDeviceGetHandleByUUID(
                        uuid if uuid.startswith("GPU-") else "GPU-" + uuid
                    )
                except Exception:
                    handle = None
            self.handle = handle if handle is not None else pynvml.nvmlDeviceGetHandleByIndex(0)
            if not pynvml.nvmlGpmQueryDeviceSupport(self.handle).isSupportedDevice:
                return
            self.samples = (pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc())
            self.nvml = pynvml
        except Exception:
            self.nvml = None

    def begin(self) -> None:
        """Take the first sample."""
        if self.nvml is not None:
            self.nvml.nvmlGpmSampleGet(self.handle, self.samples[0])

    def end(self) -> float | None:
        """Take the second sample and return the busy share between the two."""
        if self.nvml is None:
            return None
        nv = self.nvml
        nv.nvmlGpmSampleGet(self.handle, self.samples[1])
        req = nv.c_nvmlGpmMetricsGet_t()
        req.version = nv.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = 1
        req.sample1, req.sample2 = self.samples
        req.metrics[0].metricId = nv.NVML_GPM_METRIC_GRAPHICS_UTIL
        nv.nvmlGpmMetricsGet(req)
        return float(req.metrics[0].value) / 100.0 if req.metrics[0].nvmlReturn == 0 else None


class GpuModel:
    """Weights, graphs, the step and its truth on a real GPU."""

    def __init__(self, cfg: dict[str, Any], truth: Any) -> None:
        import torch

        self.torch, self.cfg, self.truth = torch, dict(cfg), truth
        self.dev = torch.device("cuda")
        self.caps = tuple(sorted(cfg["capture_sizes"]))
        self.bmax = self.caps[-1]
        self.graphs: dict[int, Any] = {}
        self.graph_s: dict[int, float] = {}
        self.pgraph: Any = None
        self.prefill_s = 0.0
        self.views = int(cfg["views"])
        self.info: dict[str, Any] = {}
        self.host_tok = torch.zeros(self.bmax, dtype=torch.int64).pin_memory()
        self._build(int(cfg["ffn"]), 256)
        torch.cuda.synchronize()
        self.ref = torch.cuda.Event(enable_timing=True)
        self.ref.record()
        self.ref.synchronize()
        self.ref_wall = time.time()

    # --- the model ------------------------------------------------------------------------

    def _build(self, ffn: int, rows: int) -> None:
        torch, c = self.torch, self.cfg
        h, bf = c["hidden"], torch.bfloat16
        self.graphs, self.pgraph = {}, None
        torch.cuda.empty_cache()
        gen = torch.Generator(device=self.dev).manual_seed(0)

        def w(*shape: int) -> Any:
            return torch.randn(*shape, device=self.dev, dtype=bf, generator=gen) * 0.02

        self.ffn = ffn
        self.layers = [
            {
                "n1": torch.ones(h, device=self.dev, dtype=bf),
                "wqkv": w(h, 3 * h),
                "wo": w(h, h),
                "n2": torch.ones(h, device=self.dev, dtype=bf),
                "wgu": w(h, 2 * ffn),
                "wd": w(ffn, h),
                "kc": torch.zeros(self.bmax, c["ctx"], h, device=self.dev, dtype=bf),
                "vc": torch.zeros(self.bmax, c["ctx"], h, device=self.dev, dtype=bf),
            }
            for _ in range(c["layers"])
        ]
        self.norm = torch.ones(h, device=self.dev, dtype=bf)
        self.lm = w(h, c["vocab"])
        self.cos, self.sin = w(h) + 1.0, w(h)
        self.pos = torch.zeros(1, device=self.dev, dtype=torch.int64)
        self.side = torch.zeros(self.bmax, 64, device=self.dev, dtype=torch.float32)
        self.x_in = w(self.bmax, h)
        self.tok_out = torch.zeros(self.bmax, device=self.dev, dtype=torch.int64)
        self._rows(rows)
        self.info["weight_bytes"] = (
            sum(t.numel() * t.element_size() for lay in self.layers for k, t in lay.items() if k[0] in "wn")
            + self.lm.numel() * self.lm.element_size()
        )

    def _rows(self, rows: int) -> None:
        self.rows = rows
        self.px = self.torch.randn(rows, self.cfg["hidden"], device=self.dev, dtype=self.torch.bfloat16)

    def _norm(self, x: Any, weight: Any) -> Any:
        torch = self.torch
        xf = x.float()
        var = xf.pow(2).mean(-1, keepdim=True)
        return (xf * torch.rsqrt(var + 1e-6)).to(torch.bfloat16) * weight

    def _views(self, x: Any) -> None:
        for k in range(self.views):  # CPU-only framework work (what graphs remove)
            x.narrow(1, k % 64, 1).squeeze(1)

    def forward(self, b: int, eager: bool = False) -> None:
        """Decode one token for b sequences: x_in[:b] -> tok_out[:b] (about 800 kernels)."""
        torch = self.torch
        f = torch.nn.functional
        h = self.cfg["hidden"]
        x = self.x_in[:b]
        scale = h**-0.5
        for lay in self.layers:
            a = self._norm(x, lay["n1"])
            q, k, v = (a @ lay["wqkv"]).split(h, dim=-1)
            q = q * self.cos + torch.roll(q, 1, -1) * self.sin
            k = k * self.cos + torch.roll(k, 1, -1) * self.sin
            kc, vc = lay["kc"][:b], lay["vc"][:b]
            kc.index_copy_(1, self.pos, k.unsqueeze(1))
            vc.index_copy_(1, self.pos, v.unsqueeze(1))
            s = torch.bmm(kc, q.unsqueeze(-1)).squeeze(-1) * scale
            p = torch.softmax(s.float(), -1).to(torch.bfloat16)
            o = torch.bmm(p.unsqueeze(1), vc).squeeze(1)
            x = x + o @ lay["wo"]
            a = self._norm(x, lay["n2"])
            g, u = (a @ lay["wgu"]).chunk(2, -1)
            x = x + (f.silu(g) * u) @ lay["wd"]
            for _ in range(self.cfg["tiny_ops"] // 2):
                self.side[:b].mul_(0.5).add_(0.5)
            if eager:
                self._views(x)
        logits = self._norm(x, self.norm) @ self.lm
        self.tok_out[:b].copy_(logits.argmax(dim=-1))
        self.pos.add_(1).remainder_(self.cfg["ctx"])

    def prefill(self, eager: bool = False) -> None:
        """Run one prefill chunk (`rows` rows through every layer's projections)."""
        f = self.torch.nn.functional
        h = self.cfg["hidden"]
        x = self.px
        for lay in self.layers:
            a = self._norm(x, lay["n1"])
            x = x + (a @ lay["wqkv"])[:, :h] @ lay["wo"]
            a = self._norm(x, lay["n2"])
            g, u = (a @ lay["wgu"]).chunk(2, -1)
            x = x + (f.silu(g) * u) @ lay["wd"]
            if eager:
                self._views(x)

    def _capture(self, fn: Any) -> Any:
        torch = self.torch
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self._pool):
            fn()
        torch.cuda.synchronize()
        return g

    def capture_all(self) -> None:
        """Capture a decode graph for every capture size (largest first) and the prefill graph."""
        self._pool = self.torch.cuda.graph_pool_handle()
        for b in reversed(self.caps):
            self.graphs[b] = self._capture(lambda b=b: self.forward(b))
        self._pool = self.torch.cuda.graph_pool_handle()  # its own pool: replayed right after a decode graph
        self.pgraph = self._capture(self.prefill)
        for b, g in self.graphs.items():
            self.graph_s[b] = self._gpu_time(g.replay)
        self.prefill_s = self._gpu_time(self.pgraph.replay)

    def _gpu_time(self, fn: Any, n: int = 20) -> float:
        """Return the GPU seconds of fn, launched n times back to back (no launch gaps)."""
        torch = self.torch
        for _ in range(3):
            fn()
        a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(n):
            fn()
        z.record()
        z.synchronize()
        return a.elapsed_time(z) / 1000 / n

    # --- the step -------------------------------------------------------------------------

    def cap_of(self, b: int) -> int:
        """Return the capture size a batch of b pads to."""
        return next(c for c in self.caps if c >= b)

    def step(self, b: int, prefill: bool, mode: str) -> list[int]:
        """Launch one step (decode b, maybe one prefill chunk), wait for it, record its truth, return b tokens."""
        torch = self.torch
        eager = mode == "eager"
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        model_s = 0.0
        if b:
            cap = self.cap_of(b)
            if eager:
                self.forward(b, eager=True)
            else:
                self.graphs[cap].replay()
            model_s += self.graph_s.get(cap, 0.0)
            self.host_tok[:b].copy_(self.tok_out[:b], non_blocking=True)
        if prefill:
            if eager:
                self.prefill(eager=True)
            else:
                self.pgraph.replay()
            model_s += self.prefill_s
        end.record()
        end.synchronize()
        span = start.elapsed_time(end) / 1000
        t0 = self.ref_wall + self.ref.elapsed_time(start) / 1000
        t1 = t0 + span
        if eager:  # events include the launch gaps: count the same work's graph GPU time
            self.truth.gpu(t1 - min(model_s, span), t1, (t0, t1), graph=False)
        else:
            self.truth.gpu(t0, t1, (t0, t1), graph=True)
        return self.host_tok[:b].tolist() if b else []

    # --- calibration ----------------------------------------------------------------------

    def _eager_loop(self, seconds: float, gpm: Gpm) -> tuple[float, float | None, float]:
        """Run eager decode steps at the largest batch for `seconds`; return (wall per step, GPM busy, event busy)."""
        torch = self.torch
        walls = []
        gpm.begin()
        end = time.perf_counter() + seconds
        t_all = time.perf_counter()
        while time.perf_counter() < end:
            t = time.perf_counter()
            self.forward(self.bmax, eager=True)
            self.host_tok.copy_(self.tok_out, non_blocking=True)
            torch.cuda.current_stream().synchronize()
            walls.append(time.perf_counter() - t)
        total = time.perf_counter() - t_all
        busy = gpm.end()
        g = self.graph_s.get(self.bmax) or 0.0
        return statistics.median(walls), busy, g * len(walls) / total

    def calibrate(self) -> None:
        """Shape the model and the eager step (see the module docstring); record what was found in info."""
        torch, c = self.torch, self.cfg
        if not c["calibrate"]:
            self.capture_all()
            return
        tries = []
        for attempt in range(4):
            self._pool = torch.cuda.graph_pool_handle()
            g8 = self._gpu_time(self._capture(lambda: self.forward(self.bmax)).replay)
            walls = []
            for _ in range(15):
                t = time.perf_counter()
                self.forward(self.bmax, eager=True)
                torch.cuda.synchronize()
                walls.append(time.perf_counter() - t)
            w = statistics.median(walls[3:])
            tries.append(
                {"ffn": self.ffn, "graph_ms": round(g8 * 1e3, 3), "eager_wall_ms": round(w * 1e3, 3)}
            )
            ratio = g8 / w
            if ratio >= 0.9 or self.ffn >= 65536 or attempt == 3:
                break
            grow = min(4.0, 1.0 + 1.5 * (0.95 / ratio - 1.0))
            self._build(min(65536, max(self.ffn + 1024, int(self.ffn * grow) // 1024 * 1024)), self.rows)
        self.info["ffn_tries"] = tries
        # prefill rows: one chunk takes prefill_chunk_ms
        self._pool = torch.cuda.graph_pool_handle()
        t_rows = self._gpu_time(self._capture(self.prefill).replay)
        rows = int(self.rows * c["prefill_chunk_ms"] / 1000 / max(t_rows, 1e-6)) // 16 * 16
        self._rows(max(16, min(16384, rows)))
        self.capture_all()
        self._tune_views(Gpm(torch))
        self.info.update(
            ffn=self.ffn,
            prefill_rows=self.rows,
            prefill_chunk_ms=round(self.prefill_s * 1e3, 3),
            graph_ms={b: round(s * 1e3, 3) for b, s in sorted(self.graph_s.items())},
            kernels_per_decode_step=self.cfg["layers"] * (40 + self.cfg["tiny_ops"]) + 13,
        )

    def _tune_views(self, gpm: Gpm) -> None:
        """Add views to the eager step until its busy share reads eager_target_busy."""
        target = self.cfg["eager_target_busy"]
        x = self.x_in[: self.bmax]
        t = time.perf_counter()
        for k in range(20000):
            x.narrow(1, k % 64, 1).squeeze(1)
        per_view = (time.perf_counter() - t) / 20000
        trials = []
        for _ in range(4):
            wall, busy_gpm, busy_ev = self._eager_loop(0.8, gpm)
            busy = busy_gpm if busy_gpm is not None else busy_ev
            trials.append(
                {
                    "views": self.views,
                    "wall_ms": round(wall * 1e3, 3),
                    "gpm": busy_gpm,
                    "graph_time_over_wall": round(busy_ev, 4),
                }
            )
            if abs(busy - target) < 0.03 or (busy < target and self.views == 0):
                break
            want = wall * busy / target
            self.views = max(0, self.views + round((want - wall) / (self.cfg["layers"] * per_view)))
        self.info["eager_tune"] = {
            "per_view_us": round(per_view * 1e6, 3),
            "trials": trials,
            "views": self.views,
        }
