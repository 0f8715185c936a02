"""The web configuration file of Prometheus' exporter-toolkit (`--web.config.file`), read and checked.

The same YAML an operator already keeps for node_exporter and the other exporters:

    tls_server_config:
      cert_file: /etc/boundwatch/tls.crt
      key_file: /etc/boundwatch/tls.key
      client_auth_type: RequireAndVerifyClientCert   # NoClientCert | VerifyClientCertIfGiven | ...
      client_ca_file: /etc/prometheus/ca.crt
      min_version: TLS12                             # TLS10 | TLS11 | TLS12 | TLS13
      max_version: TLS13
    http_server_config:
      headers:
        Strict-Transport-Security: max-age=31536000
    basic_auth_users:
      prometheus: $2y$10$...                         # bcrypt, as `htpasswd -nBC 10 "" | tr -d ':\\n'`

Every unknown key, wrong type or bad value is reported with the file's path; nothing is half-applied.
The file is mapped onto the daemon's own TLS context and basic-auth guard (one auth path).
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BCRYPT_PREFIXES = ("$2a$", "$2b$", "$2y$")
# exporter-toolkit's client_auth_type values, and how Python's ssl module can honour them
CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
UNSUPPORTED_CLIENT_AUTH = {
    "RequestClientCert": "Python's ssl module cannot ask for a certificate without verifying it",
    "RequireAnyClientCert": "Python's ssl module cannot require a certificate without verifying it",
}
TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_TOP = {"tls_server_config", "http_server_config", "basic_auth_users"}
_TLS = {
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "min_version",
    "max_version",
    "cipher_suites",
    "curve_preferences",
    "prefer_server_cipher_suites",
    "client_allowed_sans",
}
_HTTP = {"headers", "http2"}
MAX_FILE_BYTES = 1 << 20


class WebConfigError(ValueError):
    """The web config file is wrong; `problems` lists every finding."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class WebConfigFile:
    """What an exporter-toolkit web config file asks for."""

    path: str
    cert_file: str | None = None
    key_file: str | None = None
    client_auth_type: str = "NoClientCert"
    client_ca_file: str | None = None
    min_version: str | None = None
    max_version: str | None = None
    headers: tuple[tuple[str, str], ...] = field(default=())
    users: Mapping[str, str] = field(default_factory=dict)

    @property
    def tls(self) -> bool:
        """Say whether the file turns TLS on."""
        return bool(self.cert_file)

    def ssl_context(self) -> ssl.SSLContext | None:
        """Return the server's TLS context as the file asks, or None without TLS."""
        if not self.tls:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(str(self.cert_file), str(self.key_file))
        ctx.verify_mode = CLIENT_AUTH[self.client_auth_type]
        if self.client_ca_file:
            ctx.load_verify_locations(cafile=self.client_ca_file)
        if self.min_version:
            ctx.minimum_version = TLS_VERSIONS[self.min_version]
        if self.max_version:
            ctx.maximum_version = TLS_VERSIONS[self.max_version]
        return ctx


