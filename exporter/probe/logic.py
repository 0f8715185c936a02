"""Pure logic of the self-test probe: nominal figures, duty-cycle plans, ground truth, verdicts.

Nothing here imports triton, torch or NVML, and nothing does I/O, so all of it runs in CI.
`exporter.probe.gpu` runs the kernels and feeds the numbers in; `exporter.probe.scheduled`
decides when the daemon may run the probe.

The probe's JSON result (what `boundwatch probe --json` prints) is a dict built by
`exporter.probe.gpu.run_probe`; `finish()` sets its verdict keys:
`status` ("pass" | "fail" | "error"), `exit_code` (0 | 1 | 2), `message`, `checks`
(each {name, pass, detail}). The rest:
    device      index, name, uuid, pci_bus_id, nvml_index, sm_count, memory_total_bytes, versions
    agent       attached (bool), state, detail: the in-process CUPTI agent, when asked for
    bandwidth   bytes_per_second (read + written), torch_copy_bytes_per_second, ratio_to_torch,
                nominal_bytes_per_second, ratio_to_nominal, buffer_bytes, buffers, reps, verified
    matmul      flops_per_second, torch_flops_per_second, ratio_to_torch, ratio_to_nominal,
                relative_error_vs_torch
    duty        seconds, settle_seconds, check_url, phases: per phase target, truth (the in-kernel
                busy fraction the sources are judged against), truth_steady (whole phase),
                truth_window, bursts, kernel_seconds, period_seconds, sources {name: busy_ratio,
                error, tolerance, pass}, primary_source, local_sources (the probe's own NVML/GPM),
                sidecar {gpu_label, sources {name: busy_ratio, busy_seconds, observed_seconds}}
    started_at, finished_at, duration_seconds (unix s)
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from exporter.snapshot.probe import ProbeSummary

SCHEMA = 1
EXIT_PASS, EXIT_FAIL, EXIT_UNAVAILABLE = 0, 1, 2

# --- nominal figures --------------------------------------------------------------------------


@dataclass(frozen=True)
class Nominal:
    """A device's datasheet figures: HBM bandwidth and dense bf16 matrix rate."""

    pattern: str  # regex matched (case-insensitive) against the CUDA / NVML device name
    label: str
    hbm_bytes_per_second: float
    bf16_flops: float | None = None


TB = 1e12
# Most specific first: "H20" must not match "H200", "H100 NVL" must not fall through to "H100".
NOMINAL: tuple[Nominal, ...] = (
    Nominal(r"\bGB200\b", "GB200", 8.0 * TB, 2250e12),
    Nominal(r"\bB200\b", "B200", 8.0 * TB, 2250e12),
    Nominal(r"\bB100\b", "B100", 8.0 * TB, 1750e12),
    Nominal(r"\bGH200\b", "GH200 (96 GB HBM3)", 4.0 * TB, 989e12),
    Nominal(r"\bH200\b", "H200", 4.8 * TB, 989e12),
    Nominal(r"\bH20\b", "H20", 4.0 * TB, 148e12),
    Nominal(r"\bH100\b.*\bNVL\b", "H100 NVL", 3.9 * TB, 835e12),
    Nominal(r"\bH100\b.*\bPCIe\b", "H100 PCIe", 2.0 * TB, 756e12),
    Nominal(r"\bH800\b.*\bPCIe\b", "H800 PCIe", 2.0 * TB, 756e12),
    Nominal(r"\bH100\b", "H100 SXM", 3.35 * TB, 989e12),
    Nominal(r"\bH800\b", "H800 SXM", 3.35 * TB, 989e12),
    Nominal(r"\bA100\b.*80\s*GB.*PCIe|\bA100\b.*PCIe.*80\s*GB", "A100 80GB PCIe", 1.935 * TB, 312e12),
    Nominal(r"\bA100\b.*80\s*GB", "A100 80GB SXM", 2.039 * TB, 312e12),
    Nominal(r"\bA100\b", "A100 40GB", 1.555 * TB, 312e12),
    Nominal(r"\bA800\b.*80\s*GB", "A800 80GB", 2.039 * TB, 312e12),
    Nominal(r"\bL40S\b", "L40S", 0.864 * TB, 362e12),
    Nominal(r"\bL40\b", "L40", 0.864 * TB, 181e12),
    Nominal(r"\bL4\b", "L4", 0.300 * TB, 121e12),
    Nominal(r"\bA10G\b", "A10G", 0.600 * TB, 70e12),
    Nominal(r"\bA10\b", "A10", 0.600 * TB, 125e12),
)


