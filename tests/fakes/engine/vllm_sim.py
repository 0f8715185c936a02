"""vLLM's metric definitions, written from research/vllm-metrics.md §1.1, and a multi-API-server simulation.

The definitions use prometheus_client exactly the way vLLM's PrometheusStatLogger does (names,
types, `model_name`/`engine` labels, multiprocess modes), so a registry built from them renders
the pages vLLM would. `run_engine` runs one simulated EngineCore and N API servers as real
processes in prometheus multiprocess mode: the core splits each step's outputs by API server
and attaches its scheduler stats to one of them, each API server records what it received, as
vLLM's AsyncLLM output handler does (research §2.3). That reproduces the
`iteration_tokens_total_count` double count, and the run's known truth comes back with it.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
from dataclasses import asdict, dataclass, field
from typing import Any

LABELS = ["model_name", "engine"]
TOKEN_BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000]
ITERATION_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
TTFT_BUCKETS = [
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
]
LATENCY_BUCKETS = [
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0]
N_BUCKETS = [1, 2, 5, 10, 20]


def define(version: str = "0.33", registry: Any = None) -> dict[str, Any]:
    """Create vLLM V1's engine metrics (version "0.10", "0.11" or "0.33" naming) and return them by short name."""
    from prometheus_client import REGISTRY, Counter, Gauge, Histogram

    reg = REGISTRY if registry is None else registry
    m: dict[str, Any] = {}

    def gauge(
        key: str, name: str, doc: str, mode: str | None = "mostrecent", labels: list[str] = LABELS
    ) -> None:
        kwargs = {"multiprocess_mode": mode} if mode else {}
        m[key] = Gauge(name, doc, labelnames=labels, registry=reg, **kwargs)

    def counter(key: str, name: str, doc: str, labels: list[str] = LABELS) -> None:
        m[key] = Counter(name, doc, labelnames=labels, registry=reg)

    def hist(key: str, name: str, doc: str, buckets: list[float]) -> None:
        m[key] = Histogram(name, doc, labelnames=LABELS, buckets=buckets, registry=reg)

    old = version in ("0.10", "0.11")
    gauge("running", "vllm:num_requests_running", "Number of requests in model execution batches.")
    gauge("waiting", "vllm:num_requests_waiting", "Number of requests waiting to be processed.")
    if not old:
        gauge(
            "waiting_reason",
            "vllm:num_requests_waiting_by_reason",
            "Waiting by reason.",
            labels=[*LABELS, "reason"],
        )
        gauge("sleep", "vllm:engine_sleep_state", "Engine sleep state.", labels=[*LABELS, "sleep_state"])
    # 0.10.0 and 0.11.0 created kv_cache_usage_perc without a multiprocess mode: 'all', one series per pid.
    gauge(
        "kv",
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        None if old else "mostrecent",
    )
    if version == "0.10":
        gauge("gpu_kv", "vllm:gpu_cache_usage_perc", "GPU KV-cache usage. DEPRECATED.")
        counter("gpu_pq", "vllm:gpu_prefix_cache_queries", "GPU prefix cache queries. DEPRECATED.")
        counter("gpu_ph", "vllm:gpu_prefix_cache_hits", "GPU prefix cache hits. DEPRECATED.")
    counter("pq", "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.")
    counter("ph", "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
    counter("epq", "vllm:external_prefix_cache_queries", "External prefix cache queries.")
    counter("eph", "vllm:external_prefix_cache_hits", "External prefix cache hits.")
    counter("mmq", "vllm:mm_cache_queries", "Multi-modal cache queries.")
    counter("mmh", "vllm:mm_cache_hits", "Multi-modal cache hits.")
    counter("preemptions", "vllm:num_preemptions", "Cumulative number of preemption from the engine.")
    counter("prompt", "vllm:prompt_tokens", "Number of prefill tokens processed.")
    counter("prompt_src", "vllm:prompt_tokens_by_source", "Prompt tokens by source.", [*LABELS, "source"])
    counter("prompt_cached", "vllm:prompt_tokens_cached", "Cached prompt tokens.")
    counter("generation", "vllm:generation_tokens", "Number of generation tokens processed.")
    counter(
        "success",
        "vllm:request_success",
        "Count of successfully processed requests.",
        [*LABELS, "finished_reason"],
    )
    hist("req_prompt", "vllm:request_prompt_tokens", "Number of prefill tokens processed.", TOKEN_BUCKETS)
    hist("req_gen", "vllm:request_generation_tokens", "Number of generation tokens processed.", TOKEN_BUCKETS)
    hist(
        "iteration",
        "vllm:iteration_tokens_total",
        "Histogram of number of tokens per engine_step.",
        ITERATION_BUCKETS,
    )
    hist(
        "max_gen",
        "vllm:request_max_num_generation_tokens",
        "Max generation tokens in a sequence group.",
        TOKEN_BUCKETS,
    )
    hist("params_n", "vllm:request_params_n", "The n request parameter.", N_BUCKETS)
    hist("params_max", "vllm:request_params_max_tokens", "The max_tokens request parameter.", TOKEN_BUCKETS)
    hist(
        "ttft",
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        TTFT_BUCKETS,
    )
    if version != "0.10":
        hist(
            "itl",
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        )
        hist("req_tpot", "vllm:request_time_per_output_token_seconds", "Mean TPOT per request.", ITL_BUCKETS)
    if version in ("0.10", "0.11"):
        hist("tpot", "vllm:time_per_output_token_seconds", "Histogram of time per output token.", ITL_BUCKETS)
    hist(
        "e2e",
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        LATENCY_BUCKETS,
    )
    for key in ("queue", "inference", "prefill", "decode"):
        hist(
            key,
            f"vllm:request_{key}_time_seconds",
            f"Histogram of time spent in {key.upper()} phase.",
            LATENCY_BUCKETS,
        )
    if not old:
        hist("req_preempt", "vllm:request_num_preemptions", "Preemptions per request.", N_BUCKETS)
        hist(
            "req_kv",
            "vllm:request_prefill_kv_computed_tokens",
            "KV tokens computed in prefill.",
            TOKEN_BUCKETS,
        )
    counter("spec_drafts", "vllm:spec_decode_num_drafts", "Number of spec decoding drafts.")
    counter("spec_draft_tokens", "vllm:spec_decode_num_draft_tokens", "Number of draft tokens.")
    counter("spec_accepted", "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.")
    counter(
        "spec_pos",
        "vllm:spec_decode_num_accepted_tokens_per_pos",
        "Accepted tokens per position.",
        [*LABELS, "position"],
    )
    m["lora"] = Gauge(
        "vllm:lora_requests_info",
        "Running stats on lora requests.",
        labelnames=["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
        multiprocess_mode="sum",
        registry=reg,
    )
    m["cache_config"] = Gauge(
        "vllm:cache_config_info",
        "Information of the LLMEngine CacheConfig",
        labelnames=[
            "engine",
            "block_size",
            "gpu_memory_utilization",
            "num_gpu_blocks",
            "enable_prefix_caching",
        ],
        multiprocess_mode="mostrecent",
        registry=reg,
    )
    return m


HIGHR_BUCKETS = [
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    0.75,
    1,
    1.5,
    2,
    2.5,
    3,
    3.5,
    4,
    4.5,
    5,
    7.5,
    10,
    30,
    60,
]
HANDLERS = ("/v1/chat/completions", "/v1/completions", "/metrics", "/health", "/v1/models")


def define_http(registry: Any = None) -> dict[str, Any]:
    """Create the HTTP families vLLM's /metrics also carries (prometheus_fastapi_instrumentator defaults)."""
    from prometheus_client import REGISTRY, Counter, Histogram, Summary

    reg = REGISTRY if registry is None else registry
    return {
        "requests": Counter(
            "http_requests",
            "Total number of requests by method, status and handler.",
            ["method", "status", "handler"],
            registry=reg,
        ),
        "req_size": Summary(
            "http_request_size_bytes",
            "Content length of incoming requests by handler.",
            ["handler"],
            registry=reg,
        ),
        "resp_size": Summary(
            "http_response_size_bytes",
            "Content length of outgoing responses by handler.",
            ["handler"],
            registry=reg,
        ),
        "highr": Histogram(
            "http_request_duration_highr_seconds",
            "Latency with many buckets but no API labels.",
            buckets=HIGHR_BUCKETS,
            registry=reg,
        ),
        "duration": Histogram(
            "http_request_duration_seconds",
            "Latency with only few buckets by handler.",
            ["handler", "method"],
            buckets=[0.1, 0.5, 1],
            registry=reg,
        ),
    }


def fill_http(m: dict[str, Any], seed: int = 1) -> None:
    """Record some traffic on every HTTP series."""
    rnd = random.Random(seed)
    for handler in HANDLERS:
        for status in ("2xx", "4xx"):
            m["requests"].labels("POST" if handler.startswith("/v1/c") else "GET", status, handler).inc(
                rnd.randint(1, 999)
            )
        m["req_size"].labels(handler).observe(rnd.randint(100, 100000))
        m["resp_size"].labels(handler).observe(rnd.randint(100, 100000))
        m["duration"].labels(handler, "POST").observe(rnd.random())
        m["highr"].observe(rnd.random() * 5)


def fill(
    m: dict[str, Any], model: str = "Qwen/Qwen3-8B", engines: tuple[str, ...] = ("0",), seed: int = 1
) -> None:
    """Give every series of a definition set realistic values (one observation pass per engine)."""
    rnd = random.Random(seed)
    for eng in engines:
        lv = (model, eng)
        m["running"].labels(*lv).set(rnd.randint(1, 256))
        m["waiting"].labels(*lv).set(rnd.randint(0, 64))
        m["kv"].labels(*lv).set(rnd.random())
        for key in ("gpu_kv",):
            if key in m:
                m[key].labels(*lv).set(rnd.random())
        for key in ("waiting_reason",):
            if key in m:
                for reason in ("capacity", "deferred"):
                    m[key].labels(*lv, reason).set(rnd.randint(0, 9))
        if "sleep" in m:
            for state in ("awake", "weights_offloaded", "discard_all"):
                m["sleep"].labels(*lv, state).set(1 if state == "awake" else 0)
        for key in (
            "pq",
            "ph",
            "epq",
            "eph",
            "mmq",
            "mmh",
            "preemptions",
            "prompt",
            "prompt_cached",
            "generation",
            "spec_drafts",
            "spec_draft_tokens",
            "spec_accepted",
            "gpu_pq",
            "gpu_ph",
        ):
            if key in m:
                m[key].labels(*lv).inc(rnd.randint(1, 10**6))
        for src in ("local_compute", "local_cache_hit", "external_kv_transfer"):
            m["prompt_src"].labels(*lv, src).inc(rnd.randint(1, 10**6))
        for reason in ("stop", "length", "abort", "error", "repetition"):
            m["success"].labels(*lv, reason).inc(rnd.randint(1, 1000))
        for pos in range(3):
            m["spec_pos"].labels(*lv, str(pos)).inc(rnd.randint(1, 1000))
        for key, metric in m.items():
            if type(metric).__name__ == "Histogram":
                child = metric.labels(*lv)
                for _ in range(50):
                    child.observe(
                        rnd.expovariate(
                            1
                            / (
                                100.0
                                if "tok" in key or key.startswith(("req", "iter", "max", "params"))
                                else 0.5
                            )
                        )
                    )
        m["cache_config"].labels(eng, "16", "0.9", "32768", "True").set(1)
    m["lora"].labels("0", "", "").set(1.7e9)


# --- the multi-API-server run ---------------------------------------------------------------


@dataclass
class Truth:
    """What really happened in a simulated run."""

    steps: int = 0  # engine steps
    steps_with_output: int = 0  # steps in which at least one request emitted a token
    observations: int = 0  # Σ over steps of API servers with output: what iteration_tokens_total_count shows
    generation_tokens: int = 0
    finished: int = 0
    prompt_tokens: int = 0
    running: int = 0  # last scheduler stats sent
    waiting: int = 0
    kv: float = 0.0
    checkpoints: list[dict[str, float]] = field(default_factory=list)  # truth at each checkpoint


def use_multiproc_dir(mp_dir: str) -> None:
    """Switch this process's prometheus_client to multiprocess mode over mp_dir (even if already imported)."""
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = mp_dir
    from prometheus_client import values

    values.ValueClass = values.get_value_class()


def _api_server(
    index: int, mp_dir: str, inbox: Any, acks: Any, barrier: Any, version: str, model: str
) -> None:
    use_multiproc_dir(mp_dir)
    m = define(version)
    lv = (model, "0")
    iteration, gen, prompt = m["iteration"].labels(*lv), m["generation"].labels(*lv), m["prompt"].labels(*lv)
    while True:
        msg = inbox.get()
        if msg == "stop":
            return
        if msg == "checkpoint":
            barrier.wait()  # the core and every server are here: the files are settled
            barrier.wait()  # the test has read them
            continue
        outputs, stats = msg
        if outputs:  # IterationStats exist only when this server had outputs (async_llm.py:883-885)
            tokens = 0
            for new_prompt, new_gen, finished in outputs:
                if finished:
                    m["success"].labels(*lv, "stop").inc()
                tokens += new_prompt + new_gen
                prompt.inc(new_prompt)
                gen.inc(new_gen)
            iteration.observe(tokens)
        if stats is not None:
            running, waiting, kv = stats
            m["running"].labels(*lv).set(running)
            m["waiting"].labels(*lv).set(waiting)
            m["kv"].labels(*lv).set(kv)
            acks.put(index)


def _engine_core(
    n_servers: int,
    steps: int,
    concurrency: int,
    checkpoint_every: int,
    seed: int,
    inboxes: Any,
    acks: Any,
    barrier: Any,
    out: Any,
) -> None:
    rnd = random.Random(seed)
    truth = Truth()
    # Each request: (owning API server, prompt tokens still to prefill, tokens left to generate).
    requests: list[list[int]] = []
    next_server = 0
    waiting = 0
    for step in range(1, steps + 1):
        while len(requests) < concurrency:
            requests.append([next_server, rnd.choice((0, 0, 512, 2048)), rnd.randint(1, 64)])
            next_server = (next_server + 1) % n_servers
        waiting = rnd.randint(0, 5)
        by_client: dict[int, list[tuple[int, int, bool]]] = {}
        for req in requests:
            done = req[2] == 1
            if req[1] > 0:  # a chunked-prefill step: no output unless the prefill completes
                chunk = min(req[1], 1024)
                req[1] -= chunk
                if req[1] > 0:
                    continue
                by_client.setdefault(req[0], []).append((chunk, 1, done))
                truth.prompt_tokens += chunk
            else:
                by_client.setdefault(req[0], []).append((0, 1, done))
            truth.generation_tokens += 1
            truth.finished += done
            req[2] -= 1
        requests = [r for r in requests if r[2] > 0]
        truth.steps += 1
        if by_client:
            truth.steps_with_output += 1
            truth.observations += len(by_client)
        stats = (len(requests), waiting, round(rnd.random(), 4))
        truth.running, truth.waiting, truth.kv = stats
        # Stats ride on exactly one client's message: the first with outputs, else client 0 (scheduler.py:2660-2674).
        stats_to = next(iter(by_client), 0)
        for client in range(n_servers):
            outs = by_client.get(client, [])
            if outs or client == stats_to:
                inboxes[client].put((outs, stats if client == stats_to else None))
        # Real API servers record a step's stats within about a millisecond, far inside a step; waiting for
        # the one that got them keeps the simulated order of 'mostrecent' writes the order of the steps.
        acks.get(timeout=60)
        if checkpoint_every and step % checkpoint_every == 0:
            for q in inboxes:
                q.put("checkpoint")
            truth.checkpoints.append(
                {
                    "steps": truth.steps,
                    "steps_with_output": truth.steps_with_output,
                    "observations": truth.observations,
                    "generation_tokens": truth.generation_tokens,
                    "prompt_tokens": truth.prompt_tokens,
                    "running": truth.running,
                    "waiting": truth.waiting,
                    "kv": truth.kv,
                }
            )
            barrier.wait()
            barrier.wait()
    for q in inboxes:
        q.put("stop")
    out.put(json.dumps(asdict(truth)))


def _wait_result(out: Any, procs: list[Any], timeout: float = 120.0) -> str:
    import queue
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return str(out.get(timeout=0.2))
        except queue.Empty:
            failed = [p.name for p in procs if p.exitcode not in (None, 0)]
            if failed:
                raise RuntimeError(f"simulated processes failed: {failed}") from None
    raise TimeoutError("simulated engine did not finish")


def run_engine(
    mp_dir: str,
    n_servers: int,
    steps: int,
    concurrency: int,
    *,
    checkpoint_every: int = 0,
    on_checkpoint: Any = None,
    seed: int = 7,
    version: str = "0.11",
    model: str = "Qwen/Qwen3-8B",
) -> tuple[Truth, list[int]]:
    """Run one EngineCore and n API servers in multiprocess mode; return the truth and the servers' pids.

    `on_checkpoint(i)` runs in the caller every `checkpoint_every` steps while all processes wait.
    """
    ctx = mp.get_context("spawn")
    inboxes = [ctx.Queue() for _ in range(n_servers)]
    barrier = ctx.Barrier(n_servers + 2)
    acks = ctx.Queue()
    out = ctx.Queue()
    servers = [
        ctx.Process(
            target=_api_server,
            args=(i, mp_dir, inboxes[i], acks, barrier, version, model),
            name=f"APIServer_{i}",
        )
        for i in range(n_servers)
    ]
    core = ctx.Process(
        target=_engine_core,
        args=(n_servers, steps, concurrency, checkpoint_every, seed, inboxes, acks, barrier, out),
    )
    for p in [*servers, core]:
        p.start()
    try:
        n_checkpoints = steps // checkpoint_every if checkpoint_every else 0
        for i in range(n_checkpoints):
            barrier.wait(timeout=60)
            if on_checkpoint is not None:
                on_checkpoint(i)
            barrier.wait(timeout=60)
        truth = Truth(**json.loads(_wait_result(out, [*servers, core])))
        for p in [*servers, core]:
            p.join(timeout=60)
    finally:
        for p in [*servers, core]:
            if p.is_alive():
                p.terminate()
    return truth, [p.pid for p in servers if p.pid is not None]


# --- SGLang --------------------------------------------------------------------------------


def sglang_scheduler(mp_dir: str, tp_rank: int, dp_rank: int, running: int, queued: int, passes: int) -> None:
    """Write what one SGLang scheduler (one TP rank of one DP rank) records, in multiprocess mode."""
    use_multiproc_dir(mp_dir)
    from prometheus_client import Counter, Gauge

    labels = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank", "dp_rank"]
    lv = ("meta-llama/Llama-3.1-8B-Instruct", "unified", str(tp_rank), "0", "0", str(dp_rank))
    Gauge(
        "sglang:num_running_reqs", "The number of running requests.", labels, multiprocess_mode="mostrecent"
    ).labels(*lv).set(running)
    Gauge(
        "sglang:num_queue_reqs",
        "The number of requests in the waiting queue.",
        labels,
        multiprocess_mode="mostrecent",
    ).labels(*lv).set(queued)
    Gauge("sglang:token_usage", "The token usage.", labels, multiprocess_mode="mostrecent").labels(*lv).set(
        0.25 + 0.1 * dp_rank
    )
    Counter("sglang:cuda_graph_passes", "Forward passes.", [*labels, "mode"]).labels(
        *lv, "decode_cuda_graph"
    ).inc(passes)


def sglang_tokenizer(mp_dir: str, prompt: int, generation: int) -> None:
    """Write what SGLang's tokenizer manager records, in multiprocess mode."""
    use_multiproc_dir(mp_dir)
    from prometheus_client import Counter

    lv = ("meta-llama/Llama-3.1-8B-Instruct", "unified")
    Counter(
        "sglang:prompt_tokens", "Number of prefill tokens processed.", ["model_name", "engine_type"]
    ).labels(*lv).inc(prompt)
    Counter(
        "sglang:generation_tokens", "Number of generation tokens processed.", ["model_name", "engine_type"]
    ).labels(*lv).inc(generation)


def run_sglang(mp_dir: str, tp: int = 2, dp: int = 2) -> None:
    """Run tp x dp scheduler processes and one tokenizer process of a simulated SGLang engine."""
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(target=sglang_scheduler, args=(mp_dir, t, d, 10 + d, 3 * d, 1000 * (d + 1)))
        for d in range(dp)
        for t in range(tp)
    ]
    procs.append(ctx.Process(target=sglang_tokenizer, args=(mp_dir, 5000, 700)))
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
