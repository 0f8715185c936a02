"""The aiohttp application: /metrics, /healthz, /api/snapshot and the status page on / (see statuspage)."""

from __future__ import annotations

import asyncio
import base64
import collections
import concurrent.futures
import dataclasses
import gzip
import hashlib
import hmac
import json
import math
import re
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric

from exporter import __version__
from exporter import catalogue as c
from exporter.config import Config
from exporter.export import statuspage
from exporter.export.collectors import SnapshotCollector, counter_series
from exporter.export.listener import ListenerStats
from exporter.sampling import Sampler
from exporter.snapshot import Snapshot
from exporter.snapshot.codec import encode
from exporter.snapshot.totals import EMPTY

SAMPLER: web.AppKey[Sampler] = web.AppKey("sampler", Sampler)
REGISTRY: web.AppKey[CollectorRegistry] = web.AppKey("registry", CollectorRegistry)
CONFIG: web.AppKey[Config] = web.AppKey("config", Config)
PAGES: web.AppKey[PageCache] = web.AppKey("pages")
STATUS_PAGE: web.AppKey[PageCache] = web.AppKey("status_page")
BANNER: web.AppKey[str] = web.AppKey("banner", str)  # a line the status page shows on top (the demo's)
STATUS_TYPE = "text/html; charset=utf-8"
AUTH: web.AppKey[BasicAuth] = web.AppKey("auth")
LISTENER: web.AppKey[ListenerStats] = web.AppKey("listener", ListenerStats)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def make_registry(sampler: Sampler, cfg: Config, http: HttpCollector | None = None) -> CollectorRegistry:
    """Return a registry holding the Snapshot collector and boundwatch's own process metrics."""
    registry = CollectorRegistry(auto_describe=False)
    max_age = max(5.0, 10 * cfg.tick_seconds)
    registry.register(SnapshotCollector(sampler.latest, cfg.tick_seconds, max_age, clock=sampler.now))  # type: ignore[arg-type]
    if http is not None:
        registry.register(http)  # type: ignore[arg-type]
    ProcessCollector(registry=registry)
    return registry


# The families this module renders (HttpCollector).
SELF_FAMILIES: tuple[c.MetricSpec, ...] = (c.HTTP_CONNECTIONS, c.HTTP_REFUSED_TOTAL)


class HttpCollector:
    """Render the listener's and basic auth's counts: connections open, and what was refused."""

    def __init__(self, listener: ListenerStats, auth: BasicAuth | None) -> None:
        self.listener = listener
        self.auth = auth

    def collect(self) -> Iterator[Metric]:
        """Yield the open connections and the refusals by cause."""
        conns = c.gauge(c.HTTP_CONNECTIONS)
        conns.add_metric([], self.listener.open)
        yield conns
        refused = c.counter(c.HTTP_REFUSED_TOTAL)
        refused.add_metric(["connection_limit"], self.listener.refused_total)
        refused.add_metric(["header_timeout"], self.listener.timed_out_total)
        if self.auth is not None:
            refused.add_metric(["auth_failed"], self.auth.failures)
            refused.add_metric(["auth_rate_limited"], self.auth.refused)
        yield refused


BCRYPT_PREFIXES = ("$2a$", "$2b$", "$2y$")


def load_basic_auth(path: str) -> dict[str, str]:
    """Read `user:hash` lines (blank lines and # comments ignored).

    A hash is bcrypt (`$2b$...`, what `htpasswd -nB user` and Prometheus' exporter-toolkit web
    config use) or 64 hex digits of the password's SHA-256.
    """
    users: dict[str, str] = {}
    for raw in Path(path).read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, stored = line.partition(":")
        stored = stored.strip()
        if sep and stored.startswith(BCRYPT_PREFIXES) and len(stored) == 60:
            try:
                import bcrypt  # noqa: F401
            except ImportError:
                raise ValueError(
                    f"{path}: bcrypt hashes need the bcrypt package (pip install bcrypt)"
                ) from None
            users[user] = stored
        elif sep and len(stored) == 64 and all(c in "0123456789abcdefABCDEF" for c in stored):
            users[user] = stored.lower()
        else:
            raise ValueError(f"{path}: expected user:bcrypt-hash or user:sha256-hex, got {line!r}")
    return users