def nominal_for(device_name: str) -> Nominal | None:
    """Return the nominal figures for a device name, or None for a device not in the table."""
    for entry in NOMINAL:
        if re.search(entry.pattern, device_name, flags=re.IGNORECASE):
            return entry
    return None


# --- thresholds -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Thresholds:
    """Pass/fail limits of the probe.

    min_nominal_ratio: measured HBM bandwidth over the datasheet figure below which the GPU fails
        (a healthy H200 copies at ~0.89 of 4.8 TB/s, H100 and A100 at 0.85-0.9 of theirs).
    min_torch_ratio: the probe's copy kernel over torch's `copy_` in the same run below which the
        probe itself is suspect (it measures the kernel, not the GPU).
    duty_tolerance: |reported - in-kernel truth| allowed per busy source; CUPTI matched the truth
        to <= 0.03 points on the H200, GPM GRAPHICS_UTIL ran 0.1-0.8 points low, NVML utilization
        (200 ms samples) about 1 point.
    max_schedule_error: |achieved - target| busy fraction above which the load itself failed (host
        stalls), independent of any measuring source.
    """

    min_nominal_ratio: float = 0.75
    min_torch_ratio: float = 0.90
    duty_tolerance: Mapping[str, float] | None = None
    max_schedule_error: float = 0.10

    def tolerance(self, source: str) -> float:
        """Return the allowed busy-fraction error of one source."""
        table = dict(DEFAULT_DUTY_TOLERANCE)
        if self.duty_tolerance:
            table.update(self.duty_tolerance)
        return table.get(source, table["other"])


DEFAULT_DUTY_TOLERANCE: Mapping[str, float] = {"cupti": 0.01, "gpm": 0.02, "nvml": 0.03, "other": 0.03}
# Which source decides a duty phase, best first. The others are reported beside it.
SOURCE_PREFERENCE: tuple[str, ...] = ("cupti", "gpm", "nvml")


# --- the duty-cycle load ----------------------------------------------------------------------


@dataclass(frozen=True)
class DutyPlan:
    """One duty-cycle phase: bursts of `kernel_seconds` every `period_seconds`."""

    target: float
    kernel_seconds: float
    period_seconds: float

    @property
    def gap_seconds(self) -> float:
        """Return the host sleep between the end of one burst and the next launch."""
        return self.period_seconds - self.kernel_seconds

    def bursts_within(self, seconds: float) -> int:
        """Return how many bursts fit in `seconds` (for sizing the stamp buffer)."""
        return math.ceil(seconds / self.period_seconds) + 1


MIN_GAP_SECONDS = 0.0002  # host sleeps shorter than this are launch jitter, not a schedule


def plan_duty(target: float, kernel_seconds: float = 0.002) -> DutyPlan:
    """Return the plan for a target busy fraction: lengthen the kernel until the host gap is >= 0.2 ms."""
    if not 0.0 < target < 1.0:
        raise ValueError(f"duty target must be in (0, 1), got {target}")
    if kernel_seconds <= 0:
        raise ValueError("kernel_seconds must be positive")
    kernel = max(kernel_seconds, MIN_GAP_SECONDS * target / (1.0 - target))
    return DutyPlan(target=target, kernel_seconds=kernel, period_seconds=kernel / target)


def parse_duty_list(text: str) -> tuple[float, ...]:
    """Parse "0.25,0.5,90%" into busy fractions; raise ValueError on anything outside (0, 1)."""
    out: list[float] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        value = float(part[:-1]) / 100.0 if part.endswith("%") else float(part)
        if value >= 1.0 and not part.endswith("%") and value < 100.0:
            value /= 100.0  # "25,50,90" means percent
        if not 0.0 < value < 1.0:
            raise ValueError(f"duty {part!r} is not a busy fraction in (0, 1)")
        out.append(value)
    if not out:
        raise ValueError("no duty fractions given")
    return tuple(out)


def next_launch(previous_launch: float, period: float, now: float) -> float:
    """Return the host time of the next launch: one period after the last, never in the past.

    A late burst launches at once and the schedule re-anchors, so a host stall never turns into
    a run of back-to-back bursts (which would push the busy fraction above the target).
    """
    return max(previous_launch + period, now)


# --- ground truth from %globaltimer stamps ----------------------------------------------------

Interval = tuple[int, int]  # device time, ns: [start, end)