def _mapping(value: Any, where: str, problems: list[str]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.append(f"{where}: must be a mapping, got {type(value).__name__}")
        return {}
    return value


def _unknown(d: Mapping[str, Any], known: set[str], where: str, problems: list[str]) -> None:
    for key in d:
        if key not in known:
            problems.append(f"{where}.{key}: unknown key (known: {', '.join(sorted(known))})")


def _text(d: Mapping[str, Any], key: str, where: str, problems: list[str]) -> str | None:
    value = d.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        problems.append(f"{where}.{key}: must be a non-empty string, got {value!r}")
        return None
    return value


def _tls(d: dict[str, Any], path: str, base: Path, problems: list[str]) -> dict[str, Any]:
    where = f"{path}: tls_server_config"
    _unknown(d, _TLS, where, problems)
    out: dict[str, Any] = {}
    for key in ("cert_file", "key_file", "client_ca_file"):
        value = _text(d, key, where, problems)
        if value is not None:
            p = Path(value) if Path(value).is_absolute() else base / value  # relative to the file, as Go's
            if not p.is_file():
                problems.append(f"{where}.{key}: no such file {str(p)!r}")
            out[key] = str(p)
    if bool(out.get("cert_file")) != bool(out.get("key_file")):
        problems.append(f"{where}: cert_file and key_file go together")
    auth = _text(d, "client_auth_type", where, problems) or "NoClientCert"
    if auth in UNSUPPORTED_CLIENT_AUTH:
        problems.append(f"{where}.client_auth_type: {auth} is not supported: {UNSUPPORTED_CLIENT_AUTH[auth]}")
    elif auth not in CLIENT_AUTH:
        problems.append(f"{where}.client_auth_type: {auth!r} is not one of {', '.join(CLIENT_AUTH)}")
    elif auth != "NoClientCert" and not out.get("client_ca_file"):
        problems.append(f"{where}.client_auth_type: {auth} needs client_ca_file")
    out["client_auth_type"] = auth
    for key in ("min_version", "max_version"):
        value = _text(d, key, where, problems)
        if value is not None and value not in TLS_VERSIONS:
            problems.append(f"{where}.{key}: {value!r} is not one of {', '.join(TLS_VERSIONS)}")
        elif value is not None:
            out[key] = value
    if d.get("client_allowed_sans"):
        problems.append(f"{where}.client_allowed_sans: not supported (restrict with client_ca_file)")
    return out


def _users(d: dict[str, Any], path: str, problems: list[str]) -> dict[str, str]:
    users: dict[str, str] = {}
    for user, stored in d.items():
        if not isinstance(user, str) or not user or ":" in user:
            problems.append(f"{path}: basic_auth_users: bad user name {user!r}")
            continue
        if not isinstance(stored, str) or not stored.startswith(BCRYPT_PREFIXES) or len(stored) != 60:
            problems.append(
                f"{path}: basic_auth_users.{user}: must be a bcrypt hash ($2y$..., 60 characters)"
            )
            continue
        users[user] = stored
    return users


def parse(text: str, path: str) -> WebConfigFile:
    """Return the web config a file's text asks for; raise WebConfigError listing every problem."""
    import yaml

    problems: list[str] = []
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise WebConfigError([f"{path}: not YAML: {exc}"]) from None
    top = _mapping(data, path, problems)
    _unknown(top, _TOP, path, problems)
    base = Path(path).resolve().parent
    tls = _tls(
        _mapping(top.get("tls_server_config"), f"{path}: tls_server_config", problems), path, base, problems
    )
    http = _mapping(top.get("http_server_config"), f"{path}: http_server_config", problems)
    _unknown(http, _HTTP, f"{path}: http_server_config", problems)
    headers = _mapping(http.get("headers"), f"{path}: http_server_config.headers", problems)
    pairs = []
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, str) or "\n" in name + value:
            problems.append(f"{path}: http_server_config.headers.{name}: must map a name to one line of text")
        else:
            pairs.append((name, value))
    users = _users(
        _mapping(top.get("basic_auth_users"), f"{path}: basic_auth_users", problems), path, problems
    )
    if problems:
        raise WebConfigError(problems)
    return WebConfigFile(path=path, headers=tuple(pairs), users=users, **tls)


def load(path: str) -> WebConfigFile:
    """Read and check a web config file; raise WebConfigError listing every problem."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_FILE_BYTES:
            raise WebConfigError([f"{path}: over {MAX_FILE_BYTES} bytes"])
        text = p.read_text()
    except OSError as exc:
        raise WebConfigError([f"{path}: cannot read it: {exc.strerror or exc}"]) from None
    except UnicodeDecodeError:
        raise WebConfigError([f"{path}: not UTF-8 text"]) from None
    return parse(text, path)
