"""`boundwatch inspect engine`: the first thing an operator runs."""

from __future__ import annotations

import http.server
import json
import threading

import pytest
import vllm_sim
from engine_fixtures import PAGES

from exporter.cli import main


def inspect(capsys, *args: str) -> tuple[int, dict, str]:
    rc = main(["inspect", "engine", *args])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 else {}), err


def test_a_page_file_prints_the_normalised_reading(capsys):
    rc, data, _ = inspect(capsys, str(PAGES / "sglang-docs-production-metrics.prom"))
    assert rc == 0
    assert (data["kind"], data["model"], data["running"], data["waiting"]) == (
        "sglang",
        "meta-llama/Llama-3.1-8B-Instruct",
        162.0,
        2826.0,
    )
    assert data["generation_tokens_total"] == 7.557572e06


def test_a_multiprocess_dir_prints_per_server_counts_and_step_bounds(tmp_path, capsys):
    truth, pids = vllm_sim.run_engine(str(tmp_path), n_servers=3, steps=50, concurrency=9)
    rc, data, _ = inspect(capsys, str(tmp_path))
    assert rc == 0
    assert data["read_from"] == "multiproc_files"
    assert data["api_servers"]["count"] == 3 and data["api_servers"]["count_from"] == "multiproc_files"
    assert sorted(int(p) for p in data["api_servers"]["iteration_count_by_pid"]) == sorted(pids)
    assert data["steps"]["method"] == "output_steps"
    assert data["steps"]["lower"] <= truth.steps_with_output <= data["steps"]["upper"] == truth.observations


class Counting(http.server.BaseHTTPRequestHandler):
    """Serve a one-API-server vLLM page whose counters grow by 100 tokens and 10 steps per request."""

    hits = 0

    def do_GET(self) -> None:
        type(self).hits += 1
        n = type(self).hits
        body = (
            f'vllm:generation_tokens_total{{engine="0",model_name="m"}} {100 * n}\n'
            f'vllm:iteration_tokens_total_count{{engine="0",model_name="m"}} {10 * n}\n'
            f'vllm:num_requests_running{{engine="0",model_name="m"}} 4\n'
            "vllm:request_success_created 1.7e9\n"
        ).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a: object) -> None:
        pass


@pytest.fixture
def counting_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Counting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()


def test_a_url_read_twice_gives_tokens_and_steps_per_second(counting_server, capsys):
    rc, data, _ = inspect(capsys, counting_server, "--interval", "0.2")
    assert rc == 0
    assert data["engine"] == f"vllm:{counting_server.split(':')[2].split('/')[0]}"
    assert data["steps"]["method"] == "output_steps"
    assert data["steps"]["lower"] == data["steps"]["total"] and data["steps"]["upper"] is None  # never exact
    rates = data["rates"]
    assert rates["generation_tokens_per_second"] == pytest.approx(100 / rates["seconds"])
    assert rates["steps_per_second"] == {"lower_bound": pytest.approx(10 / rates["seconds"])}


def test_an_unreadable_target_exits_non_zero_with_a_clear_message(tmp_path, capsys):
    rc, _, err = inspect(capsys, "http://127.0.0.1:9/metrics", "--timeout", "0.5")
    assert rc == 1 and "cannot read engine metrics at http://127.0.0.1:9/metrics" in err
    page = tmp_path / "not-an-engine.prom"
    page.write_text("# TYPE up gauge\nup 1\n")
    rc, _, err = inspect(capsys, str(page))
    assert rc == 1 and "no vllm: or sglang: metrics" in err