def burst_intervals(stamps: Sequence[Sequence[int]]) -> list[Interval]:
    """Reduce per-CTA stamps to one interval per burst: [earliest CTA start, latest CTA end].

    `stamps[b]` is the flat list (start0, end0, start1, end1, ...) of burst b's CTAs.
    """
    out: list[Interval] = []
    for row in stamps:
        starts, ends = row[0::2], row[1::2]
        if not starts:
            continue
        out.append((int(min(starts)), int(max(ends))))
    return out


def union_length(intervals: Iterable[Interval], lo: int, hi: int) -> int:
    """Return the length of the union of intervals clipped to [lo, hi)."""
    clipped = sorted((max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi)
    total, cur_s, cur_e = 0, None, None
    for s, e in clipped:
        if e <= s:
            continue
        if cur_e is None or s > cur_e:
            if cur_e is not None and cur_s is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None and cur_s is not None:
        total += cur_e - cur_s
    return total


def busy_fraction(intervals: Sequence[Interval], lo: int, hi: int) -> float:
    """Return the busy share of [lo, hi) covered by the intervals."""
    if hi <= lo:
        raise ValueError("empty window")
    return union_length(intervals, lo, hi) / (hi - lo)


def steady_fraction(intervals: Sequence[Interval]) -> float:
    """Return the busy fraction over whole periods: first burst start to last burst start."""
    if len(intervals) < 2:
        raise ValueError("need at least two bursts")
    ordered = sorted(intervals)
    return busy_fraction(ordered[:-1], ordered[0][0], ordered[-1][0])


def clock_offset_ns(host_after_ns: Sequence[int], device_end_ns: Sequence[int]) -> int:
    """Estimate host wall clock minus device %globaltimer, in ns.

    Each burst's end stamp precedes the host's return from synchronize, so the smallest
    difference is the tightest estimate (it errs by the wake-up latency, a few us).
    """
    pairs = [h - d for h, d in zip(host_after_ns, device_end_ns, strict=True)]
    if not pairs:
        raise ValueError("no bursts")
    return min(pairs)


# --- reading the sidecar's counters -----------------------------------------------------------


def busy_from_counters(
    before: Mapping[str, tuple[float, float]], after: Mapping[str, tuple[float, float]]
) -> dict[str, dict[str, float]]:
    """Return per source the busy ratio between two scrapes of (busy_seconds, observed_seconds).

    A source missing from either scrape, or whose observed time did not advance, is left out.
    """
    out: dict[str, dict[str, float]] = {}
    for source, (busy1, obs1) in after.items():
        if source not in before:
            continue
        busy0, obs0 = before[source]
        observed = obs1 - obs0
        if observed <= 0:
            continue
        out[source] = {
            "busy_ratio": (busy1 - busy0) / observed,
            "busy_seconds": busy1 - busy0,
            "observed_seconds": observed,
        }
    return out


# --- verdicts ---------------------------------------------------------------------------------


def check(name: str, passed: bool, detail: str) -> dict[str, Any]:
    """Return one named check."""
    return {"name": name, "pass": bool(passed), "detail": detail}


def evaluate_bandwidth(
    probe_bps: float,
    torch_bps: float | None,
    nominal: Nominal | None,
    verified: bool,
    thresholds: Thresholds | None = None,
) -> dict[str, Any]:
    """Return the bandwidth section's ratios and checks."""
    thresholds = thresholds or Thresholds()
    out: dict[str, Any] = {
        "bytes_per_second": probe_bps,
        "torch_copy_bytes_per_second": torch_bps,
        "ratio_to_torch": probe_bps / torch_bps if torch_bps else None,
        "nominal_bytes_per_second": nominal.hbm_bytes_per_second if nominal else None,
        "nominal_device": nominal.label if nominal else None,
        "ratio_to_nominal": probe_bps / nominal.hbm_bytes_per_second if nominal else None,
    }
    checks = [check("bandwidth_copy_correct", verified, "copied buffer equals its source")]
    if out["ratio_to_nominal"] is not None:
        r = out["ratio_to_nominal"]
        checks.append(
            check(
                "bandwidth_vs_nominal",
                r >= thresholds.min_nominal_ratio,
                f"{probe_bps / 1e9:.0f} GB/s = {r:.3f} of nominal {nominal.hbm_bytes_per_second / 1e9:.0f} GB/s"  # type: ignore[union-attr]
                f" (min {thresholds.min_nominal_ratio})",
            )
        )
    if out["ratio_to_torch"] is not None:
        r = out["ratio_to_torch"]
        checks.append(
            check(
                "bandwidth_vs_torch_copy",
                r >= thresholds.min_torch_ratio,
                f"{r:.3f} of torch copy_ {torch_bps / 1e9:.0f} GB/s (min {thresholds.min_torch_ratio})",  # type: ignore[operator]
            )
        )
    out["checks"] = checks
    out["pass"] = all(c["pass"] for c in checks)
    return out


def evaluate_duty_phase(
    target: float,
    truth: float,
    sources: Mapping[str, float],
    thresholds: Thresholds | None = None,
    require_source: str | None = None,
) -> dict[str, Any]:
    """Return one duty phase's verdict: the best source present must match the in-kernel truth.

    sources: busy ratio per measuring source over the same interval as `truth`.
    require_source: fail when this source is absent (e.g. "cupti" when an agent was attached).
    """
    thresholds = thresholds or Thresholds()
    report: dict[str, dict[str, Any]] = {
        name: {
            "busy_ratio": value,
            "error": value - truth,
            "tolerance": thresholds.tolerance(name),
            "pass": abs(value - truth) <= thresholds.tolerance(name),
        }
        for name, value in sources.items()
    }
    primary = next((s for s in SOURCE_PREFERENCE if s in sources), None)
    if primary is None and sources:
        primary = sorted(sources)[0]
    checks = [
        check(
            f"duty_{target:g}_schedule",
            abs(truth - target) <= thresholds.max_schedule_error,
            f"achieved {truth:.4f} against target {target:g} (max error {thresholds.max_schedule_error})",
        )
    ]
    if require_source and require_source not in sources:
        checks.append(
            check(f"duty_{target:g}_{require_source}_present", False, f"no {require_source} source")
        )
    if primary is not None:
        r = report[primary]
        checks.append(
            check(
                f"duty_{target:g}_{primary}",
                r["pass"],
                f"{primary} {r['busy_ratio']:.4f} vs truth {truth:.4f}: error {r['error'] * 100:+.2f} points"
                f" (tolerance {r['tolerance'] * 100:g})",
            )
        )
    return {
        "target": target,
        "truth": truth,
        "sources": report,
        "primary_source": primary,
        "checks": checks,
        "pass": all(c["pass"] for c in checks),
    }


def finish(result: dict[str, Any]) -> dict[str, Any]:
    """Set status, exit_code, message and the flat list of checks on a probe result; return it."""
    if result.get("status") == "error":
        result["exit_code"] = EXIT_UNAVAILABLE
        result.setdefault("checks", [])
        return result
    checks: list[dict[str, Any]] = []
    for section in ("bandwidth", "matmul"):
        checks.extend((result.get(section) or {}).get("checks", []))
    for phase in (result.get("duty") or {}).get("phases", []):
        checks.extend(phase.get("checks", []))
    result["checks"] = checks
    failed = [c["name"] for c in checks if not c["pass"]]
    if not checks:
        result.update(status="error", exit_code=EXIT_UNAVAILABLE, message="nothing was measured")
    elif failed:
        result.update(status="fail", exit_code=EXIT_FAIL, message="failed: " + ", ".join(failed))
    else:
        result.update(status="pass", exit_code=EXIT_PASS, message=f"all {len(checks)} checks passed")
    return result


def unavailable(message: str, **extra: Any) -> dict[str, Any]:
    """Return the result of a probe that could not run (no GPU, no Triton, out of memory, ...)."""
    return {
        "schema": SCHEMA,
        "status": "error",
        "exit_code": EXIT_UNAVAILABLE,
        "message": message,
        "checks": [],
        **extra,
    }


# --- the summary the daemon keeps in Snapshot.probe -------------------------------------------


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def summarize(result: Mapping[str, Any]) -> ProbeSummary:
    """Reduce a probe result to the typed entry the daemon keeps in Snapshot.probe (exporter.snapshot.probe)."""
    bw = result.get("bandwidth") or {}
    errors: dict[str, float] = {}
    for phase in (result.get("duty") or {}).get("phases", []):
        for source, rep in (phase.get("sources") or {}).items():
            err = rep.get("error")
            if err is None:
                continue
            if source not in errors or abs(err) > abs(errors[source]):
                errors[source] = float(err)
    status = result.get("status")
    return ProbeSummary(
        status=str(status) if status is not None else "",
        success=None if status == "error" else status == "pass",
        timestamp=_number(result.get("finished_at")),
        hbm_bandwidth_bytes_per_second=_number(bw.get("bytes_per_second")),
        hbm_bandwidth_ratio=_number(bw.get("ratio_to_nominal")),
        duty_errors=MappingProxyType(errors),
        message=str(result.get("message", "")),
    )
