"""Normalise an engine's metric samples (vLLM 0.10 to newest, SGLang) into an EngineReading.

Pure: the input is any iterable of samples with `.name`, `.labels` and `.value` (what
prometheus_client's parser or its multiprocess collector yields), the output a dataclass.
The names read are in `exporter/snapshot/engine_names.py` (their history in
`research/vllm-metrics.md`); renamed metrics are read under every name they had, the newest first.

The engine source reads and bounds each page and hands it on raw (`EngineReading.raw`, a
`RawPage`); the pipeline turns it into the reading's figures every tick (`normalise_engines`:
`read_raw`, then the step count of `dedup.step_count`), so `replay` normalises a recorded page
again; a page carried unchanged between slow reads (the same samples) is normalised once. One
engine whose page fails to normalise becomes an error reading, counted as unparsable, and never
hides the others.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from exporter.analysis.dedup import collapse_pid_series, step_count
from exporter.analysis.memo import ByIdentity
from exporter.snapshot import Snapshot
from exporter.snapshot.engine import EngineReading, RawPage, StepCount, cut, refused_plus
from exporter.snapshot.engine_names import (
    SGLANG_DP_ATTENTION_STEPS,
    SGLANG_GENERATION,
    SGLANG_KV,
    SGLANG_PASSES,
    SGLANG_PREEMPTIONS,
    SGLANG_PROMPT,
    SGLANG_RUNNING,
    SGLANG_SPEC_ACCEPT_LENGTH,
    SGLANG_SPEC_ACCEPT_RATE,
    SGLANG_WAITING,
    VLLM_GENERATION,
    VLLM_ITER_COUNT,
    VLLM_ITER_SUM,
    VLLM_KV,
    VLLM_PREEMPTIONS,
    VLLM_PROMPT,
    VLLM_RUNNING,
    VLLM_SPEC_ACCEPTED,
    VLLM_SPEC_DRAFT_TOKENS,
    VLLM_SPEC_DRAFTS,
    VLLM_WAITING,
    detect_kind,
)
from exporter.snapshot.frozen import replace

# Scheduler gauges logged as a total under priority="" plus a per-priority breakdown (QueueCount).
_SGLANG_PRIORITY_TOTALS = frozenset({*SGLANG_RUNNING, *SGLANG_WAITING})


class SampleLike(Protocol):
    """A metric sample: what prometheus_client's parser yields."""

    @property
    def name(self) -> str: ...
    @property
    def labels(self) -> Mapping[str, str] | tuple[tuple[str, str], ...]: ...
    @property
    def value(self) -> float: ...


def _by_name(samples: Iterable[SampleLike]) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for s in samples:
        out[s.name].append((dict(s.labels), float(s.value)))
    return out


def _first(by_name: Mapping[str, list[tuple[dict[str, str], float]]], names: Sequence[str]) -> str | None:
    return next((n for n in names if n in by_name), None)


def _rank(labels: Mapping[str, str]) -> tuple[int, int] | None:
    """Return (pp_rank, tp_rank) of an SGLang series, or None when a label is not a small integer."""
    try:
        pp, tp = int(labels.get("pp_rank", "0")), int(labels.get("tp_rank", "0"))
    except ValueError:
        return None
    return (pp, tp) if 0 <= pp < 100_000 and 0 <= tp < 100_000 else None


def _sglang_leads(series: list[tuple[dict[str, str], float]]) -> list[tuple[dict[str, str], float]]:
    """Keep, per DP rank, the series of its lowest (pp_rank, tp_rank): the rank that reports its group.

    Every TP rank of a group reports the same scheduler state. With DP attention each DP group
    reports from its attn_tp_rank 0, which carries the global tp_rank (2 for group 1 of dp 2 x tp 4),
    so the lowest tp_rank is taken per dp_rank, not tp_rank 0.
    """
    lead: dict[str, tuple[int, int]] = {}
    for labels, _ in series:
        rank = _rank(labels)
        dp = labels.get("dp_rank", "")
        if rank is not None and (dp not in lead or rank < lead[dp]):
            lead[dp] = rank
    return [(labels, v) for labels, v in series if _rank(labels) == lead.get(labels.get("dp_rank", ""))]


def _priority_totals(series: list[tuple[dict[str, str], float]]) -> list[tuple[dict[str, str], float]]:
    """Keep the priority="" totals of a gauge that also carries a per-priority breakdown."""
    totals = [(labels, v) for labels, v in series if labels.get("priority") == ""]
    return totals if totals else series