def password_matches(stored: str, password: str) -> bool:
    """Return whether a password matches a stored bcrypt or SHA-256 hash (slow for bcrypt, by design)."""
    if stored.startswith(BCRYPT_PREFIXES):
        import bcrypt

        try:
            return bool(bcrypt.checkpw(password.encode(), stored.encode()))
        except ValueError:  # a malformed hash matches nothing
            return False
    return hmac.compare_digest(stored, hashlib.sha256(password.encode()).hexdigest())


def _cost(stored: str) -> int:
    """Return a bcrypt hash's cost (log2 rounds), 0 for SHA-256."""
    if stored.startswith(BCRYPT_PREFIXES) and stored[4:6].isdigit():
        return int(stored[4:6])
    return 0


class BasicAuth:
    """Check basic-auth credentials in the same time whatever the user, and rate-limit failures.

    - An unknown user is checked against a dummy hash of the costliest stored kind, and when any
      stored hash is bcrypt every check runs one bcrypt: a wrong user and a wrong password take
      the same time, so timing enumerates nobody.
    - bcrypt (~0.1-0.3 s) runs in at most `at_once` worker threads, never on the event loop.
    - Each client address has a token bucket of `burst` checks refilled at `rate` per second: a
      check takes a token (returned when it succeeds); an empty bucket answers 429 without a check,
      so a wrong-password flood costs a few checks a second, not the cores.
    - Accepted credentials are remembered (a SHA-256 of user, hash and password, at most
      `remember`) and pass without a check or a token; failures are never remembered.
    """

    def __init__(
        self,
        users: dict[str, str],
        burst: int = 10,
        rate: float = 0.5,
        at_once: int = 2,
        clock: Callable[[], float] = time.monotonic,
        remember: int = 64,
        addresses: int = 4096,
    ) -> None:
        self.users = users
        self._burst, self._rate, self._clock = float(burst), rate, clock
        self._remember, self._addresses = remember, addresses
        self._accepted: dict[bytes, None] = {}
        self._buckets: collections.OrderedDict[str, list[float]] = collections.OrderedDict()
        cost = max((_cost(h) for h in users.values()), default=0)
        self._bcrypt = cost > 0
        if self._bcrypt:
            import bcrypt

            self._dummy = bcrypt.hashpw(b"boundwatch-dummy", bcrypt.gensalt(rounds=cost)).decode()
        else:
            self._dummy = hashlib.sha256(b"boundwatch-dummy").hexdigest()
        self._pool = concurrent.futures.ThreadPoolExecutor(at_once, thread_name_prefix="basic-auth")
        self.checks = 0  # checks run, for tests and the bench
        self.refused = 0  # answered 429 without a check
        self.failures = 0  # checks that failed

    def verify(self, user: str, password: str) -> bool:
        """Check one user's password in the calling thread, taking the same time for any user."""
        stored = self.users.get(user)
        ok = password_matches(stored if stored is not None else self._dummy, password)
        if self._bcrypt and (stored is None or not stored.startswith(BCRYPT_PREFIXES)):
            password_matches(self._dummy, password)  # same cost as a bcrypt user's check
        return ok and stored is not None

    def _take(self, address: str) -> bool:
        now = self._clock()
        bucket = self._buckets.pop(address, None) or [self._burst, now]
        bucket[0] = min(self._burst, bucket[0] + (now - bucket[1]) * self._rate)
        bucket[1] = now
        self._buckets[address] = bucket
        while len(self._buckets) > self._addresses:
            self._buckets.popitem(last=False)
        if bucket[0] < 1:
            return False
        bucket[0] -= 1
        return True

    def _give_back(self, address: str) -> None:
        bucket = self._buckets.get(address)
        if bucket is not None:
            bucket[0] = min(self._burst, bucket[0] + 1)

    async def allowed(self, header: str, address: str) -> int:
        """Return 200 when the Authorization header is good, else 401 or 429."""
        if not header.startswith("Basic "):
            return 401
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            user, password = "", ""
        key = hashlib.sha256(f"{user}\0{self.users.get(user)}\0{password}".encode()).digest()
        if key in self._accepted:
            return 200
        if not self._take(address):
            self.refused += 1
            return 429
        self.checks += 1
        loop = asyncio.get_running_loop()
        if not await loop.run_in_executor(self._pool, self.verify, user, password):
            self.failures += 1
            return 401
        self._give_back(address)
        if len(self._accepted) >= self._remember:
            self._accepted.pop(next(iter(self._accepted)))
        self._accepted[key] = None
        return 200

    def close(self) -> None:
        """Stop the worker threads (a check still running finishes on its own)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def basic_auth_middleware(auth: BasicAuth) -> Callable[..., Any]:
    """Return a middleware that demands HTTP basic auth for every path but /healthz."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == "/healthz":
            return await handler(request)
        status = await auth.allowed(request.headers.get("Authorization", ""), request.remote or "")
        if status == 200:
            return await handler(request)
        if status == 429:
            return web.Response(status=429, text="too many failed logins\n", headers={"Retry-After": "2"})
        return web.Response(status=401, headers={"WWW-Authenticate": 'Basic realm="boundwatch"'})

    return middleware


