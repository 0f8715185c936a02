"""What processes on the host write and boundwatch reads: nested flags, long titles, blank configs, odd paths.

Anyone on the host can start a process that looks like an engine, with any command line, title,
environment or files: each of these stopped the engine source for every engine, or held its thread.
"""

from __future__ import annotations

import time
from pathlib import Path

from prometheus_client.mmap_dict import MmapedDict, mmap_key

from exporter.sources import placement
from exporter.sources.engine_discovery import batch_limit
from exporter.sources.engine_flags import graph_config
from exporter.sources.engine_scrape import MultiprocReader, multiproc_dir_usable
from exporter.sources.procs import ProcInfo
from tests.fakes.engine_reads import reading_from_multiproc


def mmap_db(path: Path, name: str, value: float) -> None:
    d = MmapedDict(str(path))
    d.write_value(mmap_key(name, name, ["engine", "model_name"], ["0", "m"], ""), value, 1.0)
    d.close()


def test_a_flag_nested_past_the_json_parsers_depth_is_refused_not_raised():
    got = graph_config("vllm", ("vllm", "serve", "m", "-O", "[" * 5000, "--speculative-config", "{" * 5000))
    assert got is not None and got.refused == 2


def test_a_rank_of_thousands_of_digits_in_a_title_is_no_rank():
    title = "VLLM::EngineCore_DP" + "7" * 5000
    assert placement._role(ProcInfo(5, 1, "python3", (title,), 1))[0] == "other"
    worker = "VLLM::Worker_TP" + "3" * 5000
    assert placement._role(ProcInfo(6, 1, "python3", (worker,), 1))[0] == "other"
    assert placement._role(ProcInfo(7, 1, "python3", ("VLLM::Worker_DP1_TP3",), 1))[1:] == (1, None, 3)


def test_a_config_file_of_blank_lines_is_read_at_once(tmp_path: Path):
    proc = tmp_path / "proc"
    (proc / "40").mkdir(parents=True)
    (proc / "40" / "cwd").symlink_to(tmp_path)
    (tmp_path / "c.yaml").write_bytes(b"\n" * (1 << 19) + b"max-num-seqs: 96\n")
    start = time.process_time()
    limit = batch_limit(str(proc), 40, "vllm", ("vllm", "serve", "m", "--config", "c.yaml"))
    assert time.process_time() - start < 1.0  # `^\s*` over the blank lines took minutes
    assert limit == 96


def test_a_multiprocess_dir_whose_name_is_a_glob_pattern_is_read_as_that_dir(tmp_path: Path):
    odd = tmp_path / "mp[0]*"
    odd.mkdir()
    (tmp_path / "mp0x").mkdir()  # what the pattern would also match
    mmap_db(odd / "gauge_livemostrecent_100.db", "vllm:num_requests_running", 3.0)
    assert multiproc_dir_usable(str(odd)) and not multiproc_dir_usable(str(tmp_path / "mp0x"))
    assert not multiproc_dir_usable(str(tmp_path / "absent")) and not multiproc_dir_usable(str(odd / "x.db"))
    assert reading_from_multiproc(MultiprocReader(str(odd))).running == 3.0


def test_a_multiprocess_file_cut_inside_a_value_or_a_fifo_loses_only_itself(tmp_path: Path):
    import os
    import struct

    mmap_db(tmp_path / "gauge_livemostrecent_100.db", "vllm:num_requests_running", 3.0)
    cut = tmp_path / "gauge_livemostrecent_101.db"
    mmap_db(cut, "vllm:num_requests_waiting", 5.0)
    data = bytearray(cut.read_bytes())
    (used,) = struct.unpack_from("i", data, 0)
    struct.pack_into("i", data, 0, used - 8)  # the used mark now ends inside the last value
    cut.write_bytes(bytes(data))
    os.mkfifo(tmp_path / "counter_102.db")  # opening it to read would wait for a writer for good
    start = time.monotonic()
    reader = MultiprocReader(str(tmp_path))
    r = reading_from_multiproc(reader)
    assert time.monotonic() - start < 5
    assert r.running == 3.0 and r.waiting is None
    assert reader.refused["files"] == 1  # the FIFO, counted; the cut file is one being written


def test_a_multiprocess_read_unpacks_at_most_its_budget_of_entries(tmp_path: Path):
    d = MmapedDict(str(tmp_path / "gauge_livemostrecent_100.db"))
    for i in range(6000):  # one process's file with 6,000 series of a read name
        key = mmap_key("vllm:num_requests_running", "vllm:num_requests_running", ["engine"], [str(i)], "")
        d.write_value(key, 1.0, 1.0)
    d.close()
    reader = MultiprocReader(str(tmp_path))
    r = reading_from_multiproc(reader)
    assert reader.refused["lines"] == 1000 and r.page_truncated
    assert sum(len(i.entries) for i in reader._index.values()) == 5000  # the page path's kept lines


def test_a_page_of_long_irregular_lines_is_refused_at_once():
    import pytest

    from exporter.sources.engine_scrape import PageError
    from tests.fakes.engine_reads import reading_from_page
    from tests.fakes.vllm_pages import page

    labels = ", ".join(f'l{i}="v"' for i in range(20_000))  # ", ": not the plain format
    start = time.process_time()
    with pytest.raises(PageError):  # one such line of 200 KB: seconds in the fallback parser
        reading_from_page(page().decode() + f"vllm:num_requests_waiting{{{labels}}} 1\n")
    many = "".join(f'vllm:num_requests_running{{engine="{i}", {labels[:3000]}}} 1\n' for i in range(1000))
    with pytest.raises(PageError):
        reading_from_page(many)  # 3 MB the plain parser refused: not handed to the quadratic one
    assert time.process_time() - start < 2.0


def test_thousands_of_titled_processes_in_a_chain_are_looked_at_in_linear_time(tmp_path: Path):
    from exporter.sources.engine_discovery import MAX_ENGINES, find_engines

    chain = [ProcInfo(10 + i, 9 + i, "python3", ("VLLM::APIServer_0",), i) for i in range(8000)]
    start = time.process_time()
    targets, unread = find_engines(str(tmp_path), chain)  # no /proc files: no environment, no sockets
    assert time.process_time() - start < 2.0  # each process's ancestors walked once, not once per process
    assert len(targets) == MAX_ENGINES and unread > 0


def test_a_command_line_of_many_words_keeps_the_first_1024():
    import subprocess
    import sys

    from exporter.sources import procs
    from tests.fakes.wait import wait_until

    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()", *["x"] * 20_000], stdin=subprocess.PIPE
    )
    try:
        words = wait_until(
            lambda: procs.read_cmdline("/proc", child.pid)[3:] and procs.read_cmdline("/proc", child.pid)
        )
        assert len(words) == procs.MAX_CMDLINE_WORDS and words[-1] == "x"
        assert procs.cmdline_of("/proc", child.pid)[1]  # and it says it was cut
    finally:
        child.kill()
        child.wait()