def _series(
    by_name: Mapping[str, list[tuple[dict[str, str], float]]], names: Sequence[str], sglang: bool
) -> list[tuple[dict[str, str], float]] | None:
    name = _first(by_name, names)
    if name is None:
        return None
    series = by_name[name]
    if sglang:
        series = _sglang_leads(series)
        if name in _SGLANG_PRIORITY_TOTALS:
            series = _priority_totals(series)
    return series


def _total(
    by_name: Mapping[str, list[tuple[dict[str, str], float]]], names: Sequence[str], *, sglang: bool = False
) -> float | None:
    """Sum a counter or additive gauge over engines / DP ranks, pid series collapsed."""
    series = _series(by_name, names, sglang)
    if series is None:
        return None
    collapsed, _ = collapse_pid_series(series, how="max")
    return sum(v for _, v in collapsed) if collapsed else None


def _max(
    by_name: Mapping[str, list[tuple[dict[str, str], float]]], names: Sequence[str], *, sglang: bool = False
) -> tuple[float | None, int]:
    """Return the largest value of a ratio gauge across engines, and how many pid series it had."""
    series = _series(by_name, names, sglang)
    if series is None:
        return None, 0
    collapsed, pids = collapse_pid_series(series, how="max")
    return (max(v for _, v in collapsed) if collapsed else None), pids


def _passes_by_kind(
    by_name: Mapping[str, list[tuple[dict[str, str], float]]],
) -> tuple[float | None, float | None]:
    """Return SGLang's (graph, eager) forward passes: cuda_graph_passes_total split by its mode label."""
    series = _series(by_name, (SGLANG_PASSES,), True)
    if series is None:
        return None, None
    graph = eager = 0.0
    for labels, v in collapse_pid_series(series, how="max")[0]:
        mode = labels.get("mode", "")
        if mode.endswith("_cuda_graph"):
            graph += v
        elif mode.endswith("_none"):
            eager += v
    return graph, eager


def _model(by_name: Mapping[str, list[tuple[dict[str, str], float]]]) -> str:
    models = sorted(
        {
            labels["model_name"]
            for series in by_name.values()
            for labels, _ in series
            if "model_name" in labels
        }
    )
    return ",".join(models)


def normalise(
    samples: Iterable[SampleLike],
    *,
    name: str = "",
    url: str = "",
    source: str = "http",
    multiprocess: bool | None = None,
    kind: str | None = None,
) -> EngineReading:
    """Return the engine reading the samples describe (name defaults to the kind)."""
    rows = list(samples)
    kind = kind or detect_kind(rows) or "unknown"
    by_name = _by_name(rows)
    common: dict[str, Any] = {
        "name": name or kind,
        "kind": kind,
        "url": url,
        "source": source,
        "model": _model(by_name),
    }
    if kind == "sglang":
        return _sglang(by_name, common, multiprocess)
    return _vllm(by_name, common, multiprocess)


def _vllm(
    by_name: Mapping[str, list[tuple[dict[str, str], float]]],
    common: dict[str, Any],
    multiprocess: bool | None,
) -> EngineReading:
    kv, kv_pids = _max(by_name, VLLM_KV)
    engines = {labels.get("engine", "0") for series in by_name.values() for labels, _ in series}
    iter_count = _total(by_name, (VLLM_ITER_COUNT,))
    # Per-pid kv series exist only up to vLLM 0.11.0, so their absence does not mean single-process.
    mp = bool(multiprocess) if multiprocess is not None else kv_pids > 1
    reading = EngineReading(
        **common,
        running=_total(by_name, VLLM_RUNNING),
        waiting=_total(by_name, VLLM_WAITING),
        kv_cache_usage=kv,
        kv_cache_pid_series=kv_pids,
        prompt_tokens_total=_total(by_name, VLLM_PROMPT),
        generation_tokens_total=_total(by_name, VLLM_GENERATION),
        preemptions_total=_total(by_name, VLLM_PREEMPTIONS),
        spec_draft_tokens_total=_total(by_name, VLLM_SPEC_DRAFT_TOKENS),
        spec_accepted_tokens_total=_total(by_name, VLLM_SPEC_ACCEPTED),
        spec_drafts_total=_total(by_name, VLLM_SPEC_DRAFTS),
        iteration_count=iter_count,
        iteration_tokens_sum=_total(by_name, (VLLM_ITER_SUM,)),
        multiprocess=mp,
        data_parallel_engines=max(1, len(engines)),
    )
    if multiprocess is False:  # a single-process registry serves one API server's own figures
        return replace(reading, api_server_count=1, api_server_count_source="page")
    if kv_pids > 1:
        return replace(reading, api_server_count=kv_pids, api_server_count_source="kv_cache_pids")
    return reading


