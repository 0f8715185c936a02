"""An engine's page as the engine source reads it: cut, decoded, parsed and bounded, handed on raw.

A page comes as bytes (over HTTP through `page_client`, or from a file, `read_page_file`) or
as an engine's PROMETHEUS_MULTIPROC_DIR files, read directly the way its /metrics would show
them (`MultiprocReader`, per-API-server histogram counts). Everything an engine says is bounded
where it enters (`PageLimits`): a read stops at a byte and a line budget (the reading is then
marked truncated), undecodable bytes are replaced, label values are cut, and NaN, infinite,
negative or implausible values are refused; each reading counts what its read lost by reason
(`page_refused`, exported as boundwatch_engine_page_refused_total). `raw_from_page`,
`raw_from_bytes` and `raw_from_multiproc` return the raw reading (`EngineReading.raw`: the wanted
samples, bounded; a page is cut to the names of `snapshot/engine_names.py` by `prefilter_page`,
and `looks_multiprocess` says what the whole page tells of its registry). Analysis normalises it
(`analysis/engine_page.py`, a one-shot read's by `normalise_once`). A page that is not an engine's
raises `PageError`, saying what the page holds.
"""

from __future__ import annotations

import glob
import http.client
import json
import math
import os
import re
import stat
import struct
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple
from urllib.parse import urlencode, urlsplit, urlunsplit

from prometheus_client.parser import text_string_to_metric_families

from exporter.config import EngineConfig
from exporter.snapshot.engine import (
    EngineReading,
    PageSample,
    RawPage,
    ascii_int,
    cut,
    refused_tuple,
)
from exporter.snapshot.engine_names import (
    KIND_PREFIXES,
    PREFIXES,
    SGLANG_RUNNING,
    SGLANG_WAITING,
    VLLM_ITER_COUNT,
    VLLM_RUNNING,
    VLLM_WAITING,
    WANTED,
    detect_kind,
)
from exporter.sources.engine_http import PageClient, PageReadError

# Sample names read from multiprocess files: the page's names, with the histogram count
# derived from its buckets (the files hold buckets and sum, never _count).
_FILE_WANTED = frozenset({n for n in WANTED if n != VLLM_ITER_COUNT} | {"vllm:iteration_tokens_total_bucket"})
_FILE_KEY_PREFIXES = tuple(b'["' + p.encode() for p in PREFIXES)  # a file's key: a JSON list, the name first


class Sample(NamedTuple):
    """One metric sample (the shape prometheus_client's parser yields)."""

    name: str
    labels: dict[str, str]
    value: float


# --- pages --------------------------------------------------------------------------------


class PageError(ValueError):
    """An engine's page (or files) cannot be read as an engine's metrics; `refused`: what the read lost."""

    def __init__(self, message: str, refused: Mapping[str, int] | None = None) -> None:
        super().__init__(message)
        self.refused: Counter[str] = Counter(refused or {})


