"""Logging through structlog: JSON when not on a terminal, readable on a terminal."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

# a URL: its scheme, its authority up to the first '/', and the rest up to a space or a quote
_URL = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^\s/\"'<>]*)([^\s\"'<>]*)")


def _scrub_url(m: re.Match[str]) -> str:
    scheme, authority, rest = m.groups()
    host = authority.rpartition("@")[2]  # user:password@ (a password may hold '@': up to the last)
    cut = min((i for i in (host.find("?"), host.find("#")) if i >= 0), default=len(host))
    host, rest = host[:cut], host[cut:] + rest
    path, q, query = rest.partition("?")
    if not q:
        return scheme + host + rest
    query, hash_, fragment = query.partition("#")
    params = (part.partition("=") for part in query.split("&"))
    query = "&".join(key + ("=redacted" if sep else "") for key, sep, _ in params)
    return f"{scheme}{host}{path}?{query}{hash_}{fragment}"


def scrub(text: str) -> str:
    """Return text with every URL's credentials removed: its user:password, and its query's values.

    An engine's URL may carry them (`http://user:pw@host/metrics?token=...`, given with --engine-url);
    logs, the status page and /api/snapshot show a URL only through this.
    """
    return _URL.sub(_scrub_url, text) if "://" in text else text


def _scrub_event(_logger: Any, _name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """A structlog processor: `scrub` every text value of an event (URLs in errors and fields alike)."""
    for key, value in event.items():
        if isinstance(value, str) and "://" in value:
            event[key] = scrub(value)
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
        _scrub_event,
    ]
    handler = _StderrHandler()
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=lambda *_: _StderrLogger(),
        cache_logger_on_first_use=False,
    )
