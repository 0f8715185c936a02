"""End to end: a real Prometheus scrapes the running daemon and PromQL returns boundwatch series."""

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.live import PROMETHEUS, daemon, get, prometheus, query_until

pytestmark = [
    pytest.mark.prometheus,
    pytest.mark.skipif(PROMETHEUS is None, reason="prometheus is not installed (make test installs it)"),
    pytest.mark.timeout(120),
]


def test_real_prometheus_scrapes_the_daemon_and_promql_returns_its_series(tmp_path):
    with daemon(tmp_path) as base:
        page = get(base + "/metrics").decode()
        names = {f.name for f in text_string_to_metric_families(page)}
        assert {"boundwatch_build_info", "boundwatch_source_up", "boundwatch_host_cpus"} <= names
        target = base.removeprefix("http://")
        with prometheus(tmp_path, [target]) as prom:
            info = query_until(prom, 'boundwatch_build_info{job="boundwatch"}')
            assert info[0]["metric"]["version"]
            up = query_until(prom, 'boundwatch_source_up{source="host"}')
            assert up[0]["value"][1] == "1"
            ticks = query_until(prom, "rate(boundwatch_ticks_total[5s]) > 0", seconds=40)
            assert 0 < float(ticks[0]["value"][1]) <= 3.0  # two ticks a second at most