@dataclass(frozen=True)
class PageLimits:
    """The budget of one read of an engine's page, and the longest label value kept."""

    max_bytes: int = 8 * 1024 * 1024
    max_lines: int = 50_000
    max_label_chars: int = 128
    max_kept_lines: int = 5_000  # lines of the names boundwatch reads: the parser's cost is per kept line

    @classmethod
    def of(cls, cfg: EngineConfig) -> PageLimits:
        """Return the limits an engine configuration sets (kept lines: a tenth of the line budget)."""
        return cls(
            cfg.max_page_bytes, cfg.max_page_lines, cfg.max_label_chars, max(100, cfg.max_page_lines // 10)
        )


DEFAULT_LIMITS = PageLimits()
MAX_REQUESTS = 1e7  # running or waiting requests beyond this are no real engine's
MAX_COUNTER = float(2**53)  # beyond this a float counter no longer counts by one
MAX_MULTIPROC_FILES = 4096
VALUE_REASONS = ("nan", "infinite", "negative", "too_large")  # the page_refused reasons of refused values
_REQUEST_GAUGES = frozenset(
    (
        *VLLM_RUNNING,
        *VLLM_WAITING,
        *SGLANG_RUNNING,
        *SGLANG_WAITING,
    )
)


# Each wanted name followed by what may come after it on a sample line, so that
# "vllm:num_requests_waiting" does not also keep "vllm:num_requests_waiting_by_reason".
_WANTED_LINE_PREFIXES: tuple[str, ...] = tuple(n + c for n in WANTED for c in ("{", " "))
# Families whose presence means single-process mode (multiprocess registries have none).
_SINGLE_PROCESS_MARKS = (
    "\nprocess_cpu_seconds_total",
    "\npython_gc_objects_collected_total",
    "_created{",
    "_created ",
)


def _trie(words: Iterable[str]) -> str:
    """Return a regular expression that matches exactly the given words, as a tree of their shared prefixes.

    At each position the engine tries the alternatives of one character at a time, not every word
    whole: on an engine's page, where most lines start with `vllm:`, several times faster.
    """
    tree: dict[str, Any] = {}
    for word in words:
        node = tree
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}  # a word ends here

    def emit(node: dict[str, Any]) -> str:
        alts = [re.escape(ch) + emit(node[ch]) for ch in sorted(node) if ch]
        if not alts:
            return ""
        if len(alts) == 1 and "" not in node:
            return alts[0]
        group = f"(?:{'|'.join(alts)})"
        return group + "?" if "" in node else group

    return emit(tree)


