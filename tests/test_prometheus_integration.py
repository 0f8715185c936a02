"""End to end: a real Prometheus scrapes the running daemon and PromQL returns boundwatch series."""

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fakes.promserver import PROMETHEUS, http_get, running_daemon, running_prometheus

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


def test_real_prometheus_scrapes_over_tls_with_bcrypt_basic_auth(tmp_path):
    """The production set-up: a certificate from a CA Prometheus trusts, and bcrypt credentials."""
    import ssl
    import urllib.error

    import bcrypt
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    paths = {name: tmp_path / name for name in ("ca.pem", "cert.pem", "key.pem", "users")}
    ca.cert_pem.write_to_path(str(paths["ca.pem"]))
    cert.cert_chain_pems[0].write_to_path(str(paths["cert.pem"]))
    cert.private_key_pem.write_to_path(str(paths["key.pem"]))
    paths["users"].write_text(
        f"prometheus:{bcrypt.hashpw(b'scrape-me', bcrypt.gensalt(rounds=4)).decode()}\n"
    )
    env = {
        "BOUNDWATCH_WEB__TLS_CERT_FILE": str(paths["cert.pem"]),
        "BOUNDWATCH_WEB__TLS_KEY_FILE": str(paths["key.pem"]),
        "BOUNDWATCH_WEB__BASIC_AUTH_FILE": str(paths["users"]),
    }
    trust = ssl.create_default_context(cafile=str(paths["ca.pem"]))
    creds = ("prometheus", "scrape-me")
    with running_daemon(
        tmp_path / "daemon", engine_pages=(), extra_env=env, context=trust, auth=creds
    ) as daemon:
        assert daemon.metrics_url.startswith("https://")
        status, body = http_get(daemon.metrics_url, context=trust, auth=creds)
        assert status == 200 and b"boundwatch_build_info" in body
        assert http_get(daemon.metrics_url, context=trust)[0] == 401
        assert http_get(daemon.metrics_url, context=trust, auth=("prometheus", "wrong"))[0] == 401
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):  # no trust in the CA
            http_get(daemon.metrics_url, context=ssl.create_default_context())
        secure = {
            "scheme": "https",
            "tls_config": {"ca_file": str(paths["ca.pem"])},
            "basic_auth": {"username": creds[0], "password": creds[1]},
        }
        with running_prometheus(
            tmp_path / "prom", {"secure": [daemon.target]}, job_options={"secure": secure}
        ) as prom:
            up = prom.wait_for('up{job="secure"} == 1', timeout=40)
            assert up[0]["value"][1] == "1"
            info = prom.wait_for('boundwatch_build_info{job="secure"}')
            assert info[0]["metric"]["version"]