def _sglang(
    by_name: Mapping[str, list[tuple[dict[str, str], float]]],
    common: dict[str, Any],
    multiprocess: bool | None,
) -> EngineReading:
    kv, kv_pids = _max(by_name, SGLANG_KV, sglang=True)
    accept, _ = _max(by_name, SGLANG_SPEC_ACCEPT_RATE, sglang=True)
    accept_length, _ = _max(by_name, SGLANG_SPEC_ACCEPT_LENGTH, sglang=True)
    if not accept_length:  # speculation off (or no verify yet): the rate's 0 is not an acceptance
        accept = None
    graph, eager = _passes_by_kind(by_name)
    passes = None if graph is None or eager is None else graph + eager
    dp_steps = _total(by_name, (SGLANG_DP_ATTENTION_STEPS,), sglang=True)
    steps: StepCount | None
    if dp_steps is not None:
        steps = StepCount("dp_attention_steps", dp_steps)
    else:
        steps = StepCount("forward_passes", passes) if passes is not None else None
    dp = {labels.get("dp_rank", "0") for series in by_name.values() for labels, _ in series}
    return EngineReading(
        **common,
        running=_total(by_name, SGLANG_RUNNING, sglang=True),
        waiting=_total(by_name, SGLANG_WAITING, sglang=True),
        kv_cache_usage=kv,
        kv_cache_pid_series=kv_pids,
        prompt_tokens_total=_total(by_name, SGLANG_PROMPT),
        generation_tokens_total=_total(by_name, SGLANG_GENERATION),
        preemptions_total=_total(by_name, SGLANG_PREEMPTIONS, sglang=True),
        spec_acceptance=accept,
        forward_passes=passes,
        graph_passes_total=graph,
        eager_passes_total=eager,
        dp_attention_steps_total=dp_steps,
        steps=steps,
        multiprocess=True if multiprocess is None else multiprocess,
        api_server_count=1,  # the tokenizer manager in the main process serves HTTP
        api_server_count_source="page",
        data_parallel_engines=max(1, len(dp)),
    )


# The figures of a reading that its page gives (`read_raw` takes them from `normalise`); the rest
# (processes, cgroups, placements, what the read lost) the source fills.
PAGE_FIGURES: tuple[str, ...] = (
    "model",
    "running",
    "waiting",
    "kv_cache_usage",
    "kv_cache_pid_series",
    "prompt_tokens_total",
    "generation_tokens_total",
    "preemptions_total",
    "spec_draft_tokens_total",
    "spec_accepted_tokens_total",
    "spec_drafts_total",
    "spec_acceptance",
    "iteration_count",
    "iteration_tokens_sum",
    "forward_passes",
    "graph_passes_total",
    "eager_passes_total",
    "dp_attention_steps_total",
    "multiprocess",
    "data_parallel_engines",
    "api_server_count",
    "api_server_count_source",
)


def _server_count(raw: RawPage, reading: EngineReading) -> tuple[int | None, str]:
    """Return the API-server count and where it came from: the process table, the files, the page."""
    if raw.servers is not None:
        return raw.servers
    count, how = reading.api_server_count, reading.api_server_count_source
    if count is None and reading.kind == "vllm" and raw.iteration_count_by_pid:
        return len(raw.iteration_count_by_pid), "multiproc_files"
    if count is None and raw.lone_server:
        return 1, "processes"
    return count, how


# A page's samples -> its normalised page, for a page carried between slow reads (while an agent
# serves the engine's counts, the same samples every tick for `engine.slow_read_seconds`, in a
# RawPage the source makes anew each tick with that tick's process figures).
_NORMALISED: ByIdentity[EngineReading] = ByIdentity(16)


def _normalised(raw: RawPage, name: str, url: str, source: str) -> EngineReading:
    """Return `normalise` of a raw page (once per samples, name, URL, source, kind: the result is frozen)."""
    return _NORMALISED.get(
        (raw.samples,),
        lambda: normalise(
            raw.samples, name=name, url=url, source=source, multiprocess=raw.multiprocess, kind=raw.kind
        ),
        (name, url, source, raw.multiprocess, raw.kind),
    )


