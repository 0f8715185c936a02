"""The aiohttp application: /metrics, /healthz, /api/snapshot and a small status page on /."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import hmac
import html
import json
import math
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.exposition import choose_encoder

from exporter import __version__
from exporter.config import Config
from exporter.export.collectors import SnapshotCollector
from exporter.sampling import Sampler

SAMPLER: web.AppKey[Sampler] = web.AppKey("sampler", Sampler)
REGISTRY: web.AppKey[CollectorRegistry] = web.AppKey("registry", CollectorRegistry)
CONFIG: web.AppKey[Config] = web.AppKey("config", Config)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def make_registry(sampler: Sampler, cfg: Config) -> CollectorRegistry:
    """Return a registry holding the Snapshot collector and boundwatch's own process metrics."""
    registry = CollectorRegistry(auto_describe=False)
    max_age = max(5.0, 10 * cfg.tick_seconds)
    registry.register(SnapshotCollector(sampler.latest, cfg.tick_seconds, max_age, clock=sampler.now))  # type: ignore[arg-type]
    ProcessCollector(registry=registry)
    return registry


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


def basic_auth_middleware(users: dict[str, str], remember: int = 64) -> Callable[..., Any]:
    """Return a middleware that demands HTTP basic auth for every path but /healthz.

    bcrypt takes ~0.1-0.3 s a check: it runs in a worker thread, so the event loop (and the 0.5 s
    ticks) never wait, and a scraper's credentials are checked once, then remembered (a SHA-256 of
    user, hash and password, at most `remember` of them). Failures are never remembered.
    """
    accepted: dict[bytes, None] = {}

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == "/healthz":
            return await handler(request)
        header = request.headers.get("Authorization", "")
        if header.startswith("Basic "):
            try:
                user, _, password = base64.b64decode(header[6:]).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                user, password = "", ""
            stored = users.get(user)
            if stored is not None:
                key = hashlib.sha256(f"{user}\0{stored}\0{password}".encode()).digest()
                if key in accepted:
                    return await handler(request)
                if await asyncio.to_thread(password_matches, stored, password):
                    if len(accepted) >= remember:
                        accepted.pop(next(iter(accepted)))
                    accepted[key] = None
                    return await handler(request)
        return web.Response(status=401, headers={"WWW-Authenticate": 'Basic realm="boundwatch"'})

    return middleware


async def metrics(request: web.Request) -> web.Response:
    """Serve the text format, or OpenMetrics when the scraper asks for it."""
    registry = request.app[REGISTRY]
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    body = encoder(registry)
    return web.Response(body=body, headers={"Content-Type": content_type})


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


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict) or hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


async def snapshot_json(request: web.Request) -> web.Response:
    """Serve the newest Snapshot as JSON (counters keyed "name{labels}")."""
    snap = request.app[SAMPLER].latest()
    if snap is None:
        return web.json_response({"error": "no snapshot yet"}, status=503)
    data = _plain(dataclasses.replace(snap, counters={}, histograms={}))
    data["counters"] = {f"{name}{{{','.join(labels)}}}": v for (name, labels), v in snap.counters.items()}
    return web.Response(text=json.dumps(data), content_type="application/json")


async def index(request: web.Request) -> web.Response:
    """Serve a small page: the verdict per GPU, source status and links."""
    snap = request.app[SAMPLER].latest()
    rows = []
    if snap is not None:
        for v in snap.verdicts:
            reasons = ", ".join(v.reasons) or "-"
            busy = "-" if v.busy_ratio is None else f"{v.busy_ratio:.0%} ({v.busy_source})"
            rows.append(
                f"<tr><td>GPU {v.gpu}</td><td>{v.verdict}</td><td>{html.escape(reasons)}</td><td>{busy}</td></tr>"
            )
        sources = " ".join(
            f"<span class={'up' if s.up else 'down'}>{s.name}: {'up' if s.up else 'down'}</span>"
            + ("" if s.up else f" <small>{html.escape(s.last_error)}</small>")
            for s in snap.sources
        )
    else:
        sources = "no snapshot yet"
    body = f"""<!doctype html><html><head><title>boundwatch</title><style>
body{{font-family:sans-serif;margin:2em}} td,th{{padding:.2em 1em;text-align:left}}
.up{{color:#070}} .down{{color:#a00}}</style></head><body>
<h1>boundwatch {__version__}</h1>
<p>Is each GPU GPU-bound or host-bound, and why.</p>
<table><tr><th>GPU</th><th>verdict</th><th>reasons</th><th>busy</th></tr>{"".join(rows) or "<tr><td colspan=4>no GPU verdicts</td></tr>"}</table>
<p>Sources: {sources}</p>
<p><a href="/metrics">/metrics</a> · <a href="/healthz">/healthz</a> · <a href="/api/snapshot">/api/snapshot</a></p>
<p><small>generated {time.strftime("%Y-%m-%d %H:%M:%S")}</small></p></body></html>"""
    return web.Response(text=body, content_type="text/html")


def make_app(cfg: Config, sampler: Sampler) -> web.Application:
    """Return the web application serving one sampler."""
    middlewares = []
    if cfg.web.basic_auth_file:
        middlewares.append(basic_auth_middleware(load_basic_auth(cfg.web.basic_auth_file)))
    app = web.Application(middlewares=middlewares)
    app[SAMPLER] = sampler
    app[CONFIG] = cfg
    app[REGISTRY] = make_registry(sampler, cfg)
    app.router.add_get("/", index)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/api/snapshot", snapshot_json)
    return app
