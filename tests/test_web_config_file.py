"""`--web.config.file`: Prometheus exporter-toolkit's web config (TLS, client certificates, users, headers)."""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from exporter import webconfig
from tests.fakes.promserver import ROOT, http_get, running_daemon

bcrypt = pytest.importorskip("bcrypt")
trustme = pytest.importorskip("trustme")


def _pki(tmp_path: Path) -> dict[str, Path]:
    """Write a CA, a server certificate for 127.0.0.1 and a client certificate."""
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("prometheus@example.test")
    paths = {n: tmp_path / n for n in ("ca.pem", "cert.pem", "key.pem", "client.pem", "client.key")}
    ca.cert_pem.write_to_path(str(paths["ca.pem"]))
    server.cert_chain_pems[0].write_to_path(str(paths["cert.pem"]))
    server.private_key_pem.write_to_path(str(paths["key.pem"]))
    client.cert_chain_pems[0].write_to_path(str(paths["client.pem"]))
    client.private_key_pem.write_to_path(str(paths["client.key"]))
    return paths


def _hash(password: bytes) -> str:
    return bcrypt.hashpw(password, bcrypt.gensalt(rounds=4)).decode()


def _problems(path: Path) -> list[str]:
    """Return what loading a web config file reports (it must refuse the file)."""
    with pytest.raises(webconfig.WebConfigError) as err:
        webconfig.load(str(path))
    return err.value.problems


def test_every_problem_of_a_bad_file_is_reported_with_its_path(tmp_path: Path) -> None:
    bad = tmp_path / "web.yml"
    bad.write_text(
        "tls_server_config:\n  cert_file: missing.crt\n  client_auth_type: RequireAnyClientCert\n"
        "  min_version: TLS9\nbasic_auth_user: {}\nbasic_auth_users:\n  alice: plaintext\n"
    )
    problems = _problems(bad)
    text = "\n".join(problems)
    for expected in (
        "basic_auth_user: unknown key",
        "cert_file: no such file",
        "cert_file and key_file go together",
        "RequireAnyClientCert is not supported",
        "min_version: 'TLS9' is not one of",
        "basic_auth_users.alice: must be a bcrypt hash",
    ):
        assert expected in text, text
    assert all(p.startswith(str(bad)) for p in problems)


