"""The `boundwatch diagnose` report: verdict, evidence and likely fixes from N seconds of Snapshots (pure).

`report(snapshots, cfg)` recomputes the verdict tick by tick (so a recording can be re-read with
other thresholds), takes the verdict most ticks had, and gathers the evidence over the whole
span as one window. `format_text(report)` renders it for a terminal; `--json` prints the dict.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from typing import Any

from exporter.analysis import verdict as v
from exporter.config import Config
from exporter.snapshot import Snapshot
from exporter.snapshot.verdict import HOST_REASONS, VERDICTS

# A reason is reported when it held in at least this share of the ticks with the reported verdict.
REASON_MIN_SHARE = 0.3

FIXES: dict[str, str] = {
    "api_server_saturated": (
        "An API server is saturated (one thread at a full core): it renders chat templates and tokenises "
        "prompts in one Python thread and cannot admit requests fast enough. Run more API servers "
        "(vLLM `--api-server-count N`) and give each a real core. If a wrapper patches request parsing, "
        "patch at import time: extra API servers are spawned processes that re-import the entry file as "
        "__mp_main__ and otherwise run unpatched."
    ),
    "cpu_quota_throttled": (
        "The engine's cgroup hits its CPU quota: the API servers and the engine core are stalled by the "
        "kernel. Give the container an explicit CPU reservation and limit sized for the API servers plus "
        "the engine core (Kubernetes resources.requests/limits.cpu, docker --cpus); a fractional default "
        "quota starves it."
    ),
    "admission_stalled": (
        "Nothing waits in the engine's queue, yet fewer requests run than the batch allows: requests are "
        "stuck before the engine (API servers, tokenisation) or the clients send too few. Check the "
        "client's concurrency and the API servers' CPU before tuning the engine."
    ),
    "scheduler_stalled": (
        "Requests wait in the engine's queue while none run: the engine's scheduler admits none of them. "
        "Look at what holds a request before it is scheduled: structured-output grammars being compiled "
        "(vLLM's guided decoding backend and its cache), KV blocks awaited from a prefill instance "
        "(disaggregated serving), LoRA adapters loading, or a prompt longer than max_num_batched_tokens "
        "with chunked prefill off. The engine's own log says which."
    ),
    "cuda_graph_fallback": (
        "Little of the GPU's time runs inside CUDA graphs during decode: batches larger than the largest "
        "captured size run eager, launch by launch. The capture size counts tokens, not sequences: with "
        "speculative decoding a step carries seqs x (1 + spec depth) tokens, so set the capture size "
        "(vLLM max_cudagraph_capture_size / cudagraph_capture_sizes) to at least 2 x max_num_seqs, more for "
        "deeper speculation; check that enforce_eager is off."
    ),
    "step_overhead": (
        "Each engine step spends most of its wall time on the host (scheduling, input preparation, "
        "sampling, output processing), not on the GPU. Check the engine core's CPU (quota, a shared or "
        "slow core), async scheduling, and CUDA-graph coverage."
    ),
    "unknown": (
        "The GPU is starved while requests run, and none of the known causes shows. Look at the idle gaps "
        "(boundwatch_gpu_idle_gap_seconds), the host's CPU, and the engine's logs."
    ),
    "no_busy_source": (
        "No GPU busy figure: enable NVML (the sidecar needs the NVIDIA devices) or start the agent in the "
        "engine (the vLLM plugin, BOUNDWATCH_AGENT=1, or exporter.agent.start())."
    ),
    "no_engine_source": (
        "No engine metrics for this GPU: point boundwatch at the engine's /metrics (--engine-url) or run "
        "it where it can see the engine's processes."
    ),
    "no_gpu_mapping": (
        "An engine runs but could not be placed on its GPUs (NVML lists no processes, no CUDA_VISIBLE_DEVICES, "
        "no agent UUID): run the sidecar in the host PID namespace, or start the agent in the engine "
        "(docs/multi-gpu.md)."
    ),
}

GPU_BOUND = (
    "GPU-bound: the host keeps the GPU fed. Faster steps now come from the kernels, the batch, or the "
    "model's precision, not from the host."
)
GPU_BOUND_LOW_POWER = (
    "The GPU is busy but draws {power:.0f} W of its {limit:.0f} W limit ({share:.0%}): busy SMs at low "
    "power usually stall on memory latency (fallback or badly tiled kernels, e.g. an autotuner that only "
    "saw decode shapes). That is a kernel problem: profile the kernels, not the host."
)
IDLE = "Idle: no request ran or waited. Run the report under load."


def _verdicts(snaps: Sequence[Snapshot], gpu: int) -> list[v.Verdict]:
    return [x for s in snaps for x in s.verdicts if x.gpu == gpu]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.1f} ms"


def findings(f: v.Facts) -> list[str]:
    """Return the evidence as plain sentences."""
    out: list[str] = []
    if f.busy is not None:
        line = f"GPU busy {_pct(f.busy)} of the time (source {f.busy_source}"
        if f.agent_busy_ratio is not None and f.busy_source != "cupti":
            line += f"; CUPTI union {_pct(f.agent_busy_ratio)}"
        line += ")"
        if f.running_mean is not None:
            line += (
                f", {f.running_mean:.0f} requests running and {f.waiting_mean or 0:.1f} waiting on average"
            )
            if f.max_batch:
                line += f" (batch limit {f.max_batch})"
        out.append(line + ".")
    elif f.running_mean is not None:
        out.append(f"{f.running_mean:.0f} requests running and {f.waiting_mean or 0:.1f} waiting on average.")
    if f.idle_gaps is not None:
        out.append(
            f"Idle gaps over 1 ms: {f.idle_gaps} in {f.span_seconds:.1f} s, "
            f"{f.idle_gap_seconds_per_second or 0:.0%} of the time."
        )
    if f.step_seconds is not None:
        line = f"Steps: {_ms(f.step_seconds)} each"
        if f.step_gpu_seconds is not None:
            line += f", {_ms(f.step_gpu_seconds)} of it on the GPU ({_pct(f.step_gpu_share)})"
        if f.steps_per_second:
            line += f", {f.steps_per_second:.1f} steps/s"
        out.append(line + f" (from the {f.step_method}).")
    if f.roofline_floor_seconds is not None:
        line = f"Roofline: weight-streaming floor {_ms(f.roofline_floor_seconds)} per step"
        if f.roofline_achieved_ratio is not None:
            line += f"; achieved steps run at {_pct(f.roofline_achieved_ratio)} of the floor rate"
        out.append(line + ".")
    if f.api_server_thread_cpu is not None:
        out.append(
            f"API servers: {f.api_servers}; the busiest thread used {_pct(f.api_server_thread_cpu)} of a core "
            f"(its process {f.api_server_process_cpu or 0:.2f} cores)."
        )
    if f.quota_cores is not None or f.throttled_share is not None:
        quota = "no quota" if f.quota_cores is None else f"quota {f.quota_cores:.2f} cores"
        out.append(
            f"CPU: {quota}; throttled in {_pct(f.throttled_share)} of the quota periods"
            + (
                f" ({f.throttled_seconds_per_second:.2f} s per s)."
                if f.throttled_seconds_per_second is not None
                else "."
            )
        )
    if f.graph_share is not None:
        out.append(f"CUDA graphs: {_pct(f.graph_share)} of the GPU's busy time ran inside graph launches.")
    if f.power_watts is not None:
        line = f"Power {f.power_watts:.0f} W"
        if f.power_limit_watts:
            line += f" of {f.power_limit_watts:.0f} W ({_pct(f.power_share)})"
        if f.sm_clock_ratio is not None:
            line += f"; SM clock at {_pct(f.sm_clock_ratio)} of its maximum"
        out.append(line + ".")
    if f.host_cpu is not None:
        out.append(f"Host CPU {_pct(f.host_cpu)} busy (all cores).")
    return out


def gpu_report(snaps: Sequence[Snapshot], gpu: int, cfg: Config) -> dict[str, Any]:
    """Return one GPU's part of the report."""
    ticks = _verdicts(snaps, gpu)
    counts = Counter(x.verdict for x in ticks)
    verdict = (
        max(VERDICTS, key=lambda name: (counts.get(name, 0), -VERDICTS.index(name))) if ticks else "unknown"
    )
    with_verdict = [x for x in ticks if x.verdict == verdict]
    reason_counts = Counter(r for x in with_verdict for r in x.reasons)
    order = (*HOST_REASONS, "no_busy_source", "no_engine_source", "no_gpu_mapping")
    reasons = [
        r for r in order if with_verdict and reason_counts.get(r, 0) / len(with_verdict) >= REASON_MIN_SHARE
    ]
    if verdict == "host" and len(reasons) > 1 and "unknown" in reasons:
        reasons.remove("unknown")
    span = snaps[-1].mono - snaps[0].mono if len(snaps) > 1 else 0.0
    over_run = dataclasses.replace(cfg.verdict, busy_window_seconds=span + 1.0)
    facts = v.gather(snaps, gpu, over_run, cfg.roofline, whole=True)
    advice: list[dict[str, str]] = [{"reason": r, "fix": FIXES[r]} for r in reasons if r in FIXES]
    if verdict == "gpu":
        advice.insert(0, {"reason": "gpu", "fix": GPU_BOUND})
        share = facts.power_share
        if share is not None and share < 0.7 and facts.power_watts and facts.power_limit_watts:
            advice.append(
                {
                    "reason": "low_power",
                    "fix": GPU_BOUND_LOW_POWER.format(
                        power=facts.power_watts, limit=facts.power_limit_watts, share=share
                    ),
                }
            )
    elif verdict == "idle":
        advice.insert(0, {"reason": "idle", "fix": IDLE})
    n = len(ticks) or 1
    return {
        "gpu": gpu,
        "verdict": verdict,
        "reasons": reasons,
        "ticks": len(ticks),
        "verdict_share": {name: counts.get(name, 0) / n for name in VERDICTS if counts.get(name)},
        "reason_share": {r: c / (len(with_verdict) or 1) for r, c in sorted(reason_counts.items())},
        "evidence": dict(facts.evidence()),
        "findings": findings(facts),
        "fixes": advice,
    }


