"""Property tests of the page reader: any bytes give a reading or PageError, never NaN in what is integrated."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
from engine_fixtures import PAGES, ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from exporter.analysis.engine import accumulate
from exporter.config import Config
from exporter.snapshot import Snapshot
from exporter.snapshot.engine import EngineReading
from exporter.snapshot.engine_names import WANTED
from exporter.sources.engine_scrape import (
    _SINGLE_PROCESS_MARKS,
    DEFAULT_LIMITS,
    PageError,
    Sample,
    _trie,
    looks_multiprocess,
    plain_samples,
    prefilter_page,
)
from tests.fakes.engine_reads import reading_from_bytes

ENGINE_SAMPLE_PAGE = ROOT / "bench" / "results" / "engine_sample_page.prom"
LIMITS = dataclasses.replace(DEFAULT_LIMITS, max_bytes=16_384, max_lines=400, max_kept_lines=200)
VALUES = st.one_of(
    st.sampled_from(
        ["NaN", "nan", "+Inf", "-Inf", "Inf", "-1", "-0", "0", "1e308", "1e309", "-1e-300", "0x10"]
    ),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.text(max_size=6),
)
LABEL_TEXT = st.text(st.characters(blacklist_characters='"\\\n', blacklist_categories=("Cs",)), max_size=40)
NAMES = st.sampled_from([*WANTED, "vllm:other", "sglang:x", "up"])


@st.composite
def sample_line(draw: st.DrawFn) -> bytes:
    name = draw(NAMES)
    labels = draw(
        st.dictionaries(
            st.sampled_from(["engine", "model_name", "tp_rank", "pid", "le"]), LABEL_TEXT, max_size=3
        )
    )
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{name}{{{inner}}} {draw(VALUES)}".encode()


LINE = st.one_of(
    sample_line(),
    NAMES.map(lambda n: f"# TYPE {n} {'counter' if n.endswith('_total') else 'gauge'}".encode()),
    st.binary(max_size=40),
    st.just(b"# \xff\xfe comment"),
)
PAGE = st.one_of(st.binary(max_size=2048), st.lists(LINE, max_size=60).map(b"\n".join))

FLOAT_FIELDS = [
    f.name
    for f in dataclasses.fields(EngineReading)
    if f.type in ("float | None", "float") and f.name != "scrape_seconds"
]


def snap(seq: int, reading: EngineReading) -> Snapshot:
    return Snapshot(seq=seq, at=float(seq), mono=float(seq), interval=0.5, dt=0.5, engines=(reading,))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=PAGE, second=PAGE)
def test_any_bytes_give_a_reading_or_page_error_and_never_nan_in_what_is_integrated(first, second):
    readings = []
    for data in (first, second):
        try:
            r = reading_from_bytes(data, name="vllm:8000", limits=LIMITS)
        except PageError:
            continue
        for name in FLOAT_FIELDS:
            value = getattr(r, name)
            assert value is None or (math.isfinite(value) and value >= 0), (name, value)
        assert len(r.model) <= LIMITS.max_label_chars
        assert r.rejected_values >= 0
        readings.append(r)
    if len(readings) == 2:
        inc = accumulate(snap(2, readings[1]), Config(), snap(1, readings[0]))
        for key, value in inc.series():
            assert math.isfinite(value) and value >= 0, (key, value)


TRICKY = st.sampled_from(
    [
        'vllm:num_requests_running{engine="0",} 3',  # a trailing comma
        'vllm:num_requests_running{engine="0"} 3 1700000000000',  # a timestamp
        'vllm:num_requests_running{engine="0"}\t3',
        'vllm:num_requests_running{engine="0"}  3  ',
        'vllm:num_requests_running{engine="a\\"b\\\\c\\nd"} 1',  # escapes
        'vllm:num_requests_running{engine="a}b{"} 1',
        'vllm:num_requests_running{engine="0"model="m"} 1',  # no comma: an error
        'vllm:num_requests_running{engine="0",engine="1"} 1',  # a label twice: an error
        'vllm:num_requests_running{ engine = "0" } 1',
        'vllm:num_requests_running{__name__="x"} 1',
        "vllm:num_requests_running 1_0",
        "vllm:num_requests_running 1 2 3",
        "vllm:num_requests_running " + "9" * 400,
        "# TYPE vllm:num_requests_running counter",  # a counter without _total: samples renamed
        '# TYPE "vllm:num_requests_running" gauge',
        "# HELP vllm:num_requests_running running",
        "# just a comment",
        "#",
    ]
)
TEXT_LINE = st.one_of(LINE.map(lambda b: b.decode(errors="replace")), TRICKY)


def _reference_prefilter(text: str) -> str:
    """The line-by-line cut the regular expression replaced: the oracle."""
    keep = [
        line
        for line in text.splitlines()
        if line.startswith(tuple(n + c for n in WANTED for c in ("{", " ")))
        or (line.startswith("# TYPE ") and line[7:].split(" ", 1)[0] in WANTED)
    ]
    keep.append("")
    return "\n".join(keep)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(TEXT_LINE, max_size=30), end=st.sampled_from(["", "\n", "\r\n"]))
def test_the_cut_and_the_plain_reader_agree_with_prometheus_clients_parser(lines, end):
    text = end.join(lines) if end else "\n".join(lines)
    assert prefilter_page(text) == _reference_prefilter(text)
    try:
        want = [
            (s.name, dict(s.labels), float(s.value))
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
        ]
    except Exception:
        want = None
    got = plain_samples(text)
    if got is not None:  # when the plain reader answers, it answers what the parser does
        assert want is not None
        assert [(s.name, s.labels, s.value) for s in got] == want or _same_with_nan(got, want)


def _same_with_nan(got: list, want: list) -> bool:
    return len(got) == len(want) and all(
        (g.name, g.labels) == (w[0], w[1]) and (g.value == w[2] or (math.isnan(g.value) and math.isnan(w[2])))
        for g, w in zip(got, want, strict=True)
    )


@pytest.mark.parametrize("path", sorted({*PAGES.glob("*.prom"), ENGINE_SAMPLE_PAGE}), ids=lambda p: p.name)
def test_every_fixture_page_cut_is_read_by_the_plain_reader_as_the_parser_reads_it(path):
    body = prefilter_page(path.read_text())
    got = plain_samples(body)
    assert got is not None  # real pages take the cheap path
    want = [
        Sample(s.name, dict(s.labels), float(s.value))
        for f in text_string_to_metric_families(body)
        for s in f.samples
    ]
    assert got == want


def test_the_cut_keeps_each_wanted_name_and_no_name_it_starts_or_ends() -> None:
    near = {n[:cut] for n in WANTED for cut in range(1, len(n))} | {
        n + x for n in WANTED for x in ("_", "s", ":x")
    }
    lines = []
    for name in sorted(set(WANTED) | near):
        lines += [f'{name}{{a="b"}} 1', f"{name} 2", f"# TYPE {name} gauge", f"# TYPE {name}", f"{name}\t3"]
    text = "\n".join(lines) + "\n"
    kept = prefilter_page(text)
    assert kept == _reference_prefilter(text)
    assert {line.split("{")[0].split(" ")[0] for line in kept.split("\n") if line and line[0] != "#"} == set(
        WANTED
    )


def _reference_multiprocess(text: str) -> bool | None:
    """The check before it avoided copying the page: the oracle."""
    if not any(p in text for p in ("vllm:", "sglang:")):
        return None
    text = "\n" + text
    return not any(mark in text for mark in _SINGLE_PROCESS_MARKS)


@pytest.mark.parametrize(
    "mark", [*_SINGLE_PROCESS_MARKS, "process_cpu_seconds_total 1", "x_created", "_created"]
)
@pytest.mark.parametrize("where", ["start", "middle", "end", "none"])
def test_a_multiprocess_page_is_told_as_before(mark: str, where: str) -> None:
    body = "vllm:num_requests_running 1\nvllm:x_total 2\n"
    mark = mark.lstrip("\n") if where == "start" else mark
    text = {
        "start": mark + "\n" + body,
        "middle": body + mark + "\n" + body,
        "end": body + mark,
        "none": body,
    }[where]
    assert looks_multiprocess(text) == _reference_multiprocess(text)
    assert looks_multiprocess(text.replace("vllm:", "up_")) is None


@given(
    st.sets(st.text("ab:_{", min_size=1, max_size=5), min_size=1, max_size=8), st.text("ab:_{", max_size=6)
)
def test_the_prefix_tree_matches_exactly_its_words(words: set[str], other: str) -> None:
    pattern = re.compile(_trie(words))
    assert all(pattern.fullmatch(w) for w in words)
    assert bool(pattern.fullmatch(other)) == (other in words)
