"""Run the probe's Triton kernels: HBM copy bandwidth, a calibrated duty-cycle load, a bf16 matmul.

torch, triton and pynvml are imported inside the functions, so importing this module is free
and works on a machine without them; `load_backend()` says why the probe cannot run.
Truth for the duty-cycle load comes from the device itself: every CTA of every burst stamps
%globaltimer when it starts and when it stops, so the achieved busy fraction is known
independently of CUPTI, NVML and the host.
"""

from __future__ import annotations

import platform
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from exporter.probe import check as check_mod
from exporter.probe import logic

GIB = 1 << 30
SETTLE_WITH_SIDECAR = 3.0  # s of load before a phase's window opens when the sidecar's counters are read
SETTLE_LOCAL = 1.0  # s, when only the probe's own NVML/GPM samples are read
CUPTI_LAG_SECONDS = 1.5  # typical age of the newest CUPTI window in the sidecar's counters


class ProbeUnavailable(RuntimeError):
    """The probe cannot run here: no GPU, no torch or Triton, not enough memory."""


def load_backend() -> tuple[Any, Any, Any]:
    """Return (torch, triton, triton.language), or raise ProbeUnavailable saying what is missing."""
    try:
        import torch
    except ImportError as exc:
        raise ProbeUnavailable(
            f"torch is not installed ({exc}); install boundwatch[probe] in a CUDA env"
        ) from exc
    try:
        import triton
        import triton.language as tl
    except ImportError as exc:
        raise ProbeUnavailable(f"triton is not installed ({exc}); pip install 'boundwatch[probe]'") from exc
    if not torch.cuda.is_available():
        raise ProbeUnavailable("no CUDA GPU is visible to torch (driver, CUDA_VISIBLE_DEVICES or container?)")
    return torch, triton, tl


_KERNELS: dict[str, Any] = {}


def kernels() -> dict[str, Any]:
    """Build the Triton kernels once (on first use) and return them by name."""
    if _KERNELS:
        return _KERNELS
    _, triton, tl = load_backend()

    @triton.jit
    def copy_kernel(src, dst, n, BLOCK: tl.constexpr):  # type: ignore[name-defined]
        pid = tl.program_id(0)
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)

    @triton.jit(do_not_specialize=["base", "duration_ns"])
    def spin_kernel(stamps, base, duration_ns):
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

    @triton.jit
    def matmul_kernel(
        a, b, c, M, N, K,
        sam, sak, sbk, sbn, scm, scn,
        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr,  # type: ignore[name-defined]
    ):  # fmt: skip
        pid = tl.program_id(0)
        num_m = tl.cdiv(M, BM)
        num_n = tl.cdiv(N, BN)
        in_group = GROUP * num_n
        group = pid // in_group
        first_m = group * GROUP
        size_m = min(num_m - first_m, GROUP)
        pid_m = first_m + ((pid % in_group) % size_m)
        pid_n = (pid % in_group) // size_m
        rm = (pid_m * BM + tl.arange(0, BM)) % M
        rn = (pid_n * BN + tl.arange(0, BN)) % N
        rk = tl.arange(0, BK)
        pa = a + rm[:, None] * sam + rk[None, :] * sak
        pb = b + rk[:, None] * sbk + rn[None, :] * sbn
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BK)):
            x = tl.load(pa, mask=rk[None, :] < K - k * BK, other=0.0)
            y = tl.load(pb, mask=rk[:, None] < K - k * BK, other=0.0)
            acc = tl.dot(x, y, acc)
            pa += BK * sak
            pb += BK * sbk
        cm = pid_m * BM + tl.arange(0, BM)
        cn = pid_n * BN + tl.arange(0, BN)
        pc = c + cm[:, None] * scm + cn[None, :] * scn
        tl.store(pc, acc.to(tl.bfloat16), mask=(cm[:, None] < M) & (cn[None, :] < N))

    _KERNELS.update(copy=copy_kernel, spin=spin_kernel, matmul=matmul_kernel)
    return _KERNELS


def _median_ms(torch: Any, fn: Callable[[int], None], reps: int, warmup: int = 3) -> list[float]:
    """Time fn(i) for i in range(reps) with CUDA events; return each rep's milliseconds."""
    for i in range(warmup):
        fn(i)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        fn(i)
        ends[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]


