"""One read of an engine's page normalised at once: the source's raw read, then analysis' `normalise_once`.

What `boundwatch inspect` does with `read_once`; the tests of one page's figures (and the golden
page's scene) read a page this way instead of through a Snapshot and the pipeline.
"""

from __future__ import annotations

from exporter.analysis.engine_page import normalise_once
from exporter.snapshot.engine import EngineReading
from exporter.sources.engine_scrape import (
    DEFAULT_LIMITS,
    MultiprocReader,
    PageLimits,
    raw_from_bytes,
    raw_from_multiproc,
    raw_from_page,
)


def reading_from_page(
    text: str, *, name: str = "", url: str = "", source: str = "http", limits: PageLimits = DEFAULT_LIMITS
) -> EngineReading:
    """Return the normalised reading of one page (raw_from_page, then normalise_once)."""
    raw = raw_from_page(text, name=name, url=url, source=source, limits=limits)
    return normalise_once(raw, limits.max_label_chars)


def reading_from_bytes(
    data: bytes, *, name: str = "", url: str = "", source: str = "http", limits: PageLimits = DEFAULT_LIMITS
) -> EngineReading:
    """Return the normalised reading of a page as read (raw_from_bytes, then normalise_once)."""
    raw = raw_from_bytes(data, name=name, url=url, source=source, limits=limits)
    return normalise_once(raw, limits.max_label_chars)


def reading_from_multiproc(
    path: str | MultiprocReader, *, name: str = "", url: str = "", kind: str | None = None
) -> EngineReading:
    """Return the normalised reading of an engine's multiprocess files (raw_from_multiproc, then normalise_once)."""
    raw = raw_from_multiproc(path, name=name, url=url, kind=kind)
    limits = path.limits if isinstance(path, MultiprocReader) else DEFAULT_LIMITS
    return normalise_once(raw, limits.max_label_chars)
