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

Every unknown key, wrong type or bad value is reported with the file's path; nothing is half-applied:
a key Python's ssl module cannot honour (`curve_preferences`, `client_allowed_sans`, two of the
client_auth_types) is refused, not ignored. `cipher_suites` (Go's names) choose the TLS 1.0-1.2
suites, as in exporter-toolkit; TLS 1.3's cannot be chosen there or here.
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
# exporter-toolkit's cipher_suites are Go's names; OpenSSL's for the same TLS 1.0-1.2 suites (Go's secure list).
# TLS 1.3's suites cannot be chosen, in Go as here: their names are taken and change nothing.
CIPHER_SUITES = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
}
TLS13_SUITES = frozenset({"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"})
# the response headers exporter-toolkit lets the file set (any other could break every answer: a
# Content-Length, a Transfer-Encoding)
HEADERS = (
    "Strict-Transport-Security",
    "X-Content-Type-Options",
    "X-Frame-Options",
    "X-XSS-Protection",
    "Content-Security-Policy",
)
HEADER_VALUES = {"X-Content-Type-Options": ("nosniff",), "X-Frame-Options": ("deny", "sameorigin")}
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
    ciphers: str | None = None  # OpenSSL's names of the TLS 1.0-1.2 suites asked for, ':'-joined
    prefer_server_cipher_suites: bool | None = None
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
        if self.ciphers:
            ctx.set_ciphers(self.ciphers)
        if self.prefer_server_cipher_suites is True:
            ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
        elif self.prefer_server_cipher_suites is False:
            ctx.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
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
    low, high = out.get("min_version"), out.get("max_version")
    if low and high and TLS_VERSIONS[low] > TLS_VERSIONS[high]:
        problems.append(f"{where}: min_version {low} is above max_version {high}: no handshake could succeed")
    ciphers = _ciphers(d.get("cipher_suites"), where, problems)
    if ciphers:
        out["ciphers"] = ciphers
    prefer = d.get("prefer_server_cipher_suites")
    if prefer is not None and not isinstance(prefer, bool):
        problems.append(f"{where}.prefer_server_cipher_suites: must be true or false, got {prefer!r}")
    elif prefer is not None:
        out["prefer_server_cipher_suites"] = prefer
    if d.get("curve_preferences"):
        problems.append(
            f"{where}.curve_preferences: not supported (Python's ssl module cannot choose the key exchange's groups)"
        )
    if d.get("client_allowed_sans"):
        problems.append(f"{where}.client_allowed_sans: not supported (restrict with client_ca_file)")
    return out


def _ciphers(value: Any, where: str, problems: list[str]) -> str | None:
    """Return OpenSSL's cipher string for exporter-toolkit's cipher_suites (Go's names), or None."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        problems.append(f"{where}.cipher_suites: must be a list of names, got {value!r}"[:300])
        return None
    unknown = [v for v in value if v not in CIPHER_SUITES and v not in TLS13_SUITES]
    if unknown:
        problems.append(
            f"{where}.cipher_suites: {', '.join(unknown[:5])[:200]} not among {', '.join(CIPHER_SUITES)}"
            " (and TLS 1.3's, which cannot be chosen)"
        )
        return None
    names = ":".join(CIPHER_SUITES[v] for v in value if v in CIPHER_SUITES)
    if not names:
        return None
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).set_ciphers(names)
    except ssl.SSLError:
        problems.append(f"{where}.cipher_suites: this machine's OpenSSL offers none of them")
        return None
    return names


def is_bcrypt(stored: str) -> bool:
    """Say whether a stored hash is bcrypt of a cost bcrypt takes (4-31), as exporter-toolkit's `bcrypt.Cost` checks."""
    return (
        stored.startswith(BCRYPT_PREFIXES)
        and len(stored) == 60
        and stored[4:6].isdigit()
        and 4 <= int(stored[4:6]) <= 31
        and stored[6] == "$"
    )


def _users(d: dict[str, Any], path: str, problems: list[str]) -> dict[str, str]:
    users: dict[str, str] = {}
    for user, stored in d.items():
        if not isinstance(user, str) or not user or ":" in user:
            problems.append(f"{path}: basic_auth_users: bad user name {user!r}"[:300])
            continue
        if not isinstance(stored, str) or not is_bcrypt(stored):
            problems.append(
                f"{path}: basic_auth_users.{user}: must be a bcrypt hash ($2y$<cost 04-31>$..., 60 characters)"
            )
            continue
        users[user] = stored
    return users


def load_users_file(path: str) -> dict[str, str]:
    """Read the daemon's own users file (`web.basic_auth_file`): `user:hash` lines, blank lines and # comments ignored.

    A hash is bcrypt (`$2b$...`, what `htpasswd -nB user` writes) or 64 hex digits of the password's
    SHA-256. Raise WebConfigError listing every bad line by number, never its text (a password
    written there by mistake stays out of logs).
    """
    lines = _read_text(path).splitlines()
    users: dict[str, str] = {}
    problems: list[str] = []
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, stored = line.partition(":")
        stored = stored.strip()
        if sep and user and is_bcrypt(stored):
            users[user] = stored
        elif sep and user and len(stored) == 64 and all(c in "0123456789abcdefABCDEF" for c in stored):
            users[user] = stored.lower()
        else:
            problems.append(
                f"{path}: line {number}: expected user:bcrypt-hash (cost 04-31) or user:sha256-hex"
            )
    if any(is_bcrypt(h) for h in users.values()):
        try:
            import bcrypt  # noqa: F401
        except ImportError:
            problems.append(f"{path}: bcrypt hashes need the bcrypt package (pip install bcrypt)")
    if problems:
        raise WebConfigError(problems)
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
        if name not in HEADERS:
            problems.append(
                f"{path}: http_server_config.headers.{name}: not one of {', '.join(HEADERS)}"[:400]
            )
        elif not isinstance(value, str) or not value.isprintable() or not value.isascii():
            problems.append(f"{path}: http_server_config.headers.{name}: must be one line of printable ASCII")
        elif name in HEADER_VALUES and value.lower() not in HEADER_VALUES[name]:
            problems.append(
                f"{path}: http_server_config.headers.{name}: must be {' or '.join(HEADER_VALUES[name])}"
            )
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
    return parse(_read_text(path), path)


def _read_text(path: str) -> str:
    """Return a configuration file's text (at most MAX_FILE_BYTES, UTF-8), or raise WebConfigError saying why not."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_FILE_BYTES:
            raise WebConfigError([f"{path}: over {MAX_FILE_BYTES} bytes"])
        return p.read_text()
    except OSError as exc:
        raise WebConfigError([f"{path}: cannot read it: {exc.strerror or exc}"]) from None
    except UnicodeDecodeError:
        raise WebConfigError([f"{path}: not UTF-8 text"]) from None
