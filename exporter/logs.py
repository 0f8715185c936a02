"""Logging through structlog: JSON when not on a terminal, readable on a terminal."""

from __future__ import annotations

import logging
import math
import re
import sys
import time
from collections.abc import Callable, MutableMapping
from typing import Any

import structlog
from aiohttp.http_exceptions import HttpProcessingError

# a URL: its scheme, its authority up to the first '/', and the rest up to a space or a quote
_URL = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^\s/\"'<>]*)([^\s\"'<>]*)")


# an authority that is no host[:port] (what follows its ':' is no port): a user:password whose password
# holds a '/' not percent-encoded, so the authority went on past it (up to the last '@' before the query)
_NOT_A_PORT = re.compile(r"[^@\[\]/]*:(?!\d*$)")

_TRAILING = ".,;:!?)]}"  # punctuation after a URL in prose: the sentence's, not the URL's
# schemes whose query may carry a token (a presigned URL's signature)
_WEB = ("http://", "https://", "ws://", "wss://")


def _scrub_url(m: re.Match[str]) -> str:
    scheme, authority, rest = m.groups()
    after = ""
    if rest:
        kept = rest.rstrip(_TRAILING)
        rest, after = kept, rest[len(kept) :]
    elif authority:
        kept = authority.rstrip(_TRAILING)
        authority, after = kept, authority[len(kept) :]
    if rest and "@" not in authority and _NOT_A_PORT.match(authority):  # user:pa/ss@host: a '/' unencoded
        at = rest.rfind(
            "@", 0, min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
        )
        if at >= 0:
            authority, rest = authority + rest[: at + 1], rest[at + 1 :]
    host = authority.rpartition("@")[2]  # user:password@ (a password may hold '@': up to the last)
    cut = min((i for i in (host.find("?"), host.find("#")) if i >= 0), default=len(host))
    host, rest = host[:cut], host[cut:] + rest
    path, q, query = rest.partition("?")
    if not q or scheme.lower() not in _WEB:
        return scheme + host + rest + after
    query, hash_, fragment = query.partition("#")
    params = (part.partition("=") for part in query.split("&"))
    query = "&".join(key + ("=redacted" if sep else "") for key, sep, _ in params)
    return f"{scheme}{host}{path}?{query}{hash_}{fragment}{after}"


def scrub(text: str) -> str:
    """Return text with every URL's credentials removed: its user:password, and its query's values.

    An engine's URL may carry them (`http://user:pw@host/metrics?token=...`, given with --engine-url);
    logs, the status page and /api/snapshot show a URL only through this.
    """
    return _URL.sub(_scrub_url, text) if "://" in text else text


def _scrub_event(_logger: Any, _name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """A structlog processor, after the traceback is rendered: `scrub` every value of an event that shows a URL.

    Text is scrubbed as it is; any other value (an exception, a list) that shows a URL is logged as
    its scrubbed text.
    """
    for key, value in event.items():
        if isinstance(value, str):
            if "://" in value:
                event[key] = scrub(value)
        elif not isinstance(value, int | float | bool | type(None)) and "://" in (text := str(value)):
            event[key] = scrub(text)
    return event


class _StderrLogger:
    """Write each rendered line to whatever sys.stderr is now (it can be replaced after set-up)."""

    def msg(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    log = debug = info = warning = warn = error = critical = exception = fatal = msg


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stdlib handler writing to whatever sys.stderr is now."""

    @property  # type: ignore[override]
    def stream(self) -> object:
        """Return the current sys.stderr."""
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


class ClientErrorFilter(logging.Filter):
    """Log a client's malformed request (aiohttp's "Error handling request" for an HTTP parse error) at most once in `every` s.

    Anyone who reaches the port can send them, before any credentials are asked for: each was an
    error-level record with a traceback (~650 bytes). The one logged says how many were left out
    since the last and carries no traceback (it is the client's, not the daemon's); any other record,
    a handler's own exception among them, passes as it is.
    """

    def __init__(self, every: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._every, self._clock = every, clock
        self._at = -math.inf
        self.left_out = 0  # since the last logged
        self.total = 0  # every one seen (boundwatch_http_refused_total{cause="bad_request"})

    def filter(self, record: logging.LogRecord) -> bool:
        """Pass a record, or leave out a client's malformed request logged under `every` s ago."""
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        self.total += 1
        now = self._clock()
        if now - self._at < self._every:
            self.left_out += 1
            return False
        record.msg = (
            f"{record.getMessage()}: {exc.__class__.__name__} ({self.left_out} more left out since the last)"
        )
        record.args, record.exc_info, record.exc_text = (), None, None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        self._at, self.left_out = now, 0
        return True


# the one filter on aiohttp's server logger (configure installs it): its `total` is the count exported
CLIENT_ERRORS = ClientErrorFilter()


def configure(level: str = "info", fmt: str = "auto") -> None:
    """Configure structlog, and route stdlib logging (aiohttp's records) through the same renderer."""
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer(colors=False)
    )
    numeric = getattr(logging, level.upper(), logging.INFO)
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    handler = _StderrHandler()
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                _scrub_event,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    server = logging.getLogger("aiohttp.server")
    if CLIENT_ERRORS not in server.filters:
        server.addFilter(CLIENT_ERRORS)
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, _scrub_event, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=lambda *_: _StderrLogger(),
        cache_logger_on_first_use=False,
    )
