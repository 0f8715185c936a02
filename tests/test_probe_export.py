"""The probe against real /metrics pages: reading the sidecar's counters, rendering boundwatch_probe_*."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from types import MappingProxyType

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.export import probe as export_probe
from exporter.export.collectors import SnapshotCollector
from exporter.export.families import render
from exporter.probe import check, logic
from exporter.snapshot import Snapshot
from exporter.snapshot.gpu import GpuReading
from exporter.snapshot.probe import ProbeSummary
from exporter.snapshot.totals import BusyTotals, GpuSource, Totals

UUID0 = "GPU-caae7614-31f3-a614-966f-97619c318eb5"
UUID1 = "GPU-0b1c2d3e-0000-1111-2222-333344445555"


def _snapshot(busy: BusyTotals, probe: dict | None = None) -> Snapshot:
    return Snapshot(
        seq=7,
        at=1.8e9,
        mono=100.0,
        interval=0.5,
        dt=0.5,
        gpus=(
            GpuReading(index=0, uuid=UUID0, name="NVIDIA H200", driver="580.159.04", utilization=0.5),
            GpuReading(index=1, uuid=UUID1, name="NVIDIA H200", driver="580.159.04", utilization=0.0),
        ),
        totals=Totals(busy=busy),
        probe=MappingProxyType(probe or {}),
    )


def _page(snap: Snapshot) -> str:
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(lambda: snap, interval=0.5, max_age=5.0, clock=lambda: snap.mono))
    return generate_latest(reg).decode()


def _counters(busy0: float, obs0: float) -> BusyTotals:
    busy = {GpuSource(0, "cupti"): busy0, GpuSource(0, "gpm"): busy0 + 0.1, GpuSource(1, "gpm"): 0.0}
    observed = {GpuSource(0, "cupti"): obs0, GpuSource(0, "gpm"): obs0, GpuSource(1, "gpm"): obs0}
    return BusyTotals(busy_seconds=busy, observed_seconds=observed)


def test_gpu_label_found_by_uuid_in_either_spelling() -> None:
    page = _page(_snapshot(_counters(1.0, 10.0)))
    assert check.gpu_label_for_uuid(page, UUID1) == "1"
    assert check.gpu_label_for_uuid(page, UUID0.removeprefix("GPU-").upper()) == "0"
    assert check.gpu_label_for_uuid(page, "GPU-ffffffff-0000-0000-0000-000000000000") is None


def test_busy_counters_between_two_real_pages() -> None:
    before = check.busy_counters(_page(_snapshot(_counters(10.0, 40.0))), "0")
    after = check.busy_counters(_page(_snapshot(_counters(11.25, 45.0))), "0")
    assert before["cupti"] == (10.0, 40.0)
    busy = logic.busy_from_counters(before, after)
    assert busy["cupti"]["busy_ratio"] == pytest.approx(0.25)
    assert busy["gpm"]["busy_ratio"] == pytest.approx(0.25)
    assert check.busy_counters(_page(_snapshot(_counters(1.0, 1.0))), "1") == {"gpm": (0.0, 1.0)}


@pytest.fixture
def served_page() -> Iterator[tuple[str, str]]:
    page = _page(_snapshot(_counters(3.0, 12.0)))

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics", page
    finally:
        server.shutdown()
        server.server_close()


def test_fetch_reads_the_page_over_http(served_page: tuple[str, str]) -> None:
    url, page = served_page
    text = check.fetch(url)
    assert text == page
    assert check.busy_counters(text, "0")["cupti"] == (3.0, 12.0)


def test_fetch_raises_when_nothing_listens() -> None:
    with pytest.raises(OSError):
        check.fetch("http://127.0.0.1:9/metrics", timeout=0.5)


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_probe_gauges_render_from_the_snapshot_summary() -> None:
    result = {
        "schema": 1,
        "finished_at": 1.8e9 - 30,
        "bandwidth": logic.evaluate_bandwidth(4.271e12, 4.273e12, logic.nominal_for("NVIDIA H200"), True),
        "duty": {
            "phases": [
                logic.evaluate_duty_phase(0.25, 0.25, {"cupti": 0.2503, "gpm": 0.2481}),
                logic.evaluate_duty_phase(0.9, 0.9, {"cupti": 0.8995, "gpm": 0.8991}),
            ]
        },
    }
    probe = {"0": logic.summarize(logic.finish(result)), "1": logic.summarize(logic.unavailable("OOM"))}
    samples = _samples(_page(_snapshot(BusyTotals(), probe)))
    g0 = (("gpu", "0"),)
    assert samples[("boundwatch_probe_hbm_bandwidth_bytes_per_second", g0)] == pytest.approx(4.271e12)
    assert samples[("boundwatch_probe_hbm_bandwidth_ratio", g0)] == pytest.approx(4.271 / 4.8)
    assert samples[("boundwatch_probe_success", g0)] == 1.0
    assert samples[("boundwatch_probe_last_run_timestamp_seconds", g0)] == 1.8e9 - 30
    assert samples[
        ("boundwatch_probe_duty_error_ratio", (("gpu", "0"), ("source", "cupti")))
    ] == pytest.approx(
        -0.0005  # the worse of +0.03 and -0.05 points
    )
    assert samples[("boundwatch_probe_duty_error_ratio", (("gpu", "0"), ("source", "gpm")))] == pytest.approx(
        -0.0019
    )
    # GPU 1's probe could not run: no success sample, no bandwidth
    assert not [k for k in samples if k[0].startswith("boundwatch_probe_") and ("gpu", "1") in k[1]]


def test_no_probe_no_probe_families() -> None:
    text = _page(_snapshot(BusyTotals()))
    assert "boundwatch_probe_" not in text
    assert all(
        not fam.samples
        for fam in render(export_probe.FAMILIES, _snapshot(BusyTotals(), {"0": ProbeSummary()}))
    )


def test_failed_probe_reads_zero() -> None:
    result = {"schema": 1, "duty": {"phases": [logic.evaluate_duty_phase(0.5, 0.5, {"cupti": 0.56})]}}
    samples = _samples(_page(_snapshot(BusyTotals(), {"0": logic.summarize(logic.finish(result))})))
    assert samples[("boundwatch_probe_success", (("gpu", "0"),))] == 0.0
    assert ("boundwatch_probe_hbm_bandwidth_bytes_per_second", (("gpu", "0"),)) not in samples