@dataclasses.dataclass
class _Page:
    seq: int
    expires: float
    body: bytes
    gzipped: bytes | None = None


class PageCache:
    """Render a page (/metrics per format, the status page) at most once per tick, and gzip it at most once too.

    A page is kept for the Snapshot it was rendered from and at most one tick (so the Snapshot's
    age and the process figures stay true while ticks stall); any number of scrapes in between
    cost a dictionary look-up, not a render, and take no time from sampling.
    """

    def __init__(self, registry: CollectorRegistry, sampler: Sampler, life: float) -> None:
        self._registry = registry
        self._sampler = sampler
        self._life = life
        self._pages: dict[str, _Page] = {}
        self.renders = 0
        self.compressions = 0

    def get(self, content_type: str, encoder: Callable[[CollectorRegistry], bytes], gz: bool) -> bytes:
        """Return the page body for a format, gzipped when asked."""
        snap = self._sampler.latest()
        seq = -1 if snap is None else snap.seq
        now = self._sampler.now()
        page = self._pages.get(content_type)
        if page is None or page.seq != seq or now >= page.expires:
            self.renders += 1
            page = _Page(seq, now + self._life, encoder(self._registry))
            self._pages[content_type] = page
        if not gz:
            return page.body
        if page.gzipped is None:
            self.compressions += 1
            page.gzipped = gzip.compress(page.body, compresslevel=6, mtime=0)
        return page.gzipped


def accepts_gzip(header: str) -> bool:
    """Return whether an Accept-Encoding header asks for gzip (and does not refuse it with q=0)."""
    for part in header.split(","):
        coding, _, params = part.strip().partition(";")
        if coding.strip().lower() in {"gzip", "x-gzip"}:
            q = params.strip().lower()
            return not (q.startswith("q=") and q[2:].strip() in {"0", "0.0", "0.00", "0.000"})
    return False


async def metrics(request: web.Request) -> web.Response:
    """Serve the text format, or OpenMetrics when the scraper asks for it; gzip when asked."""
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    gz = accepts_gzip(request.headers.get("Accept-Encoding", ""))
    body = request.app[PAGES].get(content_type, encoder, gz)
    headers = {"Content-Type": content_type, "Vary": "Accept-Encoding"}
    if gz:
        headers["Content-Encoding"] = "gzip"
    return web.Response(body=body, headers=headers)


async def healthz(request: web.Request) -> web.Response:
    """Answer 200 while ticks are fresh, 503 otherwise."""
    sampler = request.app[SAMPLER]
    cfg = request.app[CONFIG]
    snap = sampler.latest(max_age=max(5.0, 10 * cfg.tick_seconds))
    if snap is None:
        return web.json_response({"status": "starting or stalled"}, status=503)
    return web.json_response(
        {"status": "ok", "seq": snap.seq, "sources": {s.name: s.up for s in snap.sources}}
    )


HIDDEN_FIELDS = frozenset({"environ", "env", "environment", "argv", "args"})
TITLE_ONLY_FIELDS = frozenset({"cmdline"})  # served as the process title (first word), never the arguments
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s]*@")


def redact(text: str) -> str:
    """Return text with the user:password part of any URL in it removed."""
    return _USERINFO.sub(r"\1", text) if "@" in text else text


def _title_only(name: str, value: Any) -> Any:
    if name in TITLE_ONLY_FIELDS and isinstance(value, list | tuple):
        return tuple(value[:1])
    return value


