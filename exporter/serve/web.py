"""The aiohttp application: /metrics, /healthz, /api/snapshot and the status page on / (see statuspage).

The page's families are rendered by `exporter.export` (the Snapshot's, and the HTTP side's own counts
in `export/http.py`); this module assembles the registry, caches pages and serves them.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.exposition import choose_encoder

from exporter import __version__, webconfig
from exporter.config import Config, WebConfig
from exporter.export.collectors import SnapshotCollector, counter_series
from exporter.export.http import HttpCollector
from exporter.logs import CLIENT_ERRORS, scrub
from exporter.sampling import Sampler
from exporter.serve import statuspage
from exporter.serve.auth import BasicAuth, basic_auth_middleware
from exporter.serve.listener import ListenerStats
from exporter.snapshot import Snapshot
from exporter.snapshot.codec import encode
from exporter.snapshot.totals import EMPTY

SAMPLER: web.AppKey[Sampler] = web.AppKey("sampler", Sampler)
REGISTRY: web.AppKey[CollectorRegistry] = web.AppKey("registry", CollectorRegistry)
CONFIG: web.AppKey[Config] = web.AppKey("config", Config)
PAGES: web.AppKey[PageCache] = web.AppKey("pages")
STATUS_PAGE: web.AppKey[PageCache] = web.AppKey("status_page")
SNAPSHOT_PAGE: web.AppKey[PageCache] = web.AppKey("snapshot_page")
BANNER: web.AppKey[str] = web.AppKey("banner", str)  # a line the status page shows on top (the demo's)
STATUS_TYPE = "text/html; charset=utf-8"
AUTH: web.AppKey[BasicAuth] = web.AppKey("auth")
LISTENER: web.AppKey[ListenerStats] = web.AppKey("listener", ListenerStats)


def make_registry(sampler: Sampler, cfg: Config, http: HttpCollector | None = None) -> CollectorRegistry:
    """Return a registry holding the Snapshot collector and boundwatch's own process metrics."""
    registry = CollectorRegistry(auto_describe=False)
    max_age = max(5.0, 10 * cfg.tick_seconds)
    registry.register(SnapshotCollector(sampler.latest, cfg.tick_seconds, max_age, clock=sampler.now))  # type: ignore[arg-type]
    if http is not None:
        registry.register(http)  # type: ignore[arg-type]
    ProcessCollector(registry=registry)
    return registry


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


MAX_ACCEPT_PARTS = 16  # media ranges of an Accept header looked at (Prometheus sends 5)
_VERSION = re.compile(r"\s*(\d{1,3})(?:\.\d{1,3}){0,2}\s*")


def _canonical_range(part: str) -> str:
    """Return one media range with its version, if any, one of the few this page is written in.

    The version a scraper names is echoed in the answer's Content-Type, so each new one would be a
    page rendered and kept apart: it becomes the one of its major version that prometheus_client
    knows (OpenMetrics 0.0.1, 1.0.0, or 2.0.0 for any later; text 0.0.4 or 1.0.0); a version that
    is not one (`abc`, which prometheus_client's parser cannot compare) is dropped, as if not given.
    """
    media, *params = part.split(";")
    kept = [media.strip()]
    for param in params:
        key, sep, value = param.partition("=")
        if key.strip() != "version":
            kept.append(f"{key.strip()}{sep}{value.strip()}")
            continue
        m = _VERSION.fullmatch(value)
        if m is None:
            continue
        major = int(m.group(1))
        if kept[0] == "application/openmetrics-text":  # 0.0.1: passed over, for the next range, as before
            kept.append(f"version={('0.0.1', '1.0.0', '2.0.0')[min(major, 2)]}")
        else:
            kept.append("version=1.0.0" if major >= 1 else "version=0.0.4")
    return ";".join(kept)


def negotiate(accept: str) -> tuple[Callable[[CollectorRegistry], bytes], str]:
    """Return prometheus_client's encoder and Content-Type for an Accept header, from a fixed set of formats.

    Text 0.0.4, text 1.0.0 and OpenMetrics 1.0.0 / 2.0.0, each in one of the four name escapings:
    whatever a client sends, the page cache holds at most those 13 pages.
    """
    ranges = accept.split(",", MAX_ACCEPT_PARTS)[:MAX_ACCEPT_PARTS]
    return choose_encoder(",".join(_canonical_range(r) for r in ranges))  # type: ignore[return-value]


async def metrics(request: web.Request) -> web.Response:
    """Serve the text format, or OpenMetrics when the scraper asks for it; gzip when asked."""
    encoder, content_type = negotiate(request.headers.get("Accept", ""))
    return cached_answer(request, request.app[PAGES], content_type, encoder)


