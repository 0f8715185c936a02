"""The commands as a new user types them: a wrong path, a wrong port, a page the reader cannot use."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest

from exporter.analysis.engine_page import normalise_once
from exporter.cli import main
from exporter.sources.engine import read_once

SGLANG_DP_ATTENTION = "\n".join(
    [
        "# TYPE sglang:num_running_reqs gauge",
        *(f'sglang:num_running_reqs{{dp_rank="{d}",model_name="m",tp_rank="0"}} {d + 1}' for d in range(4)),
        "# TYPE sglang:num_queue_reqs gauge",
        *(f'sglang:num_queue_reqs{{dp_rank="{d}",model_name="m",tp_rank="0"}} {2 * d}' for d in range(4)),
        "",
    ]
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_record_into_a_missing_directory_says_so_and_exits_2(capsys):
    rc = main(["record", "/no/such/dir/x.jsonl", "--local", "--seconds", "0.1"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "cannot write /no/such/dir/x.jsonl: No such file or directory" in err
    assert "Traceback" not in err


def test_diagnose_of_a_refused_daemon_url_says_connection_refused_at_once(capsys):
    url = f"http://127.0.0.1:{free_port()}"
    start = time.monotonic()
    rc = main(["diagnose", "--url", url, "--seconds", "5"])
    took = time.monotonic() - start
    err = capsys.readouterr().err
    assert rc == 2 and took < 2.5
    assert f"cannot reach the daemon at {url}: connection refused" in err
    assert "no snapshot came in" not in err


def test_record_of_a_refused_daemon_url_says_connection_refused(tmp_path, capsys):
    rc = main(
        ["record", str(tmp_path / "r.jsonl"), "--url", f"http://127.0.0.1:{free_port()}", "--seconds", "5"]
    )
    assert rc == 2 and "connection refused" in capsys.readouterr().err


def test_inspect_of_a_refused_plain_http_port_says_connection_refused_not_ssl(capsys):
    port = free_port()
    rc = main(["inspect", "engine", f"http://127.0.0.1:{port}/metrics", "--timeout", "1"])
    err = capsys.readouterr().err
    assert rc == 1
    assert f"connection refused by 127.0.0.1:{port}" in err and "ssl" not in err


def test_inspect_of_a_page_of_vllm_families_it_does_not_read_says_which_it_reads(tmp_path, capsys):
    page = tmp_path / "other.prom"
    page.write_text(
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="16"} 1.0\n'
        "# TYPE vllm:request_success_total counter\n"
        'vllm:request_success_total{finished_reason="stop"} 3.0\n'
    )
    rc = main(["inspect", "engine", str(page)])
    err = capsys.readouterr().err
    assert rc == 1
    assert "no vllm:" not in err
    assert "the page has 2 vllm: families but none that boundwatch reads" in err
    assert "vllm:num_requests_running" in err


def test_inspect_prints_what_the_reader_returns_for_an_sglang_page_with_dp_attention(tmp_path, capsys):
    page = tmp_path / "sglang-dp.prom"
    page.write_text(SGLANG_DP_ATTENTION)
    reading = normalise_once(asyncio.run(read_once(str(page))))
    rc = main(["inspect", "engine", str(page)])
    data = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert (data["running"], data["waiting"]) == (reading.running, reading.waiting)
    # four dp ranks, each its own tp_rank 0: 1+2+3+4 running, 0+2+4+6 waiting (row 18 read waiting = null)
    assert (data["running"], data["waiting"]) == (pytest.approx(10.0), pytest.approx(12.0))


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--seconds", "2", "diagnose"], "--seconds is an option of `diagnose`: put it after the command"),
        (
            ["--no-nvml", "--seconds=1", "record", "x.jsonl"],
            "--seconds is an option of `record`: put it after",
        ),
        (["--url", "http://x", "catalogue"], "--url is an option of `diagnose` and `record` only"),
    ],
)
def test_a_commands_flag_typed_before_the_command_is_named_as_its_flag(argv, said, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert said in err
    assert "invalid choice" not in err


def test_an_unknown_flag_before_the_command_is_still_unrecognized(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--bogus", "diagnose"])
    assert exit_.value.code == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err
