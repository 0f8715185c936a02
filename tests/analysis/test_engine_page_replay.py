"""The page normalised in analysis gives what the source normalised before, tick by tick and in a replay.

The old path is kept here as it was (main before issue 13's move): the source normalised each page
(`engine_page.normalise`, the model cut, the multiprocess files' per-pid counts and server count),
joined the process table's API-server count, and counted steps (`dedup.step_count`). The new path:
the source hands the page on raw (`raw_from_*`, the process table's count in `RawPage.servers`)
and the pipeline normalises it (`engine_page.read_raw`). Both run on many random pages and
random multiprocess dirs, one reading at a time and as Snapshots through the pipeline and replay.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client.mmap_dict import MmapedDict, mmap_key

from exporter.analysis import dedup, engine_page, pipeline
from exporter.config import Config
from exporter.snapshot import Snapshot
from exporter.snapshot.codec import from_json, to_json
from exporter.snapshot.engine import EngineReading, PageSample, refused_tuple
from exporter.snapshot.engine import cut as bounded  # the old path's bounded, one helper now
from exporter.snapshot.engine_names import WANTED, detect_kind
from exporter.sources.engine_scrape import (
    DEFAULT_LIMITS,
    VALUE_REASONS,
    MultiprocReader,
    PageError,
    PageLimits,
    looks_multiprocess,
    parse_page,
    prefilter_page,
    raw_from_multiproc,
    raw_from_page,
    sanitise,
)

# --- the old path, as sources/engine.py had it before session 8 (now sources/engine_scrape.py) -


def old_from_page(text: str, name: str, limits: PageLimits = DEFAULT_LIMITS) -> EngineReading:
    kept = prefilter_page(text).split("\n")
    truncated = len(kept) > limits.max_kept_lines + 1
    if truncated:
        kept = [*kept[: limits.max_kept_lines], ""]
    lost: Counter[str] = Counter(lines=1) if truncated else Counter()
    samples, refused = sanitise(parse_page("\n".join(kept), prefilter=False), limits)
    lost.update(refused)
    values = sum(refused[r] for r in VALUE_REASONS)
    if detect_kind(samples) is None:
        raise PageError("no engine metrics")
    reading = engine_page.normalise(samples, name=name, multiprocess=looks_multiprocess(text))
    reading = replace(
        reading,
        model=bounded(reading.model, limits.max_label_chars),
        rejected_values=values,
        page_truncated=truncated,
        page_refused=refused_tuple(lost),
    )
    return replace(reading, steps=dedup.step_count(reading))


def old_from_multiproc(reader: MultiprocReader, name: str, kind: str | None) -> EngineReading:
    raw, per_pid_raw = reader.read()
    samples, refused = sanitise(raw, reader.limits)
    refused.update(reader.refused)
    per_pid = tuple((pid, c) for pid, c in per_pid_raw if 0.0 <= c <= float(2**53))
    if detect_kind(samples) is None and kind is None:
        raise PageError("no engine metrics")
    reading = engine_page.normalise(
        samples, name=name, source="multiproc_files", multiprocess=True, kind=kind
    )
    reading = replace(
        reading,
        model=bounded(reading.model, reader.limits.max_label_chars),
        rejected_values=sum(refused[r] for r in VALUE_REASONS),
        page_truncated=reader.truncated,
        page_refused=refused_tuple(refused),
    )
    reading = replace(reading, iteration_count_by_pid=per_pid if reading.kind == "vllm" else ())
    if reading.kind == "vllm" and reading.api_server_count is None and per_pid:
        reading = replace(reading, api_server_count=len(per_pid), api_server_count_source="multiproc_files")
    return replace(reading, steps=dedup.step_count(reading))


def old_processes(reading: EngineReading, titled: int, cmdline: int | None, lone: bool) -> EngineReading:
    count, how = reading.api_server_count, reading.api_server_count_source
    if titled:
        count, how = titled, "processes"
    elif cmdline:
        count, how = cmdline, "cmdline"
    elif count is None and lone:
        count, how = 1, "processes"
    reading = replace(reading, api_server_count=count, api_server_count_source=how)
    return replace(reading, steps=dedup.step_count(reading))


def new_processes(reading: EngineReading, titled: int, cmdline: int | None, lone: bool) -> EngineReading:
    known = (titled, "processes") if titled else (cmdline, "cmdline") if cmdline else None
    assert reading.raw is not None
    return replace(reading, raw=replace(reading.raw, servers=known, lone_server=lone))


# --- random pages and multiprocess dirs -------------------------------------------------------

NAMES = [*WANTED, "vllm:other_total", "sglang:x", "process_cpu_seconds_total"]
LABELS = ["engine", "model_name", "tp_rank", "dp_rank", "pp_rank", "pid", "priority", "mode", "rank_state"]
VALUES = ["0", "1", "3", "7.5", "40", "1e3", "NaN", "-1", "+Inf", "1e300", "12345"]
LABEL_VALUES = ["", "0", "1", "2", "m", "model-" + "x" * 150, "decode_cuda_graph", "prefill_none", "active"]


def random_page(rng: random.Random) -> str:
    prefix = rng.choice(["vllm:", "sglang:"])
    lines = []
    for _ in range(rng.randint(1, 40)):
        name = rng.choice([n for n in NAMES if n.startswith(prefix)] + NAMES[-3:])
        if rng.random() < 0.15:
            lines.append(f"# TYPE {name} {'counter' if name.endswith('_total') else 'gauge'}")
        labels = {k: rng.choice(LABEL_VALUES) for k in rng.sample(LABELS, rng.randint(0, 4))}
        inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
        lines.append(f"{name}{{{inner}}} {rng.choice(VALUES)}")
    if rng.random() < 0.1:
        lines.append("a bad line {")  # left to prometheus_client's parser
    return "\n".join(lines) + "\n"


def random_multiproc_dir(rng: random.Random, path: Path) -> None:
    """Write the files a vLLM engine with 1-4 API servers would leave, values random."""
    path.mkdir()
    pids = rng.sample(range(1000, 9000), rng.randint(1, 4))
    for pid in pids:
        counters = MmapedDict(str(path / f"counter_{pid}.db"))
        histograms = MmapedDict(str(path / f"histogram_{pid}.db"))
        recent = MmapedDict(str(path / f"gauge_mostrecent_{pid}.db"))
        per_pid = MmapedDict(str(path / f"gauge_all_{pid}.db"))
        for engine in map(str, range(rng.randint(1, 2))):
            lv = ["m", engine]
            for n in ("vllm:generation_tokens_total", "vllm:prompt_tokens_total"):
                counters.write_value(
                    mmap_key(n, n, ["model_name", "engine"], lv, ""), rng.randint(0, 9999), 0.0
                )
            h = "vllm:iteration_tokens_total"
            for le in ("1.0", "8.0", "+Inf"):
                key = mmap_key(h, h + "_bucket", ["model_name", "engine", "le"], [*lv, le], "")
                histograms.write_value(key, float(rng.randint(0, 300)), 0.0)
            histograms.write_value(mmap_key(h, h + "_sum", ["model_name", "engine"], lv, ""), 99.0, 0.0)
            for n in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
                key = mmap_key(n, n, ["model_name", "engine"], lv, "")
                recent.write_value(key, float(rng.randint(0, 50)), rng.uniform(1.0, 9.0))
            kv = "vllm:kv_cache_usage_perc"
            per_pid.write_value(mmap_key(kv, kv, ["model_name", "engine"], lv, ""), rng.random(), 0.0)
        for f in (counters, histograms, recent, per_pid):
            f.close()


def _processes(rng: random.Random) -> tuple[int, int | None, bool]:
    titled = rng.choice([0, 0, 1, 2, 4])
    cmdline = rng.choice([None, None, 2, 3])
    return titled, cmdline, rng.random() < 0.5


@pytest.mark.parametrize("seed", range(8))
def test_random_pages_normalise_in_analysis_as_they_did_in_the_source(seed):
    rng = random.Random(seed)
    compared = 0
    for _ in range(100):
        text = random_page(rng)
        limits = PageLimits(max_label_chars=rng.choice([8, 64, 128]), max_kept_lines=rng.choice([5, 5000]))
        try:
            old = old_from_page(text, "e:1", limits)
        except PageError:
            with pytest.raises(PageError):
                raw_from_page(text, name="e:1", limits=limits)
            continue
        raw = raw_from_page(text, name="e:1", limits=limits)
        assert raw.raw is not None and raw.running is None and raw.steps is None
        procs = _processes(rng)
        new = engine_page.read_raw(new_processes(raw, *procs), limits.max_label_chars)
        assert replace(new, raw=None) == old_processes(old, *procs)
        compared += 1
    assert compared >= 40


@pytest.mark.parametrize("seed", range(6))
def test_random_multiprocess_dirs_normalise_in_analysis_as_they_did_in_the_source(seed, tmp_path):
    rng = random.Random(seed)
    for i in range(5):
        path = tmp_path / str(i)
        random_multiproc_dir(rng, path)
        kind = rng.choice([None, "vllm"])
        old = old_from_multiproc(MultiprocReader(str(path)), "vllm:8000", kind)
        procs = _processes(rng)
        raw = raw_from_multiproc(MultiprocReader(str(path)), name="vllm:8000", kind=kind)
        new = engine_page.read_raw(new_processes(raw, *procs))
        assert replace(new, raw=None) == old_processes(old, *procs)
        assert new.iteration_count_by_pid and new.steps is not None


def _stream(seed: int) -> tuple[list[Snapshot], list[Snapshot]]:
    """Return the same random stream of two engines' pages as the old source's and the new source's Snapshots."""
    rng = random.Random(seed)
    old_snaps, new_snaps = [], []
    counters = {"e:1": 0, "e:2": 0}
    procs = {"e:1": (2, None, False), "e:2": (0, None, True)}
    for seq in range(1, 41):
        old_engines, new_engines = [], []
        for name in counters:
            counters[name] += rng.randint(0, 30)
            text = (
                f'vllm:num_requests_running{{engine="0",model_name="m"}} {rng.randint(0, 9)}\n'
                f'vllm:iteration_tokens_total_count{{engine="0",model_name="m"}} {counters[name]}\n'
                f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {counters[name] * 3}\n'
                f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {counters[name]}\n'
                f'vllm:generation_tokens_total{{engine="0",model_name="m"}} {counters[name] * 7}\n'
            )
            if rng.random() < 0.1:
                text = "vllm:num_requests_running NaN\n" * 2  # every sample refused: a failed read
            try:
                old = old_processes(old_from_page(text, name), *procs[name])
                new = new_processes(raw_from_page(text, name=name), *procs[name])
            except PageError:
                old = new = EngineReading(name=name, kind="unknown", error="bad page")
            old_engines.append(old)
            new_engines.append(new)
        for out, engines in ((old_snaps, old_engines), (new_snaps, new_engines)):
            out.append(
                Snapshot(seq, 1000.0 + seq / 2, seq / 2, 0.5, 0.5 if seq > 1 else 0.0, engines=tuple(engines))
            )
    return old_snaps, new_snaps


