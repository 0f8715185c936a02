"""Two lab engines on the one GPU, each with the light agent: is each engine's figure its own, and the GPU's right?

Engine A (`vllm serve --port PA`, one API server fed long prompts: host-bound, its server's main
thread saturated, the engine's queue mostly empty) and engine B (`--port PB`, four API servers fed
short prompts: a full batch and a queue) share the GPU, each a `VLLM::EngineCore` of
bench/scenarios (16-layer bf16 decoder, per-batch CUDA graphs) with `exporter.agent.start()`. The
real daemon runs beside them with its defaults: discovery finds both engines and their API servers.
Over the measured span, boundwatch's per-engine figures on /metrics (agent-counted steps, running and
waiting request-seconds, API-server CPU) are compared with each engine's own truth (its step count,
its scheduler's counts integrated in 0.25 s bins, its servers' main-thread CPU read from /proc), and
the GPU's busy figures with the sum of both engines' GPU time (CUDA events around each step; under
time slicing an upper bound of the union).

    python3 bench/two_engines_lab.py --out bench/results/two_engines_lab_h200.json   # on the GPU host
    python3 bench/two_engines_lab.py --device cpu --seconds 10 --out /tmp/two.json     # NVML stand-in
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.scenarios import lab  # noqa: E402
from bench.scenarios import truth as tr  # noqa: E402
from exporter.commands._live import daemon_answers  # noqa: E402


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Return every sample of the daemon's /metrics as {(name, sorted labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "/metrics", timeout=3) as resp:
        text = resp.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def value(m: dict[Any, float], name: str, **labels: str) -> float | None:
    """Return the sum of the samples of name whose labels include `labels` (None if none)."""
    got = [v for (n, ls), v in m.items() if n == name and all((k, w) in ls for k, w in labels.items())]
    return sum(got) if got else None


def delta(m0: dict[Any, float], m1: dict[Any, float], name: str, **labels: str) -> float | None:
    """Return a counter's increase over the span."""
    a, b = value(m0, name, **labels), value(m1, name, **labels)
    return None if a is None or b is None else b - a


def engine_truth(bins: list[dict[str, float]], t0: float, t1: float, bin_s: float) -> dict[str, float]:
    """Return an engine's truth over [t0, t1): steps, GPU seconds, running and waiting request-seconds."""
    rows = [b for b in bins if t0 <= b["t"] and b["t"] + bin_s <= t1]
    return {
        "bins": len(rows),
        "steps": sum(b.get("steps", 0) for b in rows),
        "gpu_seconds": sum(b.get("busy", 0.0) for b in rows),
        "running_request_seconds": sum(b.get("running", 0.0) for b in rows),
        "waiting_request_seconds": sum(b.get("waiting", 0.0) for b in rows),
        "seconds": len(rows) * bin_s,
    }


def api_truth(samples: list[tr.ApiSample], t0: float, t1: float) -> dict[int, float]:
    """Return each API server's mean main-thread CPU (cores) over [t0, t1)."""
    per: dict[int, list[float]] = {}
    for at, row in samples:
        if t0 <= at < t1:
            for pid, (cpu, _demand) in row.items():
                per.setdefault(pid, []).append(cpu)
    return {pid: round(sum(v) / len(v), 3) for pid, v in per.items() if v}