# The same cut as one regular expression: a line break, then a wanted sample or TYPE line (the
# leading "\n" lets the engine try only at line starts).
_NAMES = _trie(WANTED)
_KEEP = re.compile(f"\n((?:{_NAMES})[{{ ][^\n]*|# TYPE (?:{_NAMES})(?= |\n)[^\n]*)")
# Characters other than "\n" that str.splitlines() also ends a line at (the ASCII ones, then all).
_ASCII_LINE_ENDS = ("\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e")
_OTHER_LINE_ENDS = re.compile("[\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


def _only_newlines(text: str) -> bool:
    """Say whether "\n" is the only line end in a text (a few scans in C for an ASCII page)."""
    if text.isascii():
        return not any(c in text for c in _ASCII_LINE_ENDS)
    return not _OTHER_LINE_ENDS.search(text)


def prefilter_page(text: str) -> str:
    """Return only the sample lines boundwatch reads (and their TYPE lines), so parsing is cheap."""
    if _only_newlines(text):
        keep = _KEEP.findall(f"\n{text}\n")
        keep.append("")
        return "\n".join(keep)
    keep = [
        line
        for line in text.splitlines()
        if line.startswith(_WANTED_LINE_PREFIXES)
        or (line.startswith("# TYPE ") and line[7:].split(" ", 1)[0] in WANTED)
    ]
    keep.append("")
    return "\n".join(keep)


def looks_multiprocess(text: str) -> bool | None:
    """Say whether a full page came from a multiprocess registry (None: cannot tell)."""
    if not any(p in text for p in PREFIXES):
        return None
    # As `not any(mark in "\n" + text for mark in _SINGLE_PROCESS_MARKS)`, without copying the page:
    # a line-start mark also at the very start, the two `_created` marks by one search first.
    for mark in _SINGLE_PROCESS_MARKS[:2]:
        if text.startswith(mark[1:]) or mark in text:
            return False
    return "_created" not in text or not any(mark in text for mark in _SINGLE_PROCESS_MARKS[2:])


def cut_page(data: bytes, limits: PageLimits = DEFAULT_LIMITS) -> tuple[bytes, str]:
    """Return a page cut at a line end to the byte and line budgets, and the budget that cut it ("" if none)."""
    cut = ""
    if len(data) > limits.max_bytes:
        data = data[: limits.max_bytes]
        data = data[: data.rfind(b"\n") + 1]
        cut = "bytes"
    if data.count(b"\n") >= limits.max_lines:
        pos = -1
        for _ in range(limits.max_lines):
            pos = data.find(b"\n", pos + 1)
        if pos + 1 < len(data):
            data = data[: pos + 1]
            cut = cut or "lines"
    return data, cut


def decode_page(data: bytes) -> tuple[str, int]:
    """Return a page as text (undecodable bytes replaced) and how many replacement characters it gained."""
    try:
        return data.decode("utf-8"), 0
    except UnicodeDecodeError:
        text = data.decode("utf-8", errors="replace")
        return text, max(1, text.count("\ufffd"))


def refusal(value: float, top: float = MAX_COUNTER) -> str:
    """Return why a value is refused (nan, infinite, negative, too_large), or "" when it is kept."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "infinite"
    if value < 0.0:
        return "negative"
    return "too_large" if value > top else ""


def sanitise(
    samples: Iterable[Sample], limits: PageLimits = DEFAULT_LIMITS
) -> tuple[list[Sample], Counter[str]]:
    """Drop NaN, infinite, negative and implausible values; cut label names and values; count both by reason."""
    out: list[Sample] = []
    refused: Counter[str] = Counter()
    n = limits.max_label_chars
    for s in samples:
        top = MAX_REQUESTS if s.name in _REQUEST_GAUGES else MAX_COUNTER
        if not 0.0 <= s.value <= top:  # False for NaN too
            refused[refusal(s.value, top)] += 1
            continue
        if any(len(k) > n or len(v) > n for k, v in s.labels.items()):
            s = Sample(s.name, {k[:n]: v[:n] for k, v in s.labels.items()}, s.value)
            refused["label"] += 1
        out.append(s)
    return out, refused


_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_PAIR = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*"'
# name, {labels} (optional, an optional trailing comma), value, timestamp (optional)
_PLAIN_SAMPLE = re.compile(
    rf"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{{((?:{_LABEL_PAIR}(?:,{_LABEL_PAIR})*,?)?)\}})?"
    r"[ \t]+([^ \t]+)(?:[ \t]+([^ \t]+))?"
)
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_ESCAPE = re.compile(r'\\[\\n"]')
_UNESCAPED = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}


def _plain_value(token: str) -> float | None:
    """Return a sample value as prometheus_client's parser reads it, None for a shape left to that parser."""
    if "_" in token or len(token) > 32:  # "1_0" is an error there; a long integer overflows there
        return None
    try:
        return float(token)
    except ValueError:
        return None


def plain_samples(body: str) -> list[Sample] | None:
    """Return the samples of a page whose lines all have the plain shape, else None.

    The plain shape: `name{label="value",...} value [timestamp]` and `# TYPE name type` lines, as
    engines write them. Read by two regular expressions, which gives the samples that
    prometheus_client's parser gives, several times cheaper; any other line (odd spacing,
    quoted names, a counter TYPE without `_total`, a bad value) returns None, and the caller
    leaves the whole page to prometheus_client's parser, its result and its errors.
    """
    out: list[Sample] = []
    for raw in body.split("\n"):
        line = raw.strip()
        if not line:
            continue
        if line[0] == "#":
            parts = line.split(None, 3)
            if (
                len(parts) != 4
                or parts[1] != "TYPE"
                or '"' in line
                or not _METRIC_NAME.fullmatch(parts[2])
                or (parts[3] == "counter" and not parts[2].endswith("_total"))
            ):
                return None
            continue
        m = _PLAIN_SAMPLE.fullmatch(line)
        if m is None:
            return None
        name, label_text, value_token, stamp = m.groups()
        value = _plain_value(value_token)
        if value is None or (stamp is not None and _plain_value(stamp) is None):
            return None
        labels: dict[str, str] = {}
        if label_text:
            pairs = _LABEL.findall(label_text)
            for key, v in pairs:
                if key.startswith("__"):
                    return None
                labels[key] = _ESCAPE.sub(lambda e: _UNESCAPED[e.group(0)], v) if "\\" in v else v
            if len(labels) != len(pairs):  # a label named twice: an error there
                return None
        out.append(Sample(name, labels, value))
    return out


MAX_FALLBACK_CHARS = 256 * 1024  # kept text that prometheus_client's parser takes when the plain one cannot
MAX_FALLBACK_LINE = 4096  # ... and the longest line in it (an engine's are ~100-300 characters)


def parse_page(text: str, *, prefilter: bool = True) -> list[Sample]:
    """Parse a metrics page, cut down to the wanted lines first: plain lines by `plain_samples`, else prometheus_client's parser.

    The fallback parser's cost grows with the square of a line's labels: kept text that the plain
    parser refused, past MAX_FALLBACK_CHARS or with a line past MAX_FALLBACK_LINE, is refused whole.
    """
    body = prefilter_page(text) if prefilter else text
    plain = plain_samples(body)
    if plain is not None:
        return plain
    if len(body) > MAX_FALLBACK_CHARS or max(map(len, body.split("\n"))) > MAX_FALLBACK_LINE:
        raise PageError(f"bad page: {len(body)} characters of read samples, not in the plain text format")
    out: list[Sample] = []
    try:
        for fam in text_string_to_metric_families(body):
            out.extend(Sample(s.name, dict(s.labels), float(s.value)) for s in fam.samples)
    except Exception as exc:  # the parser raises ValueError, IndexError, KeyError... on a bad line
        raise PageError(cut(f"bad page: {type(exc).__name__}: {exc}")) from exc
    return out


def _no_engine_metrics(text: str) -> PageError:
    """Return the error for a page without a sample boundwatch reads, saying what the page does hold."""
    for prefix in PREFIXES:
        families = {
            line[7:].split(" ", 1)[0]
            for line in text.splitlines()
            if line.startswith(f"# TYPE {prefix}") or line.startswith(f"# HELP {prefix}")
        }
        if families or f"\n{prefix}" in f"\n{text}":
            read = ", ".join(n for n in WANTED if n.startswith(prefix))
            return PageError(
                cut(
                    f"the page has {len(families) or 'some'} {prefix} families but none that boundwatch "
                    f"reads ({read})",
                    1000,
                )
            )
    return PageError("no vllm: or sglang: metrics on the page (is this an engine's /metrics?)")


def _page_samples(samples: Iterable[Sample]) -> tuple[PageSample, ...]:
    """Return samples in the Snapshot's compact form (label pairs, not a dict per sample)."""
    return tuple(PageSample(s.name, tuple(s.labels.items()), s.value) for s in samples)


def raw_from_page(
    text: str,
    *,
    name: str = "",
    url: str = "",
    source: str = "http",
    limits: PageLimits = DEFAULT_LIMITS,
) -> EngineReading:
    """Return the raw reading of one page: its wanted samples, bounded, and what the read lost (not normalised)."""
    kept = prefilter_page(text).split("\n")
    truncated = len(kept) > limits.max_kept_lines + 1  # the last is the empty string after the final newline
    if truncated:
        kept = [*kept[: limits.max_kept_lines], ""]
    lost: Counter[str] = Counter(lines=1) if truncated else Counter()
    try:
        parsed = parse_page("\n".join(kept), prefilter=False)
    except PageError as exc:
        exc.refused.update(lost + Counter(unparsable=1))
        raise
    samples, refused = sanitise(parsed, limits)
    lost.update(refused)
    values = sum(refused[r] for r in VALUE_REASONS)
    kind = detect_kind(samples)
    if kind is None:
        if values:
            raise PageError(
                f"every engine sample on the page was refused ({values}: NaN, negative or too large)", lost
            )
        error = _no_engine_metrics(text)
        error.refused.update(lost)
        raise error
    raw = RawPage(_page_samples(samples), multiprocess=looks_multiprocess(text))
    return EngineReading(
        name=name or kind,
        kind=kind,
        url=url,
        source=source,
        rejected_values=values,
        page_truncated=truncated,
        page_refused=refused_tuple(lost),
        raw=raw,
    )


def raw_from_bytes(
    data: bytes,
    *,
    name: str = "",
    url: str = "",
    source: str = "http",
    limits: PageLimits = DEFAULT_LIMITS,
) -> EngineReading:
    """Return the raw reading of a page as read (bytes): cut to the budgets, decoded per engine, then parsed."""
    data, cut = cut_page(data, limits)
    text, replaced = decode_page(data)
    lost: Counter[str] = Counter({cut: 1} if cut else {}) + Counter(undecodable=replaced)
    try:
        reading = raw_from_page(text, name=name, url=url, source=source, limits=limits)
    except PageError as exc:
        exc.refused.update(lost)
        raise
    lost.update(dict(reading.page_refused))
    return replace(
        reading,
        page_truncated=bool(cut) or reading.page_truncated,
        page_decode_errors=replaced,
        page_refused=refused_tuple(lost),
    )


def read_page_file(path: str, limits: PageLimits = DEFAULT_LIMITS) -> bytes:
    """Return at most the byte budget of a page file, plus one byte so a longer page reads as cut."""
    with open(path, "rb") as fh:
        return fh.read(limits.max_bytes + 1)


# What a failed HTTP read raises: PageClient's own errors, the protocol's, a timeout, the socket's.
READ_ERRORS = (PageReadError, http.client.HTTPException, TimeoutError, OSError, ValueError)


# The marks of a single-process registry asked for with a filtered page (`looks_multiprocess`): the
# process and GC collectors' samples, and one counter's `_created` sample (a registry of its own, as
# a lab's, has no collector but its counters'; one name only, as each lengthens the request line,
# which engines log).
_ASKED_MARKS = ("process_cpu_seconds_total", "python_gc_objects_collected_total")
_KINDS = {kind: prefix.encode() for kind, prefix in KIND_PREFIXES}


def asked_names(kind: str) -> tuple[str, ...]:
    """Return the sample names a filtered page of an engine kind is asked for: those read, and the marks."""
    if kind not in _KINDS:
        return ()
    return (*(n for n in WANTED if n.startswith(kind + ":")), *_ASKED_MARKS, f"{kind}:prompt_tokens_created")


def filtered_url(url: str, kind: str) -> str:
    """Return the URL that asks an engine's page for only `asked_names(kind)`; "" where none is asked.

    vLLM (0.33) and SGLang mount prometheus_client's app, which honours `name[]`, at `/metrics`; vLLM's
    own `/metrics` route (its HTTP instrumentator's, matched first) ignores it, while `/metrics/` reaches
    the mounted app. So the filter is asked at the path with one trailing slash. A URL with a query of
    its own, or an engine of no known kind, is not asked.
    """
    parts = urlsplit(url)
    names = asked_names(kind)
    if parts.query or parts.fragment or parts.scheme not in ("http", "https") or not names:
        return ""
    query = urlencode([("name[]", n) for n in names], safe=":")
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/") + "/", query, ""))


def _kind_of(data: bytes) -> str:
    return next((kind for kind, mark in _KINDS.items() if mark in data), "")


class EnginePageClient(PageClient):
    """An engine's page over HTTP, asked for only the samples boundwatch reads where the engine can filter.

    A single-process prometheus_client registry (vLLM with one API server) serves the filtered page:
    54 lines of its ~1,030 (28 samples), rendered ~7x cheaper by the API server (bench/README.md, issue 14).
    A multiprocess registry answers the filter with an empty page (prometheus_client's
    CollectorRegistry() does not restrict collectors without names); another server may answer 404
    or ignore the filter (a route of its own, a redirect to the path without the slash). So the page
    is read whole until it shows the engine's kind (or discovery named it), then filtered; a filtered
    read that holds no sample of that kind is read again whole at once. This engine is read whole
    from then on (`filter_off` says why) where that page does hold some, where the filtered URL
    answers an HTTP error the whole one does not, or where the filtered page holds more families than
    were asked for (the filter ignored: asking would only lengthen the request). A timeout or a
    refused connection changes nothing.
    """

    def __init__(
        self, url: str, timeout: float, max_bytes: int, max_lines: int, ask: bool = True, kind: str = ""
    ) -> None:
        super().__init__(url, timeout, max_bytes, max_lines)
        self.filtered = ""  # the filtered page's URL; "" while the page is read whole
        self._asked = 0  # how many names that URL asks for
        self.filter_off = "" if ask else "not asked"  # why this engine is read whole for good
        if ask:
            self._ask(kind)

    def _ask(self, kind: str) -> None:
        """Ask for the filtered page of an engine kind from the next read on ("" for none)."""
        self.filtered = filtered_url(self.url, kind)
        self._asked = len(asked_names(kind))

    def get(self) -> bytes:
        """Return the page's body (filtered where the engine filters), or raise PageReadError."""
        if self.filter_off:
            return super().get()
        if not self.filtered:
            data = super().get()
            kind = _kind_of(data)  # the engine serves its metrics: ask for its kind's from the next read
            self._ask(kind)
            if kind and not self.filtered:
                self.filter_off = "the URL has a query of its own"
            return data
        try:
            data = self.get_url(self.filtered)
        except PageReadError as exc:  # an HTTP status: the whole page's URL may still answer
            data = super().get()
            self.filter_off = f"the filtered page answered {exc}"
            return data
        if _kind_of(data):
            families = data.count(b"\n# TYPE ") + data.startswith(b"# TYPE ")
            if families > self._asked:
                self.filter_off = f"the engine ignores the filter (its page held {families} families)"
            return data
        whole = super().get()
        if _kind_of(whole):
            self.filter_off = "the filtered page held no engine sample (a multiprocess registry)"
        else:
            self.filtered = ""  # an engine not serving its metrics yet: read whole until it does
        return whole


def page_client(
    url: str, timeout: float, limits: PageLimits = DEFAULT_LIMITS, ask: bool = True, kind: str = ""
) -> EnginePageClient:
    """Return a client that reads an engine's page over HTTP no further than the byte and line budgets
    (plus a chunk), asking for only the samples read where the engine filters (`EnginePageClient`)."""
    return EnginePageClient(url, timeout, limits.max_bytes, limits.max_lines, ask, kind)


def describe_error(exc: BaseException, timeout: float | None = None) -> str:
    """Return what a failed read means in words: refused, no answer, a bad page, an HTTP status."""
    if isinstance(exc, PageError | PageReadError):
        return cut(str(exc))
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout:g} s" if timeout else "no answer in time"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (nothing listens on that port)"
    text = str(exc)
    return cut(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


# --- multiprocess files ---------------------------------------------------------------------


def _pid_of(filename: str) -> str:
    return os.path.basename(filename)[:-3].rsplit("_", 1)[-1]


_INT = struct.Struct("i")
_TWO_DOUBLES = struct.Struct("dd")


@dataclass
class _FileIndex:
    """Where the wanted keys of one multiprocess file sit: keys are only ever appended, never moved."""

    scanned_to: int = 8  # the file's `used` mark when it was last scanned
    entries: list[tuple[int, str, tuple[tuple[str, str], ...], bool]] = field(default_factory=list)
    # (offset of value+timestamp, sample name, labels without le, is a histogram bucket)


def _scan(data: bytes, start: int, used: int, index: _FileIndex, room: int) -> int:
    """Index the wanted keys between start and used (the layout of prometheus_client's MmapedDict).

    At most `room` more entries are indexed; return how many wanted keys were left out past it.
    """
    pos, left = start, 0
    while pos < used:
        (length,) = _INT.unpack_from(data, pos)
        value_pos = pos + 4 + length + (8 - (length + 4) % 8)
        if length <= 0 or value_pos + 16 > used:  # a key, or its value, past the used mark
            raise RuntimeError("multiprocess file is corrupt or being written")
        key = data[pos + 4 : pos + 4 + length]
        pos = value_pos + 16
        if not key.startswith(_FILE_KEY_PREFIXES):
            continue
        parts = key.split(b'"', 4)
        if len(parts) < 5 or parts[3].decode() not in _FILE_WANTED:
            continue
        if len(index.entries) >= room:
            left += 1
            continue
        _, sample, raw_labels, _help = json.loads(key)
        labels = {str(k): str(v) for k, v in raw_labels.items()}
        bucket = sample.endswith("_bucket")
        if bucket:
            labels = {k: v for k, v in labels.items() if k != "le"}
            sample = sample[: -len("_bucket")] + "_count"
        index.entries.append((value_pos, sample, tuple(sorted(labels.items())), bucket))
    index.scanned_to = used
    return left


class NotRegularFile(RuntimeError):
    """A multiprocess dir's `.db` entry that is no regular file (a FIFO, a device): refused as `files`."""


def _read_regular(filename: str, limit: int) -> tuple[int, bytes]:
    """Return a multiprocess file's used mark and its bytes up to it, or (used, b"") past `limit`.

    Opened without blocking and read only if it is a regular file: the dir is the engine user's to
    write, and a FIFO named `x.db` would hold the engine source's thread for good.
    """
    fd = os.open(filename, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(filename)
        head = os.read(fd, 8)
        if len(head) < 8:
            return 0, b""
        (used,) = _INT.unpack_from(head, 0)
        if used > limit:
            return used, b""
        chunks = [head]
        got = 8
        while got < used and (chunk := os.read(fd, used - got)):
            chunks.append(chunk)
            got += len(chunk)
    finally:
        os.close(fd)
    if got < used:
        raise RuntimeError("multiprocess file shorter than its used mark")
    return used, b"".join(chunks)


class MultiprocReader:
    """Read an engine's PROMETHEUS_MULTIPROC_DIR the way its /metrics would, for the wanted names only.

    The first read indexes where the wanted keys sit in each file; later reads only unpack those
    values (and index keys appended since), so a tick costs a read of each file and a few dozen
    unpacks, and nothing in the serving processes.
    """

    def __init__(self, path: str, limits: PageLimits = DEFAULT_LIMITS) -> None:
        self.path = path
        self.limits = limits
        self.truncated = False  # the last read skipped files over the budgets
        self.refused: Counter[str] = Counter()  # what the last read refused or skipped, by reason
        self._index: dict[str, _FileIndex] = {}

    def read(self) -> tuple[list[Sample], tuple[tuple[int, float], ...]]:
        """Return the merged samples and each process's iteration_tokens_total count.

        Counters and histograms are summed over processes, gauges merged by their multiprocess
        mode. A gauge in mode 'all' (vLLM 0.10-0.11 kv_cache_usage_perc, one series per pid) is
        taken from the process that wrote the freshest 'mostrecent' gauge of the same engine: the
        one that received the last scheduler stats. Without one, its pid series are kept, as
        /metrics shows them.
        """
        counters: dict[tuple[str, tuple[tuple[str, str], ...]], float] = defaultdict(float)
        gauges: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[float, float]] = {}
        per_pid_gauges: dict[tuple[str, tuple[tuple[str, str], ...]], dict[str, float]] = defaultdict(dict)
        freshest: dict[tuple[tuple[str, str], ...], tuple[float, str]] = {}  # labels -> (timestamp, pid)
        per_pid: dict[int, float] = defaultdict(float)
        seen = set()
        files = sorted(glob.glob(os.path.join(glob.escape(self.path), "*.db")))  # the path: anyone's text
        self.truncated = len(files) > MAX_MULTIPROC_FILES
        self.refused = Counter(files=max(0, len(files) - MAX_MULTIPROC_FILES))
        # one read's budget over all its files, as a page's: bytes read, and entries (kept lines) unpacked
        bytes_left, room = self.limits.max_bytes, self.limits.max_kept_lines
        for filename in files[:MAX_MULTIPROC_FILES]:
            seen.add(filename)
            base = os.path.basename(filename)
            typ = base.split("_", 1)[0]
            mode = base.split("_")[1] if typ == "gauge" else ""
            pid = _pid_of(filename)
            pid_number = ascii_int(pid, 10)  # its file name's pid, the engine's to write
            got = self._indexed(filename, bytes_left, room)
            if got is None:
                continue
            data, index = got
            bytes_left -= len(data)
            entries = index.entries[: max(0, room)]
            room -= len(index.entries)
            for value_pos, sample, lkey, bucket in entries:
                value, ts = _TWO_DOUBLES.unpack_from(data, value_pos)
                if not 0.0 <= value <= MAX_COUNTER:  # NaN, infinite or negative in one process's file
                    self.refused[refusal(value)] += 1
                    continue
                if bucket and pid_number is not None:
                    per_pid[pid_number] += value
                if typ != "gauge":
                    counters[(sample, lkey)] += value
                elif mode in ("all", "liveall"):
                    per_pid_gauges[(sample, lkey)][pid] = value
                elif mode in ("mostrecent", "livemostrecent"):
                    prev = gauges.get((sample, lkey))
                    if prev is None or ts >= prev[1]:
                        gauges[(sample, lkey)] = (value, ts)
                    if ts > freshest.get(lkey, (0.0, ""))[0]:
                        freshest[lkey] = (ts, pid)
                else:
                    prev = gauges.get((sample, lkey))
                    gauges[(sample, lkey)] = (
                        value if prev is None else _COMBINE.get(mode, _last)(prev[0], value),
                        0.0,
                    )
        for gone in set(self._index) - seen:
            del self._index[gone]
        samples = [Sample(n, dict(lk), v) for (n, lk), v in counters.items()]
        samples += [Sample(n, dict(lk), v) for (n, lk), (v, _) in gauges.items()]
        for (n, lk), by_pid in per_pid_gauges.items():
            fresh_pid = freshest.get(lk, (0.0, ""))[1]
            if fresh_pid in by_pid:
                samples.append(Sample(n, dict(lk), by_pid[fresh_pid]))
            else:
                samples += [Sample(n, {**dict(lk), "pid": p}, v) for p, v in by_pid.items()]
        return samples, tuple(sorted(per_pid.items()))

    def _indexed(self, filename: str, bytes_left: int, room: int) -> tuple[bytes, _FileIndex] | None:
        """Return one file's bytes and its index brought up to date, or None (skipped, counted where over a budget)."""
        try:
            used, data = _read_regular(filename, bytes_left)
            if used > bytes_left:
                self.truncated = True
                self.refused["bytes"] += 1
                return None
            if not data:
                return None
            index = self._index.get(filename)
            if index is None or used < index.scanned_to:  # new, or replaced by a new process
                index = self._index[filename] = _FileIndex()
            if used > index.scanned_to:
                left = _scan(data, index.scanned_to, used, index, max(0, room))
                if left:
                    self.truncated = True
                    self.refused["lines"] += left
        except NotRegularFile:
            self.truncated = True
            self.refused["files"] += 1
            return None
        except (OSError, RuntimeError, ValueError, AttributeError, TypeError, struct.error, RecursionError):
            self._index.pop(filename, None)
            return None  # a file being created or removed under us, or not an engine's
        return data, index


def read_multiproc_dir(path: str) -> tuple[list[Sample], tuple[tuple[int, float], ...]]:
    """Read a PROMETHEUS_MULTIPROC_DIR once (see MultiprocReader)."""
    return MultiprocReader(path).read()


def _last(_a: float, b: float) -> float:
    return b


_COMBINE: dict[str, Callable[[float, float], float]] = {
    "sum": lambda a, b: a + b,
    "livesum": lambda a, b: a + b,
    "max": max,
    "livemax": max,
    "min": min,
    "livemin": min,
}


def multiproc_dir_usable(path: str | None) -> bool:
    """Say whether a multiprocess dir exists, can be read and holds engine files."""
    if not path:
        return False
    try:  # the first `.db` found is enough: no listing of the whole dir (or a glob of the path's own text)
        with os.scandir(path) as entries:
            return any(e.name.endswith(".db") and not e.name.startswith(".") for e in entries)
    except OSError:  # not there, not a dir, not readable
        return False


def raw_from_multiproc(
    path: str | MultiprocReader, *, name: str = "", url: str = "", kind: str | None = None
) -> EngineReading:
    """Return the raw reading of an engine's multiprocess files (a reader keeps its index), not normalised."""
    reader = path if isinstance(path, MultiprocReader) else MultiprocReader(path)
    path = reader.path
    raw, per_pid_raw = reader.read()
    samples, refused = sanitise(raw, reader.limits)
    refused.update(reader.refused)
    per_pid = tuple((pid, c) for pid, c in per_pid_raw if 0.0 <= c <= MAX_COUNTER)
    found = kind or detect_kind(samples)
    if found is None:
        raise PageError(cut(f"no vllm: or sglang: metrics in {path}"), refused)
    page = RawPage(_page_samples(samples), kind=kind, multiprocess=True, iteration_count_by_pid=per_pid)
    return EngineReading(
        name=name or found,
        kind=found,
        url=url,
        source="multiproc_files",
        rejected_values=sum(refused[r] for r in VALUE_REASONS),
        page_truncated=reader.truncated,
        page_refused=refused_tuple(refused),
        raw=page,
    )
