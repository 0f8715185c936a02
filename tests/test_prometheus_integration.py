"""End to end: a real Prometheus scrapes the running daemon and PromQL returns boundwatch series."""

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.promserver import PROMETHEUS, http_get, running_daemon, running_prometheus

pytestmark = [
    pytest.mark.prometheus,
    pytest.mark.skipif(PROMETHEUS is None, reason="prometheus is not installed (make test installs it)"),
    pytest.mark.timeout(120),
]


def test_real_prometheus_scrapes_the_daemon_and_promql_returns_its_series(tmp_path):
    with running_daemon(tmp_path / "daemon", engine_pages=()) as daemon:
        status, body = http_get(daemon.metrics_url)
        names = {f.name for f in text_string_to_metric_families(body.decode())}
        assert status == 200
        assert {"boundwatch_build_info", "boundwatch_source_up", "boundwatch_host_cpus"} <= names
        with running_prometheus(tmp_path / "prom", {"boundwatch": [daemon.target]}) as prom:
            info = prom.wait_for('boundwatch_build_info{job="boundwatch"}')
            assert info[0]["metric"]["version"]
            up = prom.wait_for('boundwatch_source_up{source="host"}')
            assert up[0]["value"][1] == "1"
            ticks = prom.wait_for("rate(boundwatch_ticks_total[5s]) > 0", timeout=40)
            assert 0 < float(ticks[0]["value"][1]) <= 3.0  # two ticks a second at most