def main(argv: list[str] | None = None) -> int:
    """Run both engines, measure, compare, write JSON."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--agent", choices=["none", "light", "cupti"], default="light")
    p.add_argument("--seconds", type=float, default=20.0, help="measured span")
    p.add_argument("--warmup", type=float, default=12.0)
    p.add_argument("--out", default=str(ROOT / "bench/results/two_engines_lab.json"))
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bwtwo-"))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.update(PYTHONUNBUFFERED="1", BOUNDWATCH_AGENT_SOCKET=str(work / "agent.sock"))
    stack_args = argparse.Namespace(device=args.device, agent=args.agent, us_per_token=2.5, engine_json="")
    url = f"http://127.0.0.1:{(bw_port := lab.free_port())}"
    result: dict[str, Any] = {"bench": "two_engines_lab", "device": args.device, "agent": args.agent,
                              **lab.gpu_info()}  # fmt: skip
    stacks: dict[str, lab.Stack] = {}
    daemon = None
    try:
        for name in ("a", "b"):
            (work / name).mkdir()
            stacks[name] = lab.Stack(stack_args, lab.free_port(), work / name, env)
            lab.log(f"engine {name} ready: pid {stacks[name].info['engine_pid']}")
        a, b = stacks["a"], stacks["b"]
        cost = lab.long_prompt_cost(a.info, lab.SATURATED_BUSY)
        for s in stacks.values():
            s.send(f"cost {cost:.3f}")
        b.send("servers 4")
        daemon = lab.start_daemon(args, bw_port, env, work / "a")  # on the CPU path: engine a's NVML stand-in
        lab.wait_for("the daemon", lambda: daemon_answers(url), 60)

        def ours() -> dict[str, Any]:
            """Return our engines' readings (by the engine core's pid: other engines may run here)."""
            snap = lab.latest(url)
            found = {}
            for k, st in stacks.items():
                for e in snap.engines if snap else ():
                    if int(st.info["engine_pid"]) in e.pids:
                        found[k] = e
            return found

        want = {"a": 1, "b": 4}
        lab.wait_for(
            "the daemon to see both engines and their API servers",
            lambda: all(len(e.api_servers) == want[k] for k, e in ours().items()) and len(ours()) == 2,
            40,
        )
        engine_name = {k: e.name for k, e in ours().items()}
        result["engines"] = {k: {"name": v, "engine_pid": stacks[k].info["engine_pid"],
                                 "api_server_pids": stacks[k].api_pids} for k, v in engine_name.items()}  # fmt: skip
        lab.log(f"engines: {engine_name}")
        a.send("load long 8 -")
        b.send("load short 32 -")
        samplers = {k: lab.ApiSampler(s) for k, s in stacks.items()}
        time.sleep(args.warmup)
        m0, t0 = scrape(url), time.time()
        verdicts: list[tuple[str | None, tuple[str, ...]]] = []
        end = t0 + args.seconds
        while time.time() < end:
            time.sleep(0.5)
            try:
                verdicts.append(lab.scrape_bound(url)[1:])
            except OSError:
                pass
        m1, t1 = scrape(url), time.time()
        for s in samplers.values():
            s.stop()
        for s in stacks.values():
            s.stop()
        span = t1 - t0
        per: dict[str, Any] = {}
        for k in stacks:
            bins = tr.read_bins(work / k / "serve" / "truth-engine.jsonl")
            truth = engine_truth(bins, t0, t1, lab.BIN_SECONDS)
            e = engine_name[k]
            seen_span = truth["seconds"] or span
            measured = {
                "steps": {
                    method: d
                    for method in ("agent", "lower_bound", "upper_bound")
                    if (d := delta(m0, m1, "boundwatch_engine_steps_total", engine=e, method=method)) is not None
                },
                "running_mean": (delta(m0, m1, "boundwatch_engine_running_request_seconds_total", engine=e) or 0)
                / span,
                "waiting_mean": (delta(m0, m1, "boundwatch_engine_waiting_request_seconds_total", engine=e) or 0)
                / span,
                "api_server_saturated_seconds": delta(m0, m1, "boundwatch_api_server_saturated_seconds_total", engine=e),
                "api_servers": value(m1, "boundwatch_engine_api_servers", engine=e),
                "counts_source": [dict(ls).get("source") for (n, ls), v in m1.items()
                                  if n == "boundwatch_engine_counts_source" and dict(ls).get("engine") == e and v == 1],
            }  # fmt: skip
            api = api_truth(samplers[k].rows, t0, t1)
            per[k] = {
                "engine": e,
                "truth": {
                    **truth,
                    "steps_per_second": truth["steps"] / seen_span,
                    "running_mean": truth["running_request_seconds"] / seen_span,
                    "waiting_mean": truth["waiting_request_seconds"] / seen_span,
                    "gpu_busy_share": truth["gpu_seconds"] / seen_span,
                    "api_main_thread_cpu": api,
                },
                "measured": {
                    **measured,
                    "steps_per_second": {k: v / span for k, v in measured["steps"].items()},  # type: ignore[attr-defined]
                },
            }
        gpu = {src: (delta(m0, m1, "boundwatch_gpu_busy_seconds_total", gpu="0", source=src) or 0) / span
               for src in ("gpm", "nvml", "cupti")}  # fmt: skip
        counts: dict[str, int] = {}
        for verdict, reasons in verdicts:
            key = (verdict or "-") + (f" ({', '.join(reasons)})" if reasons else "")
            counts[key] = counts.get(key, 0) + 1
        result.update(
            span_seconds=round(span, 3), us_per_token=round(cost, 3), per_engine=per,
            gpu_busy=gpu, truth_gpu_busy_sum=sum(x["truth"]["gpu_busy_share"] for x in per.values()),
            verdicts=counts,
        )  # fmt: skip
    except Exception as exc:
        import traceback

        result["error"] = "".join(traceback.format_exception(exc))[-3000:]
    finally:
        for s in stacks.values():
            s.stop()
        if daemon is not None and daemon.poll() is None:
            daemon.terminate()
            daemon.wait(10)
        if (work / "a" / "daemon.out").exists():
            result["daemon_tail"] = (work / "a" / "daemon.out").read_text()[-2000:]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(table(result))
    return 0 if "error" not in result else 1


def table(r: dict[str, Any]) -> str:
    """Return the per-engine comparison as a Markdown table."""
    if "error" in r:
        return "error: " + r["error"][-1500:]
    lines = ["| engine | steps/s truth / boundwatch (method) | running truth / boundwatch | waiting truth / boundwatch "
             "| API main thread truth | saturated s (boundwatch) |", "|---|---|---|---|---|---|"]  # fmt: skip
    for k, x in r["per_engine"].items():
        t, m = x["truth"], x["measured"]
        lines.append(
            f"| {k} {x['engine']} | {t['steps_per_second']:.1f} / "
            f"{', '.join(f'{v:.1f} ({n})' for n, v in m['steps_per_second'].items()) or '-'} | "
            f"{t['running_mean']:.2f} / {m['running_mean']:.2f} | {t['waiting_mean']:.2f} / {m['waiting_mean']:.2f} | "
            f"{sorted(t['api_main_thread_cpu'].values(), reverse=True)} | {m['api_server_saturated_seconds']} |"
        )
    lines.append(f"GPU busy: {json.dumps({k: round(v, 3) for k, v in r['gpu_busy'].items()})}; "
                 f"sum of both engines' step GPU time {r['truth_gpu_busy_sum']:.3f}; verdicts {r['verdicts']}")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
