"""Shared pieces of the agent benchmarks: the real sidecar as a subprocess, /metrics counters, Triton
kernels that stamp %globaltimer (device-side ground truth), and the device clock offset."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)")


class Sidecar:
    """`python -m exporter` on loopback with the agent feed, NVML and GPM; no engine, no host."""

    def __init__(self, sock: str, port: int, log: str) -> None:
        self.sock, self.port, self.log = sock, port, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> bool:
        os.makedirs(os.path.dirname(self.sock), exist_ok=True)
        env = dict(os.environ)
        env.pop("BOUNDWATCH_AGENT", None)
        cmd = [sys.executable, "-m", "exporter", "--address", "127.0.0.1", "--port", str(self.port)]
        cmd += ["--agent-socket", self.sock, "--no-engine", "--no-host", "--log-format", "json"]
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT
        )
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return True
            except OSError:
                if self.proc.poll() is not None:
                    return False
                time.sleep(0.1)
        return False

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(5)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def scrape(self) -> dict[tuple[str, str], float]:
        """Return {(name, labels text): value} of the sidecar's /metrics."""
        page = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5).read().decode()
        out: dict[tuple[str, str], float] = {}
        for line in page.splitlines():
            m = SAMPLE.match(line)
            if m and not line.startswith("#"):
                out[(m.group(1), m.group(2) or "")] = float(m.group(3))
        return out


def busy_ratios(
    m0: dict[tuple[str, str], float], m1: dict[tuple[str, str], float], gpu: str
) -> dict[str, Any]:
    """Return busy ratio per source from counter deltas between two scrapes."""
    out: dict[str, Any] = {}
    for source in ("cupti", "gpm", "nvml"):
        lab = f'gpu="{gpu}",source="{source}"'
        b = m1.get(("boundwatch_gpu_busy_seconds_total", lab), 0) - m0.get(
            ("boundwatch_gpu_busy_seconds_total", lab), 0
        )
        o = m1.get(("boundwatch_gpu_observed_seconds_total", lab), 0) - m0.get(
            ("boundwatch_gpu_observed_seconds_total", lab), 0
        )
        if o > 0:
            out[source] = {"busy_ratio": b / o, "observed_s": o}
    return out


_K: dict[str, Any] = {}


def kernels() -> dict[str, Any]:
    """Build the stamping Triton kernels once."""
    if _K:
        return _K
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["base", "duration_ns"])
    def spin(stamps, base, duration_ns):
        pid = tl.program_id(0)
        t0 = tl.inline_asm_elementwise(
            "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
        )
        now = t0
        while now - t0 < duration_ns:
            now = tl.inline_asm_elementwise(
                "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
            )
        off = base + pid.to(tl.int64) * 2
        tl.store(stamps + off, t0)
        tl.store(stamps + off + 1, now)

    @triton.jit(do_not_specialize=["node", "duration_ns"])
    def spin_indexed(stamps, counter, node, duration_ns, NODES: tl.constexpr, CTAS: tl.constexpr):
        # inside a CUDA graph: the replay number comes from device memory, so every replay keeps its stamps
        pid = tl.program_id(0)
        rep = tl.load(counter)
        t0 = tl.inline_asm_elementwise(
            "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
        )
        now = t0
        while now - t0 < duration_ns:
            now = tl.inline_asm_elementwise(
                "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
            )
        off = ((rep * NODES + node) * CTAS + pid.to(tl.int64)) * 2
        tl.store(stamps + off, t0)
        tl.store(stamps + off + 1, now)

    @triton.jit
    def bump(counter):
        tl.store(counter, tl.load(counter) + 1)

    _K.update(spin=spin, spin_indexed=spin_indexed, bump=bump)
    return _K


def clock_offset_ns(torch: Any, samples: int = 40) -> int:
    """Return CLOCK_REALTIME minus %globaltimer, ns, bounded by host times around a stamping launch."""
    k = kernels()
    stamps = torch.zeros(2 * samples, dtype=torch.int64, device="cuda")
    k["spin"][(1,)](stamps, 0, 0, num_warps=1)
    torch.cuda.synchronize()
    lo, hi = -(2**62), 2**62
    for i in range(samples):
        before = time.time_ns()
        k["spin"][(1,)](stamps, 2 * i, 0, num_warps=1)
        torch.cuda.synchronize()
        after = time.time_ns()
        s = int(stamps[2 * i].item())
        lo, hi = max(lo, before - s), min(hi, after - s)
    return (lo + hi) // 2 if lo <= hi else lo


def union_fraction(intervals: list[tuple[int, int]], lo: int, hi: int) -> float:
    """Return the share of [lo, hi) covered by the union of intervals."""
    clipped = sorted((max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi)
    busy, cur_s, cur_e = 0, None, None
    for s, e in clipped:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        busy += cur_e - cur_s
    return busy / (hi - lo)


def run_fresh(
    script: str,
    key: str,
    name: str,
    args: list[str],
    env_extra: dict[str, str] | None,
    sock: str,
    timeout: float = 240.0,
) -> dict[str, Any]:
    """Run `script --child name *args` in a fresh process (CUPTI cannot be unloaded), with no inherited
    BOUNDWATCH_AGENT_* but a socket nobody listens on (every message dropped and counted); return its
    RESULT line, or {key: name, "error", "rc"} when it printed none."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOUNDWATCH_AGENT")}
    env["BOUNDWATCH_AGENT_SOCKET"] = sock
    env.update(env_extra or {})
    p = subprocess.run(
        [sys.executable, script, "--child", name, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if not line:
        print(name, "FAILED", p.stderr[-800:], flush=True)
        return {key: name, "error": p.stderr[-2000:], "rc": p.returncode}
    return dict(json.loads(line[0][7:]))