def measure_bandwidth(
    device: int,
    buffer_bytes: int = 4 * GIB,
    pairs: int = 2,
    reps: int = 30,
    thresholds: logic.Thresholds | None = None,
) -> dict[str, Any]:
    """Copy `pairs` rotating src->dst buffers with the Triton kernel and with torch copy_; compare."""
    torch, _, _ = load_backend()
    k = kernels()
    block = 1024
    free, _total = torch.cuda.mem_get_info(device)
    # Leave half the free memory alone (an idle engine may hold most of the card).
    fit = int(free * 0.5) // (2 * pairs)
    size = min(buffer_bytes, fit) // (4 * block) * (4 * block)
    if size < 256 * (1 << 20):
        raise ProbeUnavailable(
            f"only {free / GIB:.1f} GiB free on GPU {device}: too little for the bandwidth probe"
        )
    n = size // 4
    with torch.cuda.device(device):
        srcs = [torch.randn(n, device=device, dtype=torch.float32) for _ in range(pairs)]
        dsts = [torch.full((n,), float("nan"), device=device, dtype=torch.float32) for _ in range(pairs)]
        grid = (n // block,)

        def triton_copy(i: int) -> None:
            k["copy"][grid](srcs[i % pairs], dsts[i % pairs], n, BLOCK=block, num_warps=4)

        def torch_copy(i: int) -> None:
            dsts[i % pairs].copy_(srcs[i % pairs])

        for i in range(pairs):
            triton_copy(i)
        torch.cuda.synchronize()
        verified = all(bool(torch.equal(s, d)) for s, d in zip(srcs, dsts, strict=True))
        probe_ms: list[float] = []
        torch_ms: list[float] = []
        for _ in range(2):  # interleave, so clock or thermal drift hits both alike
            probe_ms += _median_ms(torch, triton_copy, reps)
            torch_ms += _median_ms(torch, torch_copy, reps)
    moved = 2 * size  # bytes read + bytes written per copy
    probe_bps = moved / (statistics.median(probe_ms) / 1e3)
    torch_bps = moved / (statistics.median(torch_ms) / 1e3)
    name = torch.cuda.get_device_name(device)
    out = logic.evaluate_bandwidth(probe_bps, torch_bps, logic.nominal_for(name), verified, thresholds)
    out.update(
        buffer_bytes=size,
        buffers=pairs,
        bytes_per_copy=moved,
        reps=len(probe_ms),
        median_seconds=statistics.median(probe_ms) / 1e3,
        torch_median_seconds=statistics.median(torch_ms) / 1e3,
        verified=verified,
        kernel="triton copy, BLOCK 1024, 4 warps, fp32",
    )
    return out


def measure_matmul(device: int, size: int = 8192, reps: int = 10) -> dict[str, Any]:
    """Time a bf16 Triton matmul (fp32 accumulate) against torch.matmul on random data."""
    torch, triton, _ = load_backend()
    k = kernels()
    with torch.cuda.device(device):
        a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
        b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
        c = torch.full((size, size), float("nan"), device=device, dtype=torch.bfloat16)
        bm, bn, bk = 128, 256, 64
        grid = (triton.cdiv(size, bm) * triton.cdiv(size, bn),)

        def tri(_: int) -> None:
            k["matmul"][grid](
                a, b, c, size, size, size,
                a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
                BM=bm, BN=bn, BK=bk, GROUP=8, num_warps=8, num_stages=3,
            )  # fmt: skip

        ref = torch.empty_like(c)

        def tor(_: int) -> None:
            torch.matmul(a, b, out=ref)

        tri(0)
        tor(0)
        torch.cuda.synchronize()
        rel = float((c.float() - ref.float()).norm() / ref.float().norm())
        tri_ms = statistics.median(_median_ms(torch, tri, reps))
        tor_ms = statistics.median(_median_ms(torch, tor, reps))
    flops = 2.0 * size**3
    nominal = logic.nominal_for(torch.cuda.get_device_name(device))
    rate = flops / (tri_ms / 1e3)
    ok = rel == rel and rel < 1e-2  # NaN never passes
    return {
        "size": size,
        "flops_per_second": rate,
        "torch_flops_per_second": flops / (tor_ms / 1e3),
        "ratio_to_torch": (flops / (tri_ms / 1e3)) / (flops / (tor_ms / 1e3)),
        "nominal_flops_per_second": nominal.bf16_flops if nominal else None,
        "ratio_to_nominal": rate / nominal.bf16_flops if nominal and nominal.bf16_flops else None,
        "relative_error_vs_torch": rel,
        "checks": [
            logic.check("matmul_correct", ok, f"relative error {rel:.2e} against torch.matmul (max 1e-2)")
        ],
    }


# --- NVML in the probe's own process (the reference when no sidecar is given) ------------------


class _Nvml:
    """NVML utilization samples and GPM for the probe's GPU; every call fails soft."""

    def __init__(self, uuid: str | None, pci: str | None) -> None:
        self.handle: Any = None
        self.error = ""
        try:
            import pynvml

            self.nv = pynvml
            pynvml.nvmlInit()
            if uuid:
                try:
                    self.handle = pynvml.nvmlDeviceGetHandleByUUID("GPU-" + check_mod.normalize_uuid(uuid))
                except Exception:
                    self.handle = None
            if self.handle is None and pci:
                self.handle = pynvml.nvmlDeviceGetHandleByPciBusId(pci)
        except Exception as exc:
            self.error = f"nvml: {exc}"
            self.handle = None

    def index(self) -> int | None:
        """Return the NVML index of the GPU."""
        try:
            return int(self.nv.nvmlDeviceGetIndex(self.handle)) if self.handle is not None else None
        except Exception:
            return None

    def gpm_sample(self) -> Any:
        """Take a GPM sample, or return None."""
        if self.handle is None:
            return None
        try:
            s = self.nv.nvmlGpmSampleAlloc()
            self.nv.nvmlGpmSampleGet(self.handle, s)
            return s
        except Exception:
            return None

    def gpm_between(self, s1: Any, s2: Any) -> dict[str, float]:
        """Return GRAPHICS_UTIL and SM_UTIL (0-1) between two samples."""
        if s1 is None or s2 is None:
            return {}
        try:
            mg = self.nv.c_nvmlGpmMetricsGet_t()
            mg.version = self.nv.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = 2
            mg.sample1, mg.sample2 = s1, s2
            mg.metrics[0].metricId = self.nv.NVML_GPM_METRIC_GRAPHICS_UTIL
            mg.metrics[1].metricId = self.nv.NVML_GPM_METRIC_SM_UTIL
            self.nv.nvmlGpmMetricsGet(mg)
            out = {}
            if mg.metrics[0].nvmlReturn == 0:
                out["gpm"] = mg.metrics[0].value / 100.0
            if mg.metrics[1].nvmlReturn == 0:
                out["gpm_sm"] = mg.metrics[1].value / 100.0
            return out
        except Exception:
            return {}
        finally:
            for s in (s1, s2):
                try:
                    self.nv.nvmlGpmSampleFree(s)
                except Exception:
                    pass

    def utilization_between(self, lo_us: int, hi_us: int) -> float | None:
        """Return the mean NVML utilization sample stamped in (lo + 200 ms, hi] (each covers the last 200 ms)."""
        if self.handle is None:
            return None
        try:
            _, samples = self.nv.nvmlDeviceGetSamples(
                self.handle, self.nv.NVML_GPU_UTILIZATION_SAMPLES, lo_us
            )
        except Exception:
            return None
        vals = [s.sampleValue.uiVal for s in samples if lo_us + 200_000 < s.timeStamp <= hi_us]
        return sum(vals) / len(vals) / 100.0 if vals else None


# --- the duty-cycle load ----------------------------------------------------------------------


def sleep_until(t: float) -> None:
    """Wait until perf_counter reaches t: sleep most of the way, spin the last 0.4 ms."""
    while True:
        rem = t - time.perf_counter()
        if rem <= 0:
            return
        if rem > 0.0006:
            time.sleep(rem - 0.0004)


class _Observer(threading.Thread):
    """At two host times, take a GPM sample and (when a URL is set) fetch the sidecar's page."""

    def __init__(self, at: Sequence[float], nvml: _Nvml, url: str | None) -> None:
        super().__init__(daemon=True, name="boundwatch-probe-observer")
        self.at, self.nvml, self.url = list(at), nvml, url
        self.marks: list[dict[str, Any]] = []
        self.done = threading.Event()

    def run(self) -> None:
        try:
            for t in self.at:
                sleep_until(t)
                mark: dict[str, Any] = {"wall_ns": time.time_ns(), "gpm": self.nvml.gpm_sample()}
                if self.url:
                    try:
                        mark["page"] = check_mod.fetch(self.url)
                    except Exception as exc:
                        mark["page_error"] = f"{type(exc).__name__}: {exc}"
                self.marks.append(mark)
        finally:
            self.done.set()


def _bursts(
    device: int, plan: logic.DutyPlan, seconds: float, settle: float, nvml: _Nvml, check_url: str | None
) -> tuple[list[tuple[int, int]], list[int], int, int, _Observer]:
    """Launch the plan's spin bursts for settle + seconds while an observer marks the window.

    Return each burst's [first CTA start, last CTA end] on the device clock, the host time after
    each, the CTAs a burst ran, the stamps left unwritten, and the observer (its two marks).
    """
    torch, _, _ = load_backend()
    k = kernels()
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    ctas = 2 * sms
    stride = -(-2 * ctas // 16) * 16  # slots per burst, padded so every base is 16-aligned
    n_max = plan.bursts_within(settle + seconds + 0.5) + 16
    duration_ns = round(plan.kernel_seconds * 1e9)
    with torch.cuda.device(device):
        stamps = torch.zeros(n_max * stride, device=device, dtype=torch.int64)
        host_after: list[int] = []
        t_start = time.perf_counter()
        obs = _Observer([t_start + settle, t_start + settle + seconds], nvml, check_url)
        obs.start()
        launch = t_start
        b = 0
        while not obs.done.is_set() and b < n_max:
            sleep_until(launch)
            k["spin"][(ctas,)](stamps, b * stride, duration_ns, num_warps=1)
            torch.cuda.synchronize()
            host_after.append(time.time_ns())
            b += 1
            launch = logic.next_launch(launch, plan.period_seconds, time.perf_counter())
        obs.join(timeout=10)
        view = stamps[: b * stride].view(b, stride)[:, : 2 * ctas].reshape(b, ctas, 2)
        starts = view[:, :, 0].min(dim=1).values.tolist()
        ends = view[:, :, 1].max(dim=1).values.tolist()
        unwritten = int((view == 0).sum().item())
    return list(zip(starts, ends, strict=True)), host_after, ctas, unwritten, obs


def _sidecar_busy(
    m0: dict[str, Any],
    m1: dict[str, Any],
    gpu_label: str | None,
    bursts: list[tuple[int, int]],
    lo: int,
    hi: int,
) -> tuple[dict[str, Any], dict[str, float], float]:
    """Return the sidecar's part of a phase, its busy by source between the two marks, and the truth they compare with."""
    side: dict[str, dict[str, float]] = {}
    errors = [m[key] for m in (m0, m1) for key in ("page_error",) if key in m]
    if not errors and gpu_label is not None:
        side = logic.busy_from_counters(
            check_mod.busy_counters(m0["page"], gpu_label), check_mod.busy_counters(m1["page"], gpu_label)
        )
    sources = {s: v["busy_ratio"] for s, v in side.items()}
    truth = logic.busy_fraction(bursts, lo, hi)
    if "cupti" in sources:
        # CUPTI counters cover the windows the agent closed 1-2.3 s before each scrape
        lag = int(CUPTI_LAG_SECONDS * 1e9)
        truth = logic.busy_fraction(bursts, lo - lag, hi - lag)
    return {"gpu_label": gpu_label, "errors": errors, "sources": side, "truth": truth}, sources, truth


def run_duty_phase(
    device: int,
    plan: logic.DutyPlan,
    seconds: float,
    settle: float,
    nvml: _Nvml,
    check_url: str | None,
    gpu_label: str | None,
    thresholds: logic.Thresholds | None = None,
    require_source: str | None = None,
) -> dict[str, Any]:
    """Run one duty phase: bursts on the plan's schedule for settle + seconds; measure [settle, end)."""
    bursts, host_after, ctas, unwritten, obs = _bursts(device, plan, seconds, settle, nvml, check_url)
    offset = logic.clock_offset_ns(host_after, [e for _, e in bursts])
    out: dict[str, Any] = {
        "target": plan.target,
        "kernel_seconds": plan.kernel_seconds,
        "period_seconds": plan.period_seconds,
        "ctas": ctas,
        "bursts": len(bursts),
        "unwritten_stamps": unwritten,
        "truth_steady": logic.steady_fraction(bursts),
        "burst_seconds_median": statistics.median(e - s for s, e in bursts) / 1e9,
    }
    name = f"duty_{plan.target:g}"
    if len(obs.marks) < 2:
        checks = [logic.check(f"{name}_observer", False, "the observer missed its marks")]
        out.update(truth=out["truth_steady"], checks=checks, **{"pass": False})
        return out
    m0, m1 = obs.marks[0], obs.marks[1]
    lo, hi = m0["wall_ns"] - offset, m1["wall_ns"] - offset  # the window on the device clock
    truth = logic.busy_fraction(bursts, lo, hi)
    local: dict[str, float] = dict(nvml.gpm_between(m0["gpm"], m1["gpm"]))
    util = nvml.utilization_between(m0["wall_ns"] // 1000, m1["wall_ns"] // 1000)
    if util is not None:
        local["nvml"] = util
    out["window_seconds"] = (hi - lo) / 1e9
    out["truth_window"] = truth  # over exactly the probe's window; local sources compare with it
    out["local_sources"] = {
        s: {"busy_ratio": v, "error": v - truth} for s, v in local.items()
    }  # measured by the probe's own NVML
    sources = {s: v for s, v in local.items() if s in ("gpm", "nvml")}
    if check_url:
        out["sidecar"], sources, truth = _sidecar_busy(m0, m1, gpu_label, bursts, lo, hi)
    out.update(logic.evaluate_duty_phase(plan.target, truth, sources, thresholds, require_source))
    failed = []
    if check_url and not sources:
        failed.append(
            logic.check(f"{name}_sidecar", False, f"no busy counters for gpu {gpu_label} at {check_url}")
        )
    if unwritten:
        failed.append(logic.check(f"{name}_stamps", False, f"{unwritten} stamps unwritten"))
    if failed:
        out["checks"].extend(failed)
        out["pass"] = False
    return out


# --- the whole probe --------------------------------------------------------------------------


def start_agent() -> dict[str, Any]:
    """Attach the in-process CUPTI agent (exporter.agent.start) when it exists; say what happened."""
    try:
        from exporter import agent
    except Exception as exc:
        return {"attached": False, "detail": f"exporter.agent not importable: {exc}"}
    start = getattr(agent, "start", None)
    if start is None:
        return {"attached": False, "detail": "exporter.agent has no start()"}
    try:
        res = start(mode="cupti")
    except Exception as exc:
        return {"attached": False, "detail": f"exporter.agent.start() failed: {type(exc).__name__}: {exc}"}
    ok = res == "running" if isinstance(res, str) else bool(res)
    return {"attached": ok, "state": str(res), "detail": f"exporter.agent.start() returned {res!r}"}


def device_info(device: int) -> dict[str, Any]:
    """Return the name, UUID, PCI id, SM count and memory of a CUDA device."""
    torch, triton, _ = load_backend()
    props = torch.cuda.get_device_properties(device)
    uuid = str(getattr(props, "uuid", "") or "")
    pci = None
    if hasattr(props, "pci_bus_id"):
        pci = f"{getattr(props, 'pci_domain_id', 0):08X}:{props.pci_bus_id:02X}:{getattr(props, 'pci_device_id', 0):02X}.0"
    return {
        "index": device,
        "name": props.name,
        "uuid": uuid,
        "pci_bus_id": pci,
        "sm_count": props.multi_processor_count,
        "memory_total_bytes": int(props.total_memory),
        "capability": f"{props.major}.{props.minor}",
        "versions": {
            "torch": torch.__version__,
            "triton": triton.__version__,
            "python": platform.python_version(),
        },
    }


def _sidecar_gpu_label(check_url: str, info: dict[str, Any], result: dict[str, Any]) -> str | None:
    """Return the sidecar's label for this GPU (by UUID, else NVML's index); note a failed fetch in result."""
    gpu_label = None
    try:
        page = check_mod.fetch(check_url)
        gpu_label = check_mod.gpu_label_for_uuid(page, info["uuid"]) if info["uuid"] else None
    except Exception as exc:
        result["sidecar_error"] = f"{type(exc).__name__}: {exc}"
    if gpu_label is None and info["nvml_index"] is not None:
        gpu_label = str(info["nvml_index"])
    return gpu_label


def _run_duty(
    device: int,
    duty: Sequence[float],
    seconds: float,
    settle: float,
    check_url: str | None,
    thresholds: logic.Thresholds | None,
    result: dict[str, Any],
    nvml: _Nvml,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Run the duty phases one after another; return the probe's "duty" part."""
    torch, _, _ = load_backend()
    info = result["device"]
    gpu_label = _sidecar_gpu_label(check_url, info, result) if check_url else None
    # warm the spin kernel (compile) outside any measured window
    warm = torch.zeros(2 * 2 * info["sm_count"], device=device, dtype=torch.int64)
    kernels()["spin"][(2 * info["sm_count"],)](warm, 0, 1000, num_warps=1)
    torch.cuda.synchronize()
    require = "cupti" if check_url and result["agent"]["attached"] else None
    phases = []
    for target in duty:
        log(f"duty phase {target:g}")
        plan = logic.plan_duty(target)
        phases.append(
            run_duty_phase(device, plan, seconds, settle, nvml, check_url, gpu_label, thresholds, require)
        )
    return {"seconds": seconds, "settle_seconds": settle, "check_url": check_url, "phases": phases}


def run_probe(
    device: int = 0,
    duty: Sequence[float] = (0.25, 0.5, 0.9),
    seconds: float = 5.0,
    settle: float | None = None,
    check_url: str | None = None,
    bandwidth: bool = True,
    matmul: bool = True,
    agent: bool | None = None,
    thresholds: logic.Thresholds | None = None,
    buffer_bytes: int = 4 * GIB,
    log: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any]:
    """Run the probe on one CUDA device and return its result (see exporter.probe.logic.finish)."""
    began = time.time()
    if settle is None:
        # The agent closes 0.5 s windows 1 s late, flushes every 0.25 s and the sidecar ticks every
        # 0.5 s: counters lag the GPU by up to ~2.3 s, so a phase's window opens 3 s into its load.
        settle = SETTLE_WITH_SIDECAR if check_url else SETTLE_LOCAL
    try:
        torch, _, _ = load_backend()
        if device >= torch.cuda.device_count():
            raise ProbeUnavailable(f"GPU {device} does not exist ({torch.cuda.device_count()} visible)")
        torch.cuda.set_device(device)
        info = device_info(device)
    except ProbeUnavailable as exc:
        return logic.unavailable(str(exc), started_at=began, finished_at=time.time())
    result: dict[str, Any] = {"schema": logic.SCHEMA, "started_at": began, "device": info}
    attach = check_url is not None if agent is None else agent
    result["agent"] = start_agent() if attach else {"attached": False, "detail": "not requested"}
    nvml = _Nvml(info["uuid"], info["pci_bus_id"])
    info["nvml_index"] = nvml.index()
    if nvml.error:
        result["nvml_error"] = nvml.error
    try:
        log("compiling kernels")
        kernels()
        if bandwidth:
            log("measuring HBM bandwidth")
            result["bandwidth"] = measure_bandwidth(device, buffer_bytes=buffer_bytes, thresholds=thresholds)
        if matmul:
            log("measuring bf16 matmul")
            result["matmul"] = measure_matmul(device)
        if duty:
            result["duty"] = _run_duty(
                device, duty, seconds, settle, check_url, thresholds, result, nvml, log
            )
    except ProbeUnavailable as exc:
        return logic.unavailable(str(exc), started_at=began, finished_at=time.time(), device=info)
    except torch.cuda.OutOfMemoryError as exc:
        return logic.unavailable(
            f"out of GPU memory: {exc}", started_at=began, finished_at=time.time(), device=info
        )
    result["finished_at"] = time.time()
    result["duration_seconds"] = result["finished_at"] - began
    return logic.finish(result)