def cached_answer(
    request: web.Request, cache: PageCache, content_type: str, render: Callable[[CollectorRegistry], bytes]
) -> web.Response:
    """Answer with a page from its cache (rendered at most once a tick), gzipped when the request asks."""
    gz = accepts_gzip(request.headers.get("Accept-Encoding", ""))
    headers = {"Content-Type": content_type, "Vary": "Accept-Encoding"}
    if gz:
        headers["Content-Encoding"] = "gzip"
    return web.Response(body=cache.get(content_type, render, gz), headers=headers)


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
        return scrub(value)  # every URL's user:password and query values removed
    if value is None or isinstance(value, bool | int):
        return value
    return scrub(str(value))


def snapshot_page(snap: Snapshot) -> dict[str, Any]:
    """Return a Snapshot as /api/snapshot serves it: without secrets or NaN.

    Its typed totals are served as `codec.to_json` writes them (so `from_json` reads them back),
    and its counters once more by name, keyed "name{labels}", for people.
    """
    data: dict[str, Any] = served(dataclasses.replace(snap, totals=EMPTY))
    data["totals"] = served(encode(snap.totals))
    data["counters"] = served(counter_series(snap))
    return data


SNAPSHOT_TYPE = "application/json; charset=utf-8"


async def snapshot_json(request: web.Request) -> web.Response:
    """Serve the newest Snapshot as JSON (see snapshot_page), rendered at most once per tick, gzipped when asked."""
    snap = request.app[SAMPLER].latest()
    if snap is None:
        return web.json_response({"error": "no snapshot yet"}, status=503)
    return cached_answer(request, request.app[SNAPSHOT_PAGE], SNAPSHOT_TYPE, lambda _r: _snapshot_body(snap))


def _snapshot_body(snap: Snapshot) -> bytes:
    return json.dumps(snapshot_page(snap), allow_nan=False).encode()


async def index(request: web.Request) -> web.Response:
    """Serve the status page, rendered at most once per tick (and gzipped once when asked)."""
    return cached_answer(request, request.app[STATUS_PAGE], STATUS_TYPE, lambda _r: status_page(request.app))


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
        scrub=scrub,
    ).encode()


def handling_middleware(stats: ListenerStats) -> Any:
    """Return a middleware (the outermost) that marks a connection as handling a request until its answer is made.

    The listener never closes such a connection to make room at its cap (a scrape waiting on its
    bcrypt check, say).
    """

    @web.middleware
    async def mark(request: web.Request, handler: Any) -> web.StreamResponse:
        handling, transport = stats.handling, request.transport
        handling[transport] = handling.get(transport, 0) + 1
        try:
            return await handler(request)
        finally:
            left = handling.pop(transport, 1) - 1
            if left > 0:
                handling[transport] = left

    return mark


def headers_middleware(headers: tuple[tuple[str, str], ...]) -> Any:
    """Return a middleware that sets the configured headers on every response."""

    @web.middleware
    async def add_headers(request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            response = await handler(request)
        except web.HTTPException as exc:  # a 404 or 405 is an answer too
            for name, value in headers:
                exc.headers[name] = value
            raise
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
        file = webconfig.load(w.config_file)
        users = dict(file.users)
        if file.headers:
            middlewares.append(headers_middleware(file.headers))
    elif w.basic_auth_file:
        users = webconfig.load_users_file(w.basic_auth_file)
    if users or w.basic_auth_file:  # a users file with nobody in it refuses everyone
        auth = BasicAuth(
            users, w.auth_failure_burst, w.auth_failures_per_second, w.auth_checks_at_once, clock
        )
        middlewares.append(basic_auth_middleware(auth))
    listener = ListenerStats()
    app = web.Application(middlewares=[handling_middleware(listener), *middlewares])
    app[SAMPLER] = sampler
    app[CONFIG] = cfg
    app[LISTENER] = listener
    app[REGISTRY] = make_registry(
        sampler, cfg, HttpCollector(app[LISTENER], auth, lambda: CLIENT_ERRORS.total)
    )
    app[PAGES] = PageCache(app[REGISTRY], sampler, cfg.tick_seconds)
    app[STATUS_PAGE] = PageCache(app[REGISTRY], sampler, cfg.tick_seconds)
    app[SNAPSHOT_PAGE] = PageCache(app[REGISTRY], sampler, cfg.tick_seconds)
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


def make_runner(app: web.Application, w: WebConfig) -> web.AppRunner:
    """Return the daemon's runner for an app: no access log, bounded keep-alive, lingering and header lines."""
    return web.AppRunner(
        app,
        access_log=None,
        keepalive_timeout=w.idle_timeout_seconds,
        lingering_time=w.body_timeout_seconds,
        max_line_size=8190,
        max_field_size=8190,
    )


async def serve_tcp(app: web.Application, address: str, port: int) -> web.AppRunner:
    """Serve an app on address:port with aiohttp's own listener (the demo's); return its runner to clean up."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, address, port).start()
    return runner