def report(snapshots: Sequence[Snapshot], cfg: Config, *, reclassify: bool = True) -> dict[str, Any]:
    """Return the diagnosis of a run of Snapshots (oldest first) as plain data."""
    snaps = v.replay(snapshots, cfg) if reclassify else list(snapshots)
    if not snaps:
        return {"seconds": 0.0, "ticks": 0, "gpus": [], "sources": {}}
    gpus = sorted({g for s in snaps for g in v.gpus_of(s)})
    sources: dict[str, list[bool]] = {}
    for s in snaps:
        for st in s.sources:
            sources.setdefault(st.name, []).append(st.up)
    return {
        "seconds": round(snaps[-1].mono - snaps[0].mono + snaps[0].interval, 3),
        "ticks": len(snaps),
        "tick_seconds": snaps[0].interval,
        "gpus": [gpu_report(snaps, g, cfg) for g in gpus],
        "sources": {name: sum(ups) / len(ups) for name, ups in sorted(sources.items())},
    }


NAMES = {"idle": "idle", "gpu": "GPU-bound", "host": "host-bound", "unknown": "unknown"}


def format_text(rep: dict[str, Any]) -> str:
    """Return the report as plain text for a terminal."""
    lines = [f"boundwatch diagnose: {rep['ticks']} ticks over {rep['seconds']:.1f} s"]
    if rep.get("sources"):
        down = [f"{name} ({1 - up:.0%} of ticks)" for name, up in rep["sources"].items() if up < 1]
        lines.append("Sources: " + ", ".join(rep["sources"]) + (f"; down: {', '.join(down)}" if down else ""))
    if not rep["gpus"]:
        lines.append("No GPU seen: no NVML, no agent and no engine reported one.")
    for g in rep["gpus"]:
        lines.append("")
        head = f"GPU {g['gpu']}: {NAMES.get(g['verdict'], g['verdict'])}"
        if g["reasons"]:
            head += " (" + ", ".join(g["reasons"]) + ")"
        share = g["verdict_share"].get(g["verdict"], 0.0)
        head += f" in {share:.0%} of ticks"
        others = [f"{NAMES[k]} {x:.0%}" for k, x in g["verdict_share"].items() if k != g["verdict"]]
        if others:
            head += "; also " + ", ".join(others)
        lines.append(head)
        lines.append("  Evidence:")
        lines.extend(f"    - {line}" for line in g["findings"] or ["(none)"])
        if g["fixes"]:
            lines.append("  Likely fixes:")
            lines.extend(f"    - {item['fix']}" for item in g["fixes"])
    return "\n".join(lines) + "\n"