def _same(a: Snapshot, b: Snapshot) -> None:
    assert tuple(replace(e, raw=None) for e in b.engines) == a.engines
    assert b.totals == a.totals and b.verdicts == a.verdicts


@pytest.mark.parametrize("seed", range(10))
def test_a_stream_of_random_pages_gives_the_same_snapshots_live_and_in_replay(seed):
    cfg = Config()
    old_snaps, new_snaps = _stream(seed)
    old_hist: list[Snapshot] = []
    new_hist: list[Snapshot] = []
    for old_raw, new_raw in zip(old_snaps, new_snaps, strict=True):
        old_hist.append(pipeline.advance(old_hist, old_raw, cfg))
        new_hist.append(pipeline.advance(new_hist, new_raw, cfg))
        _same(old_hist[-1], new_hist[-1])
    # a recording holds what each tick made: replayed, the normalised pages give the same Snapshots
    old_rec = [from_json(to_json(s, totals=False)) for s in old_hist]
    new_rec = [from_json(to_json(s, totals=False)) for s in new_hist]
    assert all(e.raw is not None for s in new_rec for e in s.engines if not e.error)
    for a, b in zip(pipeline.replay(old_rec, cfg), pipeline.replay(new_rec, cfg), strict=True):
        _same(a, b)


def test_one_page_that_fails_to_normalise_is_counted_and_never_hides_the_others():
    good = raw_from_page('vllm:num_requests_running{engine="0"} 3\n', name="vllm:1")
    bad = raw_from_page('vllm:num_requests_running{engine="0"} 4\n', name="vllm:2")
    assert bad.raw is not None
    # a sample whose labels are no pairs: normalise raises on it (no source writes one)
    odd = PageSample("vllm:x", (("a",),), 1.0)  # type: ignore[arg-type]
    broken = dataclasses.replace(bad.raw, samples=(*bad.raw.samples, odd))
    snap = Snapshot(1, 0.0, 0.0, 0.5, 0.0, engines=(good, dataclasses.replace(bad, raw=broken)))
    one, two = engine_page.normalise_engines(snap).engines
    assert (one.error, one.running) == ("", 3.0)
    assert two.error.startswith("page not normalised: ValueError") and two.running is None
    assert dict(two.page_refused) == {"unparsable": 1} and two.raw is None