def read_raw(reading: EngineReading, max_label_chars: int = 128) -> EngineReading:
    """Return a reading with the figures its raw page gives (normalise) and its step count (the page kept)."""
    raw = reading.raw
    if raw is None:
        return reading
    page = _normalised(raw, reading.name, reading.url, reading.source)
    figures = {f: getattr(page, f) for f in PAGE_FIGURES}
    figures["model"] = cut(page.model, max_label_chars)
    per_pid = raw.iteration_count_by_pid if page.kind == "vllm" else ()
    out = replace(reading, **figures, kind=page.kind, iteration_count_by_pid=per_pid)
    count, how = _server_count(raw, out)
    out = replace(out, api_server_count=count, api_server_count_source=how)
    return replace(out, steps=step_count(out))


def normalise_once(reading: EngineReading, max_label_chars: int = 128) -> EngineReading:
    """Return a one-shot read's reading normalised (read_raw), its raw page dropped (`boundwatch inspect`)."""
    return replace(read_raw(reading, max_label_chars), raw=None)


def _failed(reading: EngineReading, exc: Exception) -> EngineReading:
    """Return the error reading of an engine whose page could not be normalised (counted as unparsable)."""
    raw = reading.raw
    count: tuple[int | None, str] = (reading.api_server_count, reading.api_server_count_source)
    if raw is not None and raw.servers is not None:
        count = raw.servers
    elif raw is not None and raw.lone_server:
        count = (1, "processes")
    return replace(
        reading,
        raw=None,
        api_server_count=count[0],
        api_server_count_source=count[1],
        page_refused=refused_plus(reading.page_refused, "unparsable"),
        error=cut(f"page not normalised: {type(exc).__name__}: {exc}"),
    )


# How long a new model name must read the same before it is served (boundwatch_engine_info's label):
# a page whose model_name changes each read would make a new series each read. A real switch restarts
# the engine (new processes: served at once); the same processes serving another name wait this long.
MODEL_HOLD_SECONDS = 30.0


def hold_models(snap: Snapshot, prev: Snapshot | None, hold_seconds: float = MODEL_HOLD_SECONDS) -> Snapshot:
    """Return the Snapshot with each engine's model name held where its page changed it under it.

    An engine keeps the name it served while the same processes serve it: a read that fails or
    names no model keeps it, and a new name is served once it has read the same for `hold_seconds`;
    until then it is pending and each such read counts as page_refused reason `model`. New
    processes (a restart) are served their name at once.
    """
    if prev is None or not snap.engines or not prev.engines:
        return snap
    before = {p.name: p for p in prev.engines}
    engines, changed = [], False
    for e in snap.engines:
        held = _held_model(e, before.get(e.name), snap.mono, hold_seconds)
        changed = changed or held is not e
        engines.append(held)
    return replace(snap, engines=tuple(engines)) if changed else snap


def _held_model(e: EngineReading, p: EngineReading | None, now: float, hold_seconds: float) -> EngineReading:
    """Return one engine's reading with its served model name (hold_models)."""
    if p is None or not p.model or e.model == p.model:
        return e if e.model_pending is None else replace(e, model_pending=None)
    if e.pids and p.pids and not set(e.pids) & set(p.pids):  # restarted: its own name at once
        return e
    if not e.model:  # a failed read, or a page that names no model: the name stays
        return replace(e, model=p.model, model_pending=p.model_pending)
    pending = p.model_pending
    if pending is None or pending[0] != e.model:
        pending = (e.model, now)
    if now - pending[1] >= hold_seconds:
        return replace(e, model_pending=None)
    return replace(
        e, model=p.model, model_pending=pending, page_refused=refused_plus(e.page_refused, "model")
    )


def normalise_engines(snap: Snapshot, max_label_chars: int = 128) -> Snapshot:
    """Return the Snapshot with every raw engine reading normalised (read_raw); one that fails is an error reading.

    A reading normalised before (a recording, a replay) is normalised again from its page.
    """
    if not any(e.raw is not None for e in snap.engines):
        return snap
    engines = []
    for e in snap.engines:
        if e.raw is not None:  # a failed read has none
            try:
                e = read_raw(e, max_label_chars)
            except Exception as exc:  # one engine's page must not hide the others
                e = _failed(e, exc)
        engines.append(e)
    return replace(snap, engines=tuple(engines))
