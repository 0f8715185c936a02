"""Property tests of the page reader: any bytes give a reading or PageError, never NaN in what is integrated."""

from __future__ import annotations

import dataclasses
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.analysis.engine import accumulate
from exporter.analysis.engine_page import WANTED
from exporter.config import Config
from exporter.snapshot import Snapshot
from exporter.snapshot.engine import EngineReading
from exporter.sources.engine import DEFAULT_LIMITS, PageError, reading_from_bytes

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