@pytest.mark.parametrize("seed", range(3))
def test_a_carried_page_is_normalised_once_and_reads_as_a_fresh_one(seed, monkeypatch):
    """A page carried between slow reads (its samples, other process figures each tick) is normalised once."""
    rng = random.Random(seed)
    calls = Counter[str]()
    real = engine_page.normalise
    monkeypatch.setattr(engine_page, "normalise", lambda *a, **k: calls.update([k["name"]]) or real(*a, **k))
    compared = 0
    for _ in range(30):
        try:
            raw = raw_from_page(random_page(rng), name="e:1")
        except PageError:
            continue
        assert raw.raw is not None
        calls.clear()
        ticks = [new_processes(raw, *_processes(rng)) for _ in range(4)]  # a RawPage a tick, as the source
        got = [engine_page.read_raw(r) for r in ticks]
        assert calls["e:1"] == 1  # the first tick's only
        fresh = []
        for r in ticks:
            engine_page._NORMALISED.clear()
            fresh.append(engine_page.read_raw(r))
        assert got == fresh
        compared += 1
        # another engine's name, or the same values in other samples: normalised again
        calls.clear()
        engine_page.read_raw(replace(ticks[0], name="e:2"))
        copy = dataclasses.replace(ticks[0].raw, samples=tuple(list(raw.raw.samples)))
        assert engine_page.read_raw(replace(ticks[0], raw=copy)) == got[0]
        assert calls == Counter({"e:2": 1, "e:1": 1})
    assert compared >= 10