def served(value: Any) -> Any:
    """Return plain JSON data for a Snapshot part: no command lines or environments, no NaN.

    Command lines (`--api-key sk-...`) and environments stay internal: a command line is served
    as its first word only (the process title, which `diagnose --url` needs to number API
    servers), every field or key named in HIDDEN_FIELDS is left out, URLs lose their
    credentials, NaN and infinities become null.
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: served(_title_only(f.name, getattr(value, f.name)))
            for f in dataclasses.fields(value)
            if f.name not in HIDDEN_FIELDS
        }
    if isinstance(value, Mapping):
        return {str(k): served(v) for k, v in value.items() if str(k) not in HIDDEN_FIELDS}
    if isinstance(value, list | tuple | set | frozenset):
        return [served(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return redact(value)
    if value is None or isinstance(value, bool | int):
        return value
    return redact(str(value))


def snapshot_page(snap: Snapshot) -> dict[str, Any]:
    """Return a Snapshot as /api/snapshot serves it: without secrets or NaN.

    Its typed totals are served as `codec.to_json` writes them (so `from_json` reads them back),
    and its counters once more by name, keyed "name{labels}", for people.
    """
    data: dict[str, Any] = served(dataclasses.replace(snap, totals=EMPTY))
    data["totals"] = served(encode(snap.totals))
    data["counters"] = served(counter_series(snap))
    return data


async def snapshot_json(request: web.Request) -> web.Response:
    """Serve the newest Snapshot as JSON (see snapshot_page)."""
    snap = request.app[SAMPLER].latest()
    if snap is None:
        return web.json_response({"error": "no snapshot yet"}, status=503)
    data = snapshot_page(snap)
    return web.Response(text=json.dumps(data, allow_nan=False), content_type="application/json")


async def index(request: web.Request) -> web.Response:
    """Serve the status page, rendered at most once per tick (and gzipped once when asked)."""
    gz = accepts_gzip(request.headers.get("Accept-Encoding", ""))
    body = request.app[STATUS_PAGE].get(STATUS_TYPE, lambda _registry: status_page(request.app), gz)
    headers = {"Content-Type": STATUS_TYPE, "Vary": "Accept-Encoding"}
    if gz:
        headers["Content-Encoding"] = "gzip"
    return web.Response(body=body, headers=headers)


def status_page(app: web.Application) -> bytes:
    """Render the status page from the sampler's history."""
    sampler, cfg = app[SAMPLER], app[CONFIG]
    return statuspage.render(
        sampler.history(),
        version=__version__,
        window=cfg.history_seconds,
        now=sampler.now(),
        stale_after=max(5.0, 10 * cfg.tick_seconds),
        banner=app.get(BANNER, ""),
        refresh_seconds=max(2, math.ceil(4 * cfg.tick_seconds)),
        scrub=redact,
    ).encode()


def headers_middleware(headers: tuple[tuple[str, str], ...]) -> Any:
    """Return a middleware that sets the configured headers on every response."""

    @web.middleware
    async def add_headers(request: web.Request, handler: Any) -> web.StreamResponse:
        response = await handler(request)
        for name, value in headers:
            response.headers[name] = value
        return response

    return add_headers


def make_app(cfg: Config, sampler: Sampler, clock: Callable[[], float] = time.monotonic) -> web.Application:
    """Return the web application serving one sampler."""
    middlewares = []
    auth = None
    w = cfg.web
    users: dict[str, str] = {}
    if w.config_file:  # exporter-toolkit's file: its users and headers (its TLS is the daemon's)
        from exporter import webconfig

        file = webconfig.load(w.config_file)
        users = dict(file.users)
        if file.headers:
            middlewares.append(headers_middleware(file.headers))
    elif w.basic_auth_file:
        users = load_basic_auth(w.basic_auth_file)
    if users or w.basic_auth_file:  # a users file with nobody in it refuses everyone
        auth = BasicAuth(
            users, w.auth_failure_burst, w.auth_failures_per_second, w.auth_checks_at_once, clock
        )
        middlewares.append(basic_auth_middleware(auth))
    app = web.Application(middlewares=middlewares)
    app[SAMPLER] = sampler
    app[CONFIG] = cfg
    app[LISTENER] = ListenerStats()
    app[REGISTRY] = make_registry(sampler, cfg, HttpCollector(app[LISTENER], auth))
    app[PAGES] = PageCache(app[REGISTRY], sampler, cfg.tick_seconds)
    app[STATUS_PAGE] = PageCache(app[REGISTRY], sampler, cfg.tick_seconds)
    if auth is not None:
        app[AUTH] = auth

        async def close_auth(_app: web.Application) -> None:
            auth.close()

        app.on_cleanup.append(close_auth)
    app.router.add_get("/", index)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/api/snapshot", snapshot_json)
    return app