def test_check_config_reports_the_web_config_file_and_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "web.yml"
    bad.write_text("tls_server_config: [1, 2]\n")
    p = subprocess.run(
        [sys.executable, "-m", "exporter", "--web.config.file", str(bad), "--check-config"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2
    assert "web.config_file" in p.stderr + p.stdout and "must be a mapping" in p.stderr + p.stdout


def test_paths_in_the_file_are_relative_to_it_and_tls_settings_reach_the_context(tmp_path: Path) -> None:
    paths = _pki(tmp_path)
    cfg = tmp_path / "web.yml"
    cfg.write_text(
        "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n"
        "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\n  min_version: TLS13\n"
    )
    got = webconfig.load(str(cfg))
    assert got.cert_file == str(paths["cert.pem"])
    ctx = got.ssl_context()
    assert ctx is not None
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.minimum_version == ssl.TLSVersion.TLSv1_3


def test_the_daemon_serves_mutual_tls_basic_auth_and_headers_from_the_web_config_file(tmp_path: Path) -> None:
    """The file operators keep for node_exporter: only a client with a CA-signed certificate and the
    password gets the page; the configured header is on every response."""
    paths = _pki(tmp_path)
    cfg = tmp_path / "web.yml"
    cfg.write_text(
        json.dumps(  # JSON is YAML: the same file
            {
                "tls_server_config": {
                    "cert_file": str(paths["cert.pem"]),
                    "key_file": str(paths["key.pem"]),
                    "client_auth_type": "RequireAndVerifyClientCert",
                    "client_ca_file": str(paths["ca.pem"]),
                },
                "http_server_config": {"headers": {"Strict-Transport-Security": "max-age=31536000"}},
                "basic_auth_users": {"prometheus": _hash(b"scrape-me")},
            }
        )
    )
    with_cert = ssl.create_default_context(cafile=str(paths["ca.pem"]))
    with_cert.load_cert_chain(str(paths["client.pem"]), str(paths["client.key"]))
    without_cert = ssl.create_default_context(cafile=str(paths["ca.pem"]))
    creds = ("prometheus", "scrape-me")
    env = {"BOUNDWATCH_WEB__CONFIG_FILE": str(cfg)}
    with running_daemon(
        tmp_path / "daemon", engine_pages=(), extra_env=env, context=with_cert, auth=creds
    ) as daemon:
        status, body = http_get(daemon.metrics_url, context=with_cert, auth=creds)
        assert status == 200 and b"boundwatch_build_info" in body
        assert http_get(daemon.metrics_url, context=with_cert)[0] == 401
        assert http_get(daemon.metrics_url, context=with_cert, auth=("prometheus", "wrong"))[0] == 401
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            http_get(daemon.metrics_url, context=without_cert, auth=creds)  # no client certificate
        counted = b""
        for _ in range(50):  # the failed handshake is counted (the page is rendered once a tick)
            counted = http_get(daemon.metrics_url, context=with_cert, auth=creds)[1]
            if b'boundwatch_http_refused_total{cause="tls_handshake"} 1.0' in counted:
                break
            time.sleep(0.1)
        assert b'boundwatch_http_refused_total{cause="tls_handshake"} 1.0' in counted
        req = urllib.request.Request(daemon.metrics_url.replace("/metrics", "/healthz"))
        with urllib.request.urlopen(req, context=with_cert, timeout=10) as resp:
            assert resp.headers["Strict-Transport-Security"] == "max-age=31536000"


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> str:
    """Run a TLS handshake between two contexts in memory; return the cipher chosen (SSLError if none)."""
    s_in, s_out, c_in, c_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    srv = server.wrap_bio(s_in, s_out, server_side=True)
    cli = client.wrap_bio(c_in, c_out, server_hostname="127.0.0.1")
    done = {"s": False, "c": False}
    for _ in range(20):
        for name, end, out, peer_in in (("c", cli, c_out, s_in), ("s", srv, s_out, c_in)):
            if not done[name]:
                try:
                    end.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
            peer_in.write(out.read())
        if all(done.values()):
            return str(cli.cipher()[0])
    raise AssertionError("the handshake did not finish")


def test_cipher_suites_are_applied_and_a_client_with_none_of_them_is_refused(tmp_path: Path) -> None:
    paths = _pki(tmp_path)
    cfg = tmp_path / "web.yml"
    cfg.write_text(
        "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n  max_version: TLS12\n"
        "  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, TLS_AES_128_GCM_SHA256]\n"
        "  prefer_server_cipher_suites: true\n"
    )
    got = webconfig.load(str(cfg))
    assert (
        got.ciphers == "ECDHE-ECDSA-AES256-GCM-SHA384"
    )  # TLS 1.3's name taken and changes nothing, as in Go
    server = got.ssl_context()
    assert server is not None and server.options & ssl.OP_CIPHER_SERVER_PREFERENCE
    client = ssl.create_default_context(cafile=str(paths["ca.pem"]))
    assert _handshake(server, client) == "ECDHE-ECDSA-AES256-GCM-SHA384"
    only_128 = ssl.create_default_context(cafile=str(paths["ca.pem"]))
    only_128.maximum_version = ssl.TLSVersion.TLSv1_2
    only_128.set_ciphers("ECDHE-ECDSA-AES128-GCM-SHA256")
    with pytest.raises(ssl.SSLError):
        _handshake(webconfig.load(str(cfg)).ssl_context(), only_128)  # type: ignore[arg-type]
    plain = tmp_path / "plain.yml"
    plain.write_text("tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n  max_version: TLS12\n")
    assert _handshake(webconfig.load(str(plain)).ssl_context(), only_128) == "ECDHE-ECDSA-AES128-GCM-SHA256"  # type: ignore[arg-type]


def test_tls_settings_that_cannot_be_honoured_are_refused_not_ignored(tmp_path: Path) -> None:
    _pki(tmp_path)
    cfg = tmp_path / "web.yml"
    cfg.write_text(
        "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n  min_version: TLS13\n  max_version: TLS12\n"
        "  cipher_suites: [TLS_RSA_WITH_RC4_128_SHA]\n  curve_preferences: [CurveP384]\n"
        "  prefer_server_cipher_suites: yes please\n"
        "http_server_config:\n  headers:\n    Content-Length: '3'\n    X-Frame-Options: allow\n"
        "    Content-Security-Policy: \"default-src 'self'\\r\\nX-Injected: 1\"\n"
        "    Strict-Transport-Security: max-age=31536000\n"
        "basic_auth_users:\n  prom: $2b$99$" + "a" * 53 + "\n"
    )
    problems = _problems(cfg)
    text = "\n".join(problems)
    for expected in (
        "min_version TLS13 is above max_version TLS12",
        "cipher_suites: TLS_RSA_WITH_RC4_128_SHA not among",
        "curve_preferences: not supported",
        "prefer_server_cipher_suites: must be true or false",
        "headers.Content-Length: not one of Strict-Transport-Security",
        "headers.X-Frame-Options: must be deny or sameorigin",
        "headers.Content-Security-Policy: must be one line of printable ASCII",
        "basic_auth_users.prom: must be a bcrypt hash",  # a cost bcrypt refuses: the daemon crashed on it
    ):
        assert expected in text, text
    assert len(problems) == 8  # the good header is no problem


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"BOUNDWATCH_WEB__BASIC_AUTH_FILE": "/nonexistent/users"}, "cannot read it"),
        ({"BOUNDWATCH_WEB__BASIC_AUTH_FILE": "USERS"}, "line 1: expected user:bcrypt-hash"),
    ],
)
def test_check_config_reads_the_users_file_and_never_echoes_its_lines(tmp_path: Path, env, problem) -> None:
    users = tmp_path / "users"
    users.write_text("prom:my-plain-password\n")
    env = {k: v.replace("USERS", str(users)) for k, v in env.items()}
    p = subprocess.run(
        [sys.executable, "-m", "exporter", "--check-config"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**__import__("os").environ, **env},
    )
    assert p.returncode == 2 and "web.basic_auth_file" in p.stderr and problem in p.stderr
    assert "my-plain-password" not in p.stderr + p.stdout
