"""Logging through structlog: JSON when not on a terminal, readable on a terminal."""

from __future__ import annotations

import logging
import sys

import structlog


class _StderrLogger:
    """Write each rendered line to whatever sys.stderr is now (it can be replaced after set-up)."""

    def msg(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    log = debug = info = warning = warn = error = critical = exception = fatal = msg


def configure(level: str = "info", fmt: str = "auto") -> None:
    """Configure structlog (and stdlib logging) for the daemon."""
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer(colors=False)
    )
    numeric = getattr(logging, level.upper(), logging.INFO)
    logging.basicConfig(level=numeric, stream=sys.stderr, format="%(message)s")
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=lambda *_: _StderrLogger(),
        cache_logger_on_first_use=False,
    )
