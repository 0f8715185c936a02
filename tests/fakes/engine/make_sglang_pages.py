"""Write SGLang /metrics pages with SGLang's own collectors in multiprocess mode (scheduling scripted).

Run with a venv that has sglang (0.5.23 here), from the repository root:
    /work/venvs/sglang/bin/python tests/fakes/engine/make_sglang_pages.py
Each scheduler rank is a forked process that publishes a real ServerArgs with its placement
(`runtime_context.publish`), builds `SchedulerMetricsCollector.init_new` (SGLang's own labels and
stats-logging rank) and plays a scripted schedule through the collector's own methods, calling
them where the scheduler calls them: decode passes on every rank with metrics, prefill passes, DP
balance and log_stats on the reporting ranks. The page is what SGLang's multiprocess collector
serves. A `.truth.json` beside each page holds what the script scheduled.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[2] / "fixtures" / "engine"

SCENARIOS = {
    # name: (tp, dp, dp_attention, priority, steps)
    "tp2": (2, 1, False, False, 40),
    "dp2-replicas": (1, 2, False, False, 40),
    "dpattn-dp2-tp4": (4, 2, True, False, 60),
    "priority": (1, 1, False, True, 30),
}


def _model_dir(tmp: str) -> str:
    d = os.path.join(tmp, "tiny-llama")
    os.makedirs(d, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "num_hidden_layers": 2,
        "vocab_size": 1000,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "torch_dtype": "bfloat16",
    }
    Path(d, "config.json").write_text(json.dumps(config))
    return d


def _schedule(dp_groups: int, steps: int, seed: int) -> list[list[dict]]:
    """Return per step, per DP group: kind (decode/prefill/idle), graph, running, queued, usage, priorities."""
    rnd = random.Random(seed)
    plan = []
    for i in range(steps):
        row = []
        for _g in range(dp_groups):
            kind = (
                rnd.choice(("decode", "decode", "decode", "prefill", "idle")) if i < steps - 1 else "decode"
            )
            running = 0 if kind == "idle" else rnd.randint(1, 8)
            row.append(
                {
                    "kind": kind,
                    "graph": (kind == "decode" and rnd.random() < 0.8)
                    or (kind == "prefill" and rnd.random() < 0.3),
                    "running": running,
                    "queued": rnd.randint(0, 3),
                    "usage": round(rnd.random() * 0.5, 4),
                    "prio_running": sorted(rnd.choice((0, 1, 2)) for _ in range(running)),
                }
            )
        plan.append(row)
    return plan


def _rank_main(model: str, mp_dir: str, scenario: tuple, world_rank: int, plan: list[list[dict]]) -> None:
    tp, dp, dp_attention, priority, _ = scenario
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = mp_dir
    from sglang.srt import runtime_context as rc
    from sglang.srt.observability.metrics_collector import (
        DPBalanceStats,
        QueueCount,
        SchedulerMetricsCollector,
        SchedulerStats,
    )
    from sglang.srt.server_args import ServerArgs

    if dp_attention:  # one scheduler per global TP rank; DP group = rank // attn_tp_size
        dp_rank, group = world_rank // (tp // dp), world_rank // (tp // dp)
    elif dp > 1:  # DP replicas: one scheduler per replica, each with its own tp_rank 0
        dp_rank, group = world_rank, world_rank
    else:
        dp_rank, group = None, 0
    args = ServerArgs(
        model_path=model,
        served_model_name="tiny-llama",
        skip_tokenizer_init=True,
        enable_metrics=True,
        device="cuda",
        tp_size=tp if dp_attention or dp == 1 else 1,
        dp_size=dp if dp_attention else 1,
        enable_dp_attention=dp_attention,
        enable_priority_scheduling=priority,
    )
    rank_in_world = world_rank if dp_attention or dp == 1 else 0
    rc.publish(
        args, role="scheduler", ranks=rc.SpawnRanks(world_rank=rank_in_world, dp_rank=dp_rank, gpu_id=0)
    )
    ctx = SchedulerMetricsCollector.init_new(
        server_args=args,
        enable_priority_scheduling=priority,
        enable_lora=False,
        enable_hierarchical_cache=False,
    )
    c = ctx.collector
    for row in plan:
        step = row[group]
        if step["kind"] == "decode":  # batch_result_processor: every rank with metrics on
            c.increment_decode_cuda_graph_pass(value=step["graph"])
        if ctx.current_scheduler_metrics_enabled:
            if step["kind"] == "prefill":  # metrics_reporter.log_prefill_stats: reporting ranks
                c.increment_prefill_cuda_graph_pass(value=step["graph"])
            if dp_attention:
                tokens = [0 if s["kind"] == "idle" else s["running"] for s in row]
                local = tokens[group]
                c.observe_dp_balance(
                    DPBalanceStats(
                        local_tokens=local,
                        max_tokens=max(tokens),
                        sum_tokens=sum(tokens),
                        local_attention_pairs=local * 10,
                        max_attention_pairs=max(tokens) * 10,
                        num_ranks=len(tokens),
                        sync_wait_seconds=0.001,
                    )
                )
            by_prio = None
            if priority:
                by_prio = {}
                for p in step["prio_running"]:
                    by_prio[p] = by_prio.get(p, 0) + 1
            stats = SchedulerStats(
                num_running_reqs=QueueCount(total=step["running"], by_priority=by_prio),
                num_queue_reqs=QueueCount(
                    total=step["queued"], by_priority={1: step["queued"]} if priority else None
                ),
                token_usage=step["usage"],
            )
            c.log_stats(stats)
    sys.stdout.flush()


def _truth(scenario: tuple, plan: list[list[dict]]) -> dict:
    tp, dp, dp_attention, _, steps = scenario
    last = plan[-1]
    graph = sum(1 for row in plan for s in row if s["kind"] != "idle" and s["graph"])
    eager = sum(1 for row in plan for s in row if s["kind"] != "idle" and not s["graph"])
    return {
        "sglang": _version(),
        "tp": tp,
        "dp": dp,
        "dp_attention": dp_attention,
        "running": sum(s["running"] for s in last),
        "waiting": sum(s["queued"] for s in last),
        "token_usage_max": max(s["usage"] for s in last),
        "graph_passes": graph,
        "eager_passes": eager,
        "dp_attention_steps": steps * dp if dp_attention else None,
        "steps": steps,
    }


def _version() -> str:
    import importlib.metadata

    return importlib.metadata.version("sglang")


def make(name: str, scenario: tuple, tmp: str, model: str) -> None:
    tp, dp, dp_attention, _, steps = scenario
    mp_dir = os.path.join(tmp, name)
    shutil.rmtree(mp_dir, ignore_errors=True)
    os.makedirs(mp_dir)
    groups = dp if dp > 1 else 1
    plan = _schedule(groups, steps, seed=len(name))
    ranks = tp if dp_attention or dp == 1 else dp
    for world_rank in range(ranks):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                _rank_main(model, mp_dir, scenario, world_rank, plan)
            except BaseException as e:
                print(f"rank {world_rank}: {e!r}", file=sys.stderr)
                code = 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert status == 0, (name, world_rank, status)
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, mp_dir)
    page = generate_latest(registry).decode()
    stem = f"sglang-{_version()}-{name}"
    header = (
        f"# generated by tests/fakes/engine/make_sglang_pages.py with sglang {_version()}'s own collectors\n"
    )
    (OUT / f"{stem}.prom").write_text(header + page)
    (OUT / f"{stem}.truth.json").write_text(json.dumps(_truth(scenario, plan), indent=1) + "\n")
    print(stem, len(page))


def main() -> None:
    tmp = tempfile.mkdtemp(prefix="sglang-pages-")
    model = _model_dir(tmp)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tmp  # selects the multiprocess value class at import
    from sglang.srt import runtime_context as rc  # imported once here; forked ranks inherit it
    from sglang.srt.observability import metrics_collector  # noqa: F401
    from sglang.srt.server_args import ServerArgs

    rc.publish(ServerArgs(model_path=model, skip_tokenizer_init=True, device="cuda"), role="scheduler")
    for name, scenario in SCENARIOS.items():
        if len(sys.argv) > 1 and name not in sys.argv[1:]:
            continue
        make(name, scenario, tmp, model)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
