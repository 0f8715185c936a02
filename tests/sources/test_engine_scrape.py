"""Bounds at the edge of one read of an engine's page or multiprocess files: what is refused, cut and counted."""

from __future__ import annotations

import dataclasses
import math
import struct
from pathlib import Path

import pytest
from prometheus_client.mmap_dict import MmapedDict, mmap_key

from exporter.sources.engine_scrape import (
    DEFAULT_LIMITS,
    MultiprocReader,
    PageError,
)
from tests.fakes.engine_reads import reading_from_bytes, reading_from_multiproc, reading_from_page
from tests.fakes.vllm_pages import page


@pytest.mark.parametrize(
    "value, field",
    [
        ("NaN", "running"),
        ("+Inf", "running"),
        ("-Inf", "waiting"),
        ("-3", "waiting"),
        ("1e300", "running"),  # no engine runs 1e300 requests
    ],
)
def test_nan_infinite_negative_and_implausible_values_are_refused_and_counted(value, field):
    args = {"running": "10", "waiting": "2", field: value}
    r = reading_from_page(page(**args).decode())
    assert getattr(r, field) is None
    assert r.rejected_values == 1
    assert r.prompt_tokens_total == 100.0  # the rest of the page is read


def test_a_negative_counter_is_refused():
    r = reading_from_page(page(prompt="-12").decode())
    assert (r.prompt_tokens_total, r.rejected_values, r.running) == (None, 1, 10.0)


def test_the_line_budget_counts_every_line_of_the_page():
    body = b"".join(b"# a comment\n" for _ in range(100)) + b'vllm:num_requests_running{engine="0"} 1\n'
    assert reading_from_bytes(body).running == 1.0
    with pytest.raises(PageError):  # past a budget of 100 lines only the comments are left
        reading_from_bytes(body, limits=dataclasses.replace(DEFAULT_LIMITS, max_lines=100))


def test_the_byte_budget_is_configurable_and_cuts_at_a_line_end():
    line = b'vllm:num_requests_running{engine="%d"} 1\n'
    body = b"".join(line % i for i in range(10_000))
    limits = dataclasses.replace(DEFAULT_LIMITS, max_bytes=4096)
    r = reading_from_bytes(body, limits=limits)
    assert r.page_truncated
    kept = body[:4096]
    assert r.running == kept[: kept.rfind(b"\n") + 1].count(b"\n")


def test_long_label_values_are_cut_at_the_edge():
    long = "x" * 10_000
    r = reading_from_page(page().decode().replace('model_name="m"', f'model_name="{long}"'))
    assert r.model == "x" * 128


def test_a_page_of_garbage_is_the_module_error_not_a_crash():
    with pytest.raises(PageError):
        reading_from_bytes(b'vllm:num_requests_running{engine="0" 1\n\x00\xff{{{')


def _db(path: Path, name: str, value: float) -> None:
    """Write one vLLM gauge sample into a prometheus_client multiprocess file."""
    d = MmapedDict(str(path))
    key = mmap_key(name, name, ["engine", "model_name"], ["0", "m"], "")
    d.write_value(key, value, 1.0)
    d.close()


def test_multiprocess_files_count_refused_values_and_files_over_the_byte_budget(tmp_path: Path) -> None:
    """NaN and infinite values in one process's file count by reason; a file over the byte budget counts as bytes."""
    _db(tmp_path / "gauge_livemostrecent_100.db", "vllm:num_requests_running", 4.0)
    _db(tmp_path / "gauge_livemostrecent_101.db", "vllm:num_requests_waiting", math.nan)
    _db(tmp_path / "gauge_livemostrecent_102.db", "vllm:kv_cache_usage_perc", -math.inf)
    big = tmp_path / "counter_103.db"
    big.write_bytes(struct.pack("i", 1 << 30) + b"\0" * 4)  # claims 1 GiB used
    reader = MultiprocReader(str(tmp_path))
    r = reading_from_multiproc(reader)
    assert r.running == 4.0 and r.waiting is None
    assert dict(r.page_refused) == {"nan": 1, "infinite": 1, "bytes": 1}
    assert r.rejected_values == 2 and r.page_truncated
