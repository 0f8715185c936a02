"""The engine source: find vLLM and SGLang engines on the host and read their scheduler state every tick.

Per engine and tick it reads the metrics page over HTTP (one kept-alive connection per engine,
read on the source's own thread: engine_http.py), a page from a file, or, when
the engine runs in prometheus multiprocess mode on this host, its PROMETHEUS_MULTIPROC_DIR files
directly (no request to the serving process, and per-API-server histogram counts); then the CPU
of each API-server process and its busiest thread, and the cgroups of the engine's processes.
A reading holds the page raw (`EngineReading.raw`: the wanted samples, bounded, and the
API-server count the process table gives): analysis.engine_page normalises it into the engine's
figures and step count in the pipeline, so a replay normalises a recorded page again.
Every `DISCOVER_EVERY_SECONDS` discovery lists the pids and reads only the processes that are new,
re-parented or young; engines are found again only when the table changed. CPU is sampled every tick.

Each scrape of an API server's /metrics costs that process CPU on the event loop that also
tokenises and streams (bench/api_server_scrape_cost.py). So while an agent reports an engine's
scheduler counts (the newest Snapshot says `counts_source == "agent"`, see `follow`), its page
is read over HTTP only every `engine.slow_read_seconds`, for the token counters and the model
name; between reads the last page reading is carried, marked `page_read=False` with its age.
Without agent counts, after a failed read, and for page files and multiprocess files (which
cost the engine nothing) every tick reads.

Everything an engine says is bounded where it enters: a read stops at a byte and a line budget
(the reading is then marked truncated), undecodable bytes are replaced per engine, label values
are cut, and NaN, infinite, negative or implausible values are refused; each reading counts what
its read lost by reason (`page_refused`, exported as boundwatch_engine_page_refused_total), so one
engine's page can neither hide the others nor poison an integrated counter. Each engine's change
of state, and each engine found or lost, is logged once.
"""

from __future__ import annotations

import asyncio
import glob
import http.client
import json
import math
import os
import re
import stat
import struct
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlparse

import structlog
from prometheus_client.parser import text_string_to_metric_families

from exporter.analysis import engine_page
from exporter.config import Config, EngineConfig
from exporter.snapshot import Snapshot
from exporter.snapshot.engine import PAGE_REFUSED_REASONS, EngineReading, GraphConfig, PageSample, RawPage
from exporter.snapshot.host import CgroupCpu, ProcessCpu
from exporter.sources import placement, procs
from exporter.sources.base import BlockingReader, SourceUnavailable
from exporter.sources.cgroup import cgroup_path_of, read_cgroup_cpu
from exporter.sources.engine_flags import graph_config
from exporter.sources.engine_http import PageClient, PageReadError

log = structlog.get_logger("boundwatch.engine")

DISCOVER_EVERY_SECONDS = 5.0
DEFAULT_PORTS = {"vllm": 8000, "sglang": 30000}
API_SERVER_TITLE = re.compile(r"^(?:\S*::)?APIServer_(\d+)\b")
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# Sample names read from multiprocess files: the page's names, with the histogram count
# derived from its buckets (the files hold buckets and sum, never _count).
_FILE_WANTED = frozenset(
    {n for n in engine_page.WANTED if n != engine_page.VLLM_ITER_COUNT}
    | {"vllm:iteration_tokens_total_bucket"}
)


class Sample(NamedTuple):
    """One metric sample (the shape prometheus_client's parser yields)."""

    name: str
    labels: dict[str, str]
    value: float


@dataclass
class EngineTarget:
    """One engine to read: where its page is, and the processes behind it when they are on this host."""

    url: str  # http(s) URL, file:// URL or path of a page; "" when only the files are known
    kind: str | None = None  # "vllm" | "sglang"; None until the page says
    name: str = ""
    root_pid: int | None = None
    api_server_pids: tuple[int, ...] = ()  # in server-index order
    engine_pids: tuple[int, ...] = ()  # root and every descendant (API servers, EngineCore, workers)
    api_server_count_cmdline: int | None = None
    multiproc_dir: str | None = None
    cuda_visible_devices: str | None = None
    configured: bool = False
    servers_titled: bool = False  # api_server_pids are processes titled APIServer_<i>
    port_known: bool = False  # the port came from the flags or a listening socket, not the default
    max_num_seqs: int | None = None  # the engine's own batch limit, from its command line
    graph_config: GraphConfig | None = None  # what its command line says about CUDA graphs
    extra: dict[str, str] = field(default_factory=dict)


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
MAX_ERROR_CHARS = 300  # an error text (a parser quotes the bad line) is cut to this
MAX_REQUESTS = 1e7  # running or waiting requests beyond this are no real engine's
MAX_COUNTER = float(2**53)  # beyond this a float counter no longer counts by one
MAX_MULTIPROC_FILES = 4096
VALUE_REASONS = ("nan", "infinite", "negative", "too_large")  # the page_refused reasons of refused values
_REQUEST_GAUGES = frozenset(
    (
        *engine_page.VLLM_RUNNING,
        *engine_page.VLLM_WAITING,
        *engine_page.SGLANG_RUNNING,
        *engine_page.SGLANG_WAITING,
    )
)


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


def bounded(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """Return text cut to a length, marked with an ellipsis when cut."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


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


def refused_tuple(refused: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    """Return the nonzero counts of a read's losses in PAGE_REFUSED_REASONS order."""
    return tuple((r, int(refused[r])) for r in PAGE_REFUSED_REASONS if refused.get(r, 0) > 0)


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


def parse_page(text: str, *, prefilter: bool = True) -> list[Sample]:
    """Parse a metrics page, cut down to the wanted lines first: plain lines by `plain_samples`, else prometheus_client's parser."""
    body = engine_page.prefilter(text) if prefilter else text
    plain = plain_samples(body)
    if plain is not None:
        return plain
    out: list[Sample] = []
    try:
        for fam in text_string_to_metric_families(body):
            out.extend(Sample(s.name, dict(s.labels), float(s.value)) for s in fam.samples)
    except Exception as exc:  # the parser raises ValueError, IndexError, KeyError... on a bad line
        raise PageError(bounded(f"bad page: {type(exc).__name__}: {exc}")) from exc
    return out


def _no_engine_metrics(text: str) -> PageError:
    """Return the error for a page without a sample boundwatch reads, saying what the page does hold."""
    for prefix in ("vllm:", "sglang:"):
        families = {
            line[7:].split(" ", 1)[0]
            for line in text.splitlines()
            if line.startswith(f"# TYPE {prefix}") or line.startswith(f"# HELP {prefix}")
        }
        if families or f"\n{prefix}" in f"\n{text}":
            read = ", ".join(n for n in engine_page.WANTED if n.startswith(prefix))
            return PageError(
                bounded(
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
    kept = engine_page.prefilter(text).split("\n")
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
    kind = engine_page.detect_kind(samples)
    if kind is None:
        if values:
            raise PageError(
                f"every engine sample on the page was refused ({values}: NaN, negative or too large)", lost
            )
        error = _no_engine_metrics(text)
        error.refused.update(lost)
        raise error
    raw = RawPage(_page_samples(samples), multiprocess=engine_page.looks_multiprocess(text))
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


def reading_from_page(
    text: str,
    *,
    name: str = "",
    url: str = "",
    source: str = "http",
    limits: PageLimits = DEFAULT_LIMITS,
) -> EngineReading:
    """Return the normalised reading of one page (raw_from_page, then analysis.engine_page.read_raw), no raw page kept."""
    raw = raw_from_page(text, name=name, url=url, source=source, limits=limits)
    return replace(engine_page.read_raw(raw, limits.max_label_chars), raw=None)


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


def reading_from_bytes(
    data: bytes,
    *,
    name: str = "",
    url: str = "",
    source: str = "http",
    limits: PageLimits = DEFAULT_LIMITS,
) -> EngineReading:
    """Return the normalised reading of a page as read (raw_from_bytes, then read_raw), no raw page kept."""
    raw = raw_from_bytes(data, name=name, url=url, source=source, limits=limits)
    return replace(engine_page.read_raw(raw, limits.max_label_chars), raw=None)


def read_page_file(path: str, limits: PageLimits = DEFAULT_LIMITS) -> bytes:
    """Return at most the byte budget of a page file, plus one byte so a longer page reads as cut."""
    with open(path, "rb") as fh:
        return fh.read(limits.max_bytes + 1)


# What a failed HTTP read raises: PageClient's own errors, the protocol's, a timeout, the socket's.
READ_ERRORS = (PageReadError, http.client.HTTPException, TimeoutError, OSError, ValueError)
# All the HTTP pages of one tick are read in at most this many engine timeouts: the engine
# source's thread gives up after 4 (BlockingReader), so hung engines cannot fail the others' build.
READ_BUDGET_TIMEOUTS = 3


def page_client(url: str, timeout: float, limits: PageLimits = DEFAULT_LIMITS) -> PageClient:
    """Return a client that reads a page over HTTP no further than the byte and line budgets (plus a chunk)."""
    return PageClient(url, timeout, limits.max_bytes, limits.max_lines)


def describe_error(exc: BaseException, timeout: float | None = None) -> str:
    """Return what a failed read means in words: refused, no answer, a bad page, an HTTP status."""
    if isinstance(exc, PageError | PageReadError):
        return bounded(str(exc))
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout:g} s" if timeout else "no answer in time"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (nothing listens on that port)"
    text = str(exc)
    return bounded(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


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


def _scan(data: bytes, start: int, used: int, index: _FileIndex) -> None:
    """Index the wanted keys between start and used (the layout of prometheus_client's MmapedDict)."""
    pos = start
    while pos < used:
        (length,) = _INT.unpack_from(data, pos)
        if length <= 0 or pos + 4 + length > used:
            raise RuntimeError("multiprocess file is corrupt or being written")
        key = data[pos + 4 : pos + 4 + length]
        value_pos = pos + 4 + length + (8 - (length + 4) % 8)
        pos = value_pos + 16
        if not key.startswith((b'["vllm:', b'["sglang:')):
            continue
        parts = key.split(b'"', 4)
        if len(parts) < 5 or parts[3].decode() not in _FILE_WANTED:
            continue
        _, sample, raw_labels, _help = json.loads(key)
        labels = {str(k): str(v) for k, v in raw_labels.items()}
        bucket = sample.endswith("_bucket")
        if bucket:
            labels = {k: v for k, v in labels.items() if k != "le"}
            sample = sample[: -len("_bucket")] + "_count"
        index.entries.append((value_pos, sample, tuple(sorted(labels.items())), bucket))
    index.scanned_to = used


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
        files = sorted(glob.glob(os.path.join(self.path, "*.db")))
        self.truncated = len(files) > MAX_MULTIPROC_FILES
        self.refused = Counter(files=max(0, len(files) - MAX_MULTIPROC_FILES))
        for filename in files[:MAX_MULTIPROC_FILES]:
            seen.add(filename)
            base = os.path.basename(filename)
            typ = base.split("_", 1)[0]
            mode = base.split("_")[1] if typ == "gauge" else ""
            pid = _pid_of(filename)
            try:
                with open(filename, "rb") as fh:
                    head = fh.read(8)
                    if len(head) < 8:
                        continue
                    (used,) = _INT.unpack_from(head, 0)
                    if used > self.limits.max_bytes:
                        self.truncated = True
                        self.refused["bytes"] += 1
                        continue
                    data = head + fh.read(max(0, used - 8))
                index = self._index.get(filename)
                if index is None or used < index.scanned_to:  # new, or replaced by a new process
                    index = self._index[filename] = _FileIndex()
                if used > index.scanned_to:
                    _scan(data, index.scanned_to, used, index)
            except (OSError, RuntimeError, ValueError, AttributeError, TypeError, struct.error):
                self._index.pop(filename, None)
                continue  # a file being created or removed under us
            for value_pos, sample, lkey, bucket in index.entries:
                value, ts = _TWO_DOUBLES.unpack_from(data, value_pos)
                if not 0.0 <= value <= MAX_COUNTER:  # NaN, infinite or negative in one process's file
                    self.refused[refusal(value)] += 1
                    continue
                if bucket and pid.isdigit():
                    per_pid[int(pid)] += value
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
    if not path or not os.path.isdir(path) or not os.access(path, os.R_OK):
        return False
    return bool(glob.glob(os.path.join(path, "*.db")))


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
    found = kind or engine_page.detect_kind(samples)
    if found is None:
        raise PageError(bounded(f"no vllm: or sglang: metrics in {path}"), refused)
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


def reading_from_multiproc(
    path: str | MultiprocReader, *, name: str = "", url: str = "", kind: str | None = None
) -> EngineReading:
    """Return the normalised reading of an engine's multiprocess files (raw_from_multiproc, then read_raw), no raw page kept."""
    raw = raw_from_multiproc(path, name=name, url=url, kind=kind)
    limits = path.limits if isinstance(path, MultiprocReader) else DEFAULT_LIMITS
    return replace(engine_page.read_raw(raw, limits.max_label_chars), raw=None)


# --- discovery ----------------------------------------------------------------------------


def _flag(cmdline: Sequence[str], *names: str) -> str | None:
    """Return the value of a command-line flag (`--x v` or `--x=v`), or None."""
    for i, arg in enumerate(cmdline):
        for name in names:
            if arg == name and i + 1 < len(cmdline):
                return cmdline[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def engine_kind_of(info: procs.ProcInfo) -> str | None:
    """Return "vllm" or "sglang" when a process is an engine's main (serving) process."""
    args = info.cmdline
    for i, arg in enumerate(args):
        base = arg.rsplit("/", 1)[-1]
        if base == "vllm" and i + 1 < len(args) and args[i + 1] == "serve":
            return "vllm"
        if arg == "vllm.entrypoints.openai.api_server" and "-m" in args[:i]:
            return "vllm"
        if arg == "vllm.entrypoints.cli.main" and "-m" in args[:i] and args[i + 1 : i + 2] == ("serve",):
            return "vllm"
        if arg == "sglang.launch_server" or (
            base == "sglang" and i + 1 < len(args) and args[i + 1] == "serve"
        ):
            return "sglang" if "--enable-metrics" in args else None
    return None


def _url_of(kind: str, cmdline: Sequence[str], port: int | None = None) -> tuple[str, int]:
    flag = _flag(cmdline, "--port")
    if port is None:
        port = int(flag) if flag and flag.isdigit() and 0 < int(flag) < 65536 else DEFAULT_PORTS[kind]
    host = _flag(cmdline, "--host") or "127.0.0.1"
    if host in ("0.0.0.0", "::", "", "localhost"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/metrics", port


MAX_CONFIG_BYTES = 1 << 20
_YAML_MAX_NUM_SEQS = re.compile(rb"^\s*max[-_]num[-_]seqs\s*:\s*(\d+)\s*(?:#.*)?$", re.MULTILINE)


def _config_value(proc_root: str, pid: int, path: str) -> str | None:
    """Return max-num-seqs from a vLLM --config YAML file as the process sees it (a flat key only)."""
    where = os.path.join(proc_root, str(pid), "root" if path.startswith("/") else "cwd", path.lstrip("/"))
    try:
        fd = os.open(where, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # never a FIFO or a device
            return None
        data = os.read(fd, MAX_CONFIG_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    found = _YAML_MAX_NUM_SEQS.search(data)
    return found.group(1).decode() if found else None


def batch_limit(proc_root: str, pid: int | None, kind: str, cmdline: Sequence[str]) -> int | None:
    """Return the engine's own batch limit from its command line (vLLM --max-num-seqs, SGLang --max-running-requests).

    vLLM's --config YAML is read for a flat `max-num-seqs` key; when neither says, None (the
    default depends on the version and the hardware, so it is not guessed).
    """
    if kind == "sglang":
        value = _flag(cmdline, "--max-running-requests", "--max_running_requests")
    else:
        value = _flag(cmdline, "--max-num-seqs", "--max_num_seqs")
        config = _flag(cmdline, "--config")
        if value is None and config and pid is not None:
            value = _config_value(proc_root, pid, config)
    if value and value.isdigit() and 0 < int(value) <= 10_000_000:
        return int(value)
    return None


def _listening_port(proc_root: str, kind: str, pids: Iterable[int]) -> int | None:
    """Return the port the engine's processes listen on (the kind's default first), None if none is seen."""
    ports: set[int] = set()
    for pid in pids:
        ports |= procs.listening_ports(proc_root, pid)
    if not ports:
        return None
    return DEFAULT_PORTS[kind] if DEFAULT_PORTS[kind] in ports else min(ports)


@dataclass(frozen=True)
class _Engine:
    """An engine found in the table: its root process and, for unrecognised parents, its API servers."""

    root: int
    kind: str
    servers: tuple[procs.ProcInfo, ...] | None = None  # None: the root's titled descendants
    rooted: bool = True  # the root is the engine's main process (its flags and descendants are the engine's)


def discover(proc_root: str, table: Sequence[procs.ProcInfo] | None = None) -> list[EngineTarget]:
    """Find the engines running on this host, their API servers, processes and multiprocess dirs.

    `table` is the process table when the caller holds one (read now otherwise).
    """
    table = list(procs.processes(proc_root)) if table is None else list(table)
    by_pid = {p.pid: p for p in table}
    roots: dict[int, str] = {}
    for p in table:
        kind = engine_kind_of(p)
        if kind and not (p.ppid in by_pid and engine_kind_of(by_pid[p.ppid]) == kind):
            roots[p.pid] = kind
    found = [_Engine(root, kind) for root, kind in sorted(roots.items())]
    found += _unrecognised(proc_root, table, by_pid, roots)
    return _distinct(proc_root, [_target(proc_root, table, by_pid, e) for e in found])


def _unrecognised(
    proc_root: str, table: Sequence[procs.ProcInfo], by_pid: dict[int, procs.ProcInfo], roots: dict[int, str]
) -> list[_Engine]:
    """Return the engines of API servers whose parent was not recognised (a wrapper script launched vLLM).

    Servers under one parent are one engine when they share a multiprocess dir and a listening
    socket and their indices differ; otherwise (unrelated processes that took the same title)
    each group, or each server, is an engine of its own. A parent that is an init (pid 1) never
    stands for an engine, since every orphan of the host is its child.
    """
    by_parent: dict[int, list[procs.ProcInfo]] = defaultdict(list)
    for p in table:
        if API_SERVER_TITLE.match(p.title) and not any(a.pid in roots for a in _ancestors(by_pid, p.pid)):
            by_parent[p.ppid].append(p)
    out: list[_Engine] = []
    for parent, servers in sorted(by_parent.items()):
        groups: dict[tuple[str, frozenset[int]], list[procs.ProcInfo]] = defaultdict(list)
        for s in servers:
            env = procs.read_environ(proc_root, s.pid).get(MULTIPROC_ENV, "")
            groups[(env, frozenset(procs.listening_sockets(proc_root, s.pid)))].append(s)
        engines: list[list[procs.ProcInfo]] = []
        for group in groups.values():
            indices = [_server_index(s) for s in group]
            engines += [group] if len(set(indices)) == len(indices) else [[s] for s in group]
        if len(engines) == 1 and parent != 1 and parent in by_pid:
            out.append(_Engine(parent, "vllm"))
            continue
        for group in engines:
            group.sort(key=lambda s: (_server_index(s), s.pid))
            out.append(_Engine(min(s.pid for s in group), "vllm", tuple(group), rooted=False))
    return out


def _server_index(info: procs.ProcInfo) -> int:
    match = API_SERVER_TITLE.match(info.title)
    return int(match.group(1)) if match else -1


def _target(
    proc_root: str, table: Sequence[procs.ProcInfo], by_pid: dict[int, procs.ProcInfo], e: _Engine
) -> EngineTarget:
    """Return the target of one engine found in the table."""
    info = by_pid.get(e.root)
    cmdline = info.cmdline if info and e.rooted else ()
    if e.servers is None:
        desc = procs.descendants(table, e.root)
        servers = sorted((_server_index(d), d.pid) for d in desc if API_SERVER_TITLE.match(d.title))
        pids = (e.root, *(d.pid for d in desc))
    else:
        servers = [(_server_index(s), s.pid) for s in e.servers]
        pids = tuple(
            dict.fromkeys(
                p for s in e.servers for p in (s.pid, *(d.pid for d in procs.descendants(table, s.pid)))
            )
        )
    server_set = {pid for _, pid in servers}
    port: int | None = None
    port_known = _flag(cmdline, "--port") is not None
    if not port_known:
        port = _listening_port(proc_root, e.kind, server_set or {e.root})
        port_known = port is not None
    url, port = _url_of(e.kind, cmdline, port)
    asc = _flag(cmdline, "--api-server-count", "-asc")
    mp_dir = cuda = None
    for pid in [*server_set, *pids]:
        env = procs.read_environ(proc_root, pid)
        if mp_dir is None and env.get(MULTIPROC_ENV):
            mp_dir = resolve_in(proc_root, pid, env[MULTIPROC_ENV])
        if cuda is None and pid not in server_set:
            cuda = env.get("CUDA_VISIBLE_DEVICES")
    if servers:
        server_pids: tuple[int, ...] = tuple(pid for _, pid in servers)
    elif e.kind == "sglang" or asc in (None, "1"):
        server_pids = (e.root,)  # the main process serves HTTP itself
    else:  # several API servers without titles (vLLM 0.10): the children holding the listening socket
        server_pids = _socket_holders(proc_root, e.root, list(pids[1:]), port)
    return EngineTarget(
        url=url,
        kind=e.kind,
        name=f"{e.kind}:{port}",
        root_pid=e.root,
        api_server_pids=server_pids,
        engine_pids=pids,
        api_server_count_cmdline=int(asc) if asc and asc.isdigit() else None,
        multiproc_dir=mp_dir,
        cuda_visible_devices=cuda,
        servers_titled=bool(servers),
        port_known=port_known,
        max_num_seqs=batch_limit(proc_root, e.root, e.kind, cmdline),
        graph_config=graph_config(e.kind, cmdline),
    )


def _distinct(proc_root: str, targets: list[EngineTarget]) -> list[EngineTarget]:
    """Give engines that would share a name distinct names, and never let two read the same page.

    Of the engines named alike, the one whose port is known (from its flags or its sockets) and
    that shares the daemon's network namespace keeps the name and the URL; the others are named
    `<name>-2`, `-3`... and read only their multiprocess files, if any.
    """
    here = procs.net_namespace(proc_root, "self")
    by_name: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(targets):
        by_name[t.name].append(i)
    out = list(targets)
    for name, indices in by_name.items():
        if len(indices) == 1:
            continue
        ranked = sorted(
            indices,
            key=lambda i: (
                not targets[i].port_known,
                procs.net_namespace(proc_root, targets[i].root_pid or 0) != here,
                targets[i].root_pid or 0,
            ),
        )
        for k, i in enumerate(ranked[1:], start=2):
            out[i] = replace(
                targets[i],
                name=f"{name}-{k}",
                url="",
                extra={**targets[i].extra, "no_url": f"its port is not known apart from {name}'s"},
            )
    return out


def _socket_holders(proc_root: str, root: int, children: Sequence[int], port: int) -> tuple[int, ...]:
    """Return the children that hold the engine's listening socket (its API servers)."""
    listening = procs.listening_inodes(proc_root, root, port)
    if not listening:
        return ()
    return tuple(pid for pid in sorted(children) if procs.socket_inodes(proc_root, pid) & listening)


def resolve_in(proc_root: str, pid: int, path: str) -> str:
    """Return a path as this process can reach it: as is, or through /proc/<pid>/root (another container)."""
    if multiproc_dir_usable(path):
        return path
    inside = os.path.join(proc_root, str(pid), "root", path.lstrip("/"))
    return inside if multiproc_dir_usable(inside) else path


def _ancestors(by_pid: dict[int, procs.ProcInfo], pid: int) -> list[procs.ProcInfo]:
    out = []
    seen = {pid}
    cur = by_pid.get(pid)
    while cur is not None and cur.ppid not in seen:
        seen.add(cur.ppid)
        cur = by_pid.get(cur.ppid)
        if cur is not None:
            out.append(cur)
    return out


def configured_target(url: str) -> EngineTarget:
    """Return the target for a configured URL or page path."""
    return EngineTarget(url=url, configured=True)


def _port_of(url: str) -> int | None:
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https"):
        return None
    return parsed.port or (443 if parsed.scheme == "https" else 80)


def merge_targets(configured: Iterable[EngineTarget], found: Iterable[EngineTarget]) -> list[EngineTarget]:
    """Join configured URLs with discovered engines on the same port (configured URL wins)."""
    found = list(found)
    out = []
    for c in configured:
        port = _port_of(c.url)
        host = urlparse(c.url).hostname
        local = host in ("127.0.0.1", "localhost", "::1")
        twin = next((f for f in found if local and port is not None and _port_of(f.url) == port), None)
        if twin is not None:
            found.remove(twin)
            out.append(replace(twin, url=c.url, configured=True))
        else:
            out.append(c)
    return out + found


def name_for(target: EngineTarget, kind: str) -> str:
    """Return a stable, bounded engine label: kind:port, or kind:file-stem for pages on disk."""
    if target.name:
        return target.name
    port = _port_of(target.url)
    if port is not None:
        return f"{kind}:{port}"
    stem = Path(urlparse(target.url).path if target.url.startswith("file://") else target.url).stem
    return f"{kind}:{stem[:64]}" if stem else kind


# --- the source -----------------------------------------------------------------------------


def _is_file(url: str) -> bool:
    return url.startswith("file://") or url.startswith("/")


def _file_path(url: str) -> str:
    return urlparse(url).path if url.startswith("file://") else url


def _error_class(error: str) -> str:
    """Return the stable part of an error text (before the first colon), so a varying tail logs once."""
    return error.split(":", 1)[0]


class EngineSource:
    """Read every engine on the host (and the configured ones) once per tick."""

    name = "engine"

    def __init__(
        self,
        cfg: Config,
        *,
        proc_root: str | None = None,
        cgroup_root: str | None = None,
        discover_every: float = DISCOVER_EVERY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg = cfg
        self._clock = clock
        self.proc_root = proc_root or cfg.host.proc_root
        self.cgroup_root = cgroup_root or cfg.host.cgroup_root
        self._discover_every = discover_every
        self._limits = PageLimits.of(cfg.engine)
        self._configured = [configured_target(u) for u in cfg.engine.urls]
        self._targets: list[EngineTarget] = list(self._configured)
        self._discovered_at: float | None = None
        self._cpu = procs.CpuTracker(self.proc_root, hot_every=procs.HOT_LIST_SECONDS)
        self._table = procs.ProcessTable(self.proc_root)
        self._found_targets: list[EngineTarget] | None = None  # what discovery found last
        self._cgroup_paths: dict[int, str] = {}  # pid -> cgroup path, until the table changes
        self._blocking = BlockingReader("engine", max(1.0, cfg.engine.timeout_seconds * 4))
        self._clients: dict[str, PageClient] = {}  # url -> its kept-alive connection (engine thread only)
        self._names: dict[str, str] = {}  # target url -> engine name once its kind is known
        self._readers: dict[str, MultiprocReader] = {}  # multiprocess dir -> its reader (and file index)
        self._said_none = False
        self._found: set[str] = set()  # names of the engines discovery found last time
        self._states: dict[str, str] = {}  # engine name -> "up" or the class of its error
        self._agent_counted: frozenset[str] = frozenset()  # engines the newest Snapshot counted by agent
        # engine name -> (when, the last good page reading): carried between slow reads
        self._pages: dict[str, tuple[float, EngineReading]] = {}
        self.page_reads = 0  # HTTP reads of engine pages started (for tests and benches)

    @property
    def targets(self) -> tuple[EngineTarget, ...]:
        """Return the engines being read."""
        return tuple(self._targets)

    async def read(self) -> tuple[EngineReading, ...]:
        """Return this tick's reading of every engine (a failed engine carries `error`)."""
        if not self.cfg.engine.enabled:
            raise SourceUnavailable("engine source disabled")
        now = self._clock()
        if self.cfg.engine.discover and (
            self._discovered_at is None or now - self._discovered_at >= self._discover_every
        ):
            found = await self._blocking.run(self._rediscover)
            if found is not None:
                self._log_discovery(found)
                self._targets = merge_targets(self._configured, found)
            self._discovered_at = now
        if not self._targets:
            if not self._said_none:
                log.info(
                    "no_engine", detail="no vLLM or SGLang engine found on this host and none configured"
                )
                self._said_none = True
            return ()  # nothing to read is not a failure: the source stays up
        self._said_none = False
        carry = [self._carried(t, now) for t in self._targets]
        readings = await self._blocking.run(lambda: self._build(carry, now))
        self._log_states(readings)
        return readings

    def follow(self, snap: Snapshot) -> None:
        """Note which engines the newest Snapshot served from agent counts: their pages are read rarely."""
        self._agent_counted = frozenset(
            e.name for e in snap.engines if e.counts_source == "agent" and not e.error
        )

    def _name_of(self, target: EngineTarget) -> str:
        return target.name or self._names.get(target.url, "")

    def _carried(self, target: EngineTarget, now: float) -> EngineReading | None:
        """Return the last page reading to carry this tick instead of a read, or None to read the page.

        Only an HTTP page whose engine an agent counts is carried, while its last read (a good
        one) is younger than `engine.slow_read_seconds`.
        """
        if self._use_files(target) or _is_file(target.url) or not target.url:
            return None
        name = self._name_of(target)
        last = self._pages.get(name) if name in self._agent_counted else None
        if last is None or now - last[0] >= self.cfg.engine.slow_read_seconds:
            return None
        return replace(last[1], page_read=False, page_age_seconds=max(0.0, now - last[0]))

    def _rediscover(self) -> list[EngineTarget] | None:
        """Bring the process table up to date and find the engines again when it changed, else None.

        An engine whose port or API servers are not yet known (it has not opened its socket) is
        looked for again at every period until they are.
        """
        changed = self._table.refresh()
        self._cgroup_paths.clear()  # a process moved to another cgroup is seen within a period
        settled = self._found_targets is not None and all(
            t.port_known and t.api_server_pids for t in self._found_targets
        )
        if not changed and settled:
            return None
        self._found_targets = discover(self.proc_root, list(self._table.rows.values()))
        return self._found_targets

    def _log_discovery(self, found: Sequence[EngineTarget]) -> None:
        """Log each engine discovery finds or loses, once."""
        now = {t.name: t for t in found}
        for name in sorted(set(now) - self._found):
            t = now[name]
            log.info(
                "engine_found",
                engine=name,
                url=t.url or None,
                api_servers=len(t.api_server_pids),
                multiproc_dir=t.multiproc_dir,
                max_num_seqs=t.max_num_seqs,
                pid=t.root_pid,
            )
        for name in sorted(self._found - set(now)):
            log.info("engine_lost", engine=name)
        self._found = set(now)

    def _log_states(self, readings: Sequence[EngineReading]) -> None:
        """Log one line per change of an engine's state: up, or down by the class of its error."""
        states = {}
        for r in readings:
            state = "up" if not r.error else _error_class(r.error)
            states[r.name] = state
            before = self._states.get(r.name)
            if state == before:
                continue
            if state == "up":
                log.info("engine_up", engine=r.name, url=r.url or None, read_from=r.source)
            else:
                log.warning("engine_down", engine=r.name, url=r.url or None, error=r.error)
        self._states = states  # an engine no longer read is forgotten (discovery logs it lost)

    def _fetch(self, target: EngineTarget, due: bool, budget_end: float) -> tuple[bytes | None, str, float]:
        """Return (page bytes or None, error, seconds) for a target read over HTTP; files are read later.

        Runs in the engine source's thread, over the target's kept-alive connection.
        """
        if not due or self._use_files(target) or _is_file(target.url) or not target.url:
            return None, "", 0.0
        self.page_reads += 1
        start = time.perf_counter()
        timeout = self.cfg.engine.timeout_seconds
        client = self._clients.get(target.url)
        if client is None:
            client = self._clients[target.url] = page_client(target.url, timeout, self._limits)
        client.timeout = min(timeout, budget_end - time.monotonic())
        try:
            if client.timeout <= 0:
                raise TimeoutError("the other engines' reads took this tick's time")
            data = client.get()
        except READ_ERRORS as exc:
            return None, describe_error(exc, timeout), time.perf_counter() - start
        return data, "", time.perf_counter() - start

    def _use_files(self, target: EngineTarget) -> bool:
        return self.cfg.engine.read_multiproc_files and multiproc_dir_usable(target.multiproc_dir)

    def _build(self, carry: Sequence[EngineReading | None], now: float) -> tuple[EngineReading, ...]:
        """Read and parse pages or read files (or carry a page not due), then add API-server CPU and cgroups.

        Runs off the event loop, in the engine source's thread.
        """
        budget_end = time.monotonic() + READ_BUDGET_TIMEOUTS * self.cfg.engine.timeout_seconds
        pages = [self._fetch(t, c is None, budget_end) for t, c in zip(self._targets, carry, strict=True)]
        read_now = {t.url for t in self._targets}
        for url in [u for u in self._clients if u not in read_now]:
            self._clients.pop(url).close()  # an engine no longer read: its connection goes
        rows = self._table.rows
        cpu = self._cpu.sample(
            info
            for t in self._targets
            for pid in t.api_server_pids
            if (info := rows.get(pid) or procs.proc_info(self.proc_root, pid))
        )
        out = []
        for target, (data, error, seconds), carried in zip(self._targets, pages, carry, strict=True):
            if carried is not None:
                out.append(self._with_processes(target, carried, cpu))
                continue
            reading = self._read_one(target, data, error, seconds)
            reading = self._with_processes(target, reading, cpu)
            if reading.error:
                self._pages.pop(reading.name, None)  # read again next tick
            elif data is not None:
                self._pages[reading.name] = (now, reading)
            out.append(reading)
        names = {r.name for r in out}
        for name in [n for n in self._pages if n not in names]:
            del self._pages[name]
        return tuple(out)

    def _claim(self, target: EngineTarget, kind: str) -> str:
        """Return a configured engine's name: kind:port, made distinct from every other engine's."""
        if target.name:
            return target.name  # discovered: made distinct by discovery
        found = {t.name for t in self._targets if t.name}
        name = self._names.get(target.url)
        if name and name not in found:
            return name
        if name:  # a local engine discovered later takes its kind:port back
            kind = name.split(":", 1)[0]
        base = name_for(target, kind)
        taken = {n for u, n in self._names.items() if u != target.url} | found
        name, k = base, 2
        while name in taken:
            name, k = f"{base}-{k}", k + 1
        if kind != "unknown":
            self._names[target.url] = name
        return name

    def _read_one(
        self, target: EngineTarget, data: bytes | None, error: str, seconds: float
    ) -> EngineReading:
        kind = target.kind or "unknown"
        name = target.name or (self._claim(target, kind) if target.url in self._names else "")
        start = time.perf_counter()
        limits = self._limits
        try:
            if self._use_files(target):
                assert target.multiproc_dir is not None
                reader = self._readers.get(target.multiproc_dir)
                if reader is None:
                    reader = self._readers[target.multiproc_dir] = MultiprocReader(
                        target.multiproc_dir, limits
                    )
                reading = raw_from_multiproc(reader, name=name, url=target.url, kind=target.kind)
            elif _is_file(target.url):
                page = read_page_file(_file_path(target.url), limits)
                reading = raw_from_bytes(page, name=name, url=target.url, source="file", limits=limits)
            elif data is not None:
                reading = raw_from_bytes(data, name=name, url=target.url, limits=limits)
            else:
                reason = error or target.extra.get("no_url") or "no page"
                name = name or self._claim(target, kind)
                return EngineReading(name=name, kind=kind, url=target.url, error=reason)
        except Exception as exc:  # one engine's bad page must not hide the others
            name = name or self._claim(target, kind)
            lost = refused_tuple(exc.refused) if isinstance(exc, PageError) else ()
            return EngineReading(
                name=name, kind=kind, url=target.url, error=describe_error(exc), page_refused=lost
            )
        if not name:
            reading = replace(reading, name=self._claim(target, reading.kind))
        return replace(reading, scrape_seconds=seconds + time.perf_counter() - start)

    def _with_processes(
        self, target: EngineTarget, reading: EngineReading, cpu: dict[int, ProcessCpu]
    ) -> EngineReading:
        """Add API-server CPU, the API-server count, the batch limit and the engine's cgroups to a reading."""
        if target.root_pid is None:
            return reading
        servers = tuple(cpu[pid] for pid in target.api_server_pids if pid in cpu)
        known: tuple[int, str] | None = None
        if target.servers_titled:
            known = (len(target.api_server_pids), "processes")
        elif target.api_server_count_cmdline:
            known = (target.api_server_count_cmdline, "cmdline")
        lone = target.api_server_pids == (target.root_pid,)
        count, how = reading.api_server_count, reading.api_server_count_source
        if reading.raw is not None:  # the page's own count is known once analysis normalises it
            reading = replace(reading, raw=replace(reading.raw, servers=known, lone_server=lone))
        elif known is not None:
            count, how = known
        elif count is None and lone:
            count, how = 1, "processes"
        cgroups: dict[str, CgroupCpu] = {}
        now = time.monotonic()
        # The API servers' and the main process's cgroups are read every tick: a quota applied by
        # moving them shows at once (issue 9's lab: 4-5 s of ticks without cpu_quota_throttled when
        # they were read once per discovery period); the other processes' once per period.
        fresh = {*target.api_server_pids, target.root_pid}
        for pid in fresh:
            self._cgroup_paths.pop(pid, None)
        for pid in dict.fromkeys((*target.engine_pids, *target.api_server_pids)):
            path = self._cgroup_of(pid)
            if path not in cgroups:
                cg = read_cgroup_cpu(self.cgroup_root, path, now=now)
                if cg is not None:
                    cgroups[path] = cg
        servers = tuple(replace(s, cgroup=self._cgroup_of(s.pid)) for s in servers)
        return replace(
            reading,
            api_servers=servers,
            api_server_count=count,
            api_server_count_source=how,
            cgroups=tuple(cgroups.values()),
            pids=target.engine_pids,
            cuda_visible_devices=target.cuda_visible_devices,
            max_num_seqs=target.max_num_seqs if target.max_num_seqs is not None else reading.max_num_seqs,
            graph_config=target.graph_config,
            placements=placement.placements(self.proc_root, target.engine_pids, self._table.rows),
        )

    def _cgroup_of(self, pid: int) -> str:
        """Return a process's cgroup path, read once per discovery period (or per tick, once dropped)."""
        path = self._cgroup_paths.get(pid)
        if path is None:
            path = self._cgroup_paths[pid] = cgroup_path_of(self.proc_root, pid)
        return path

    def close(self) -> None:
        """Close the engines' connections and the reader thread."""
        self._blocking.close()
        clients, self._clients = self._clients, {}
        for client in clients.values():
            client.close()

    async def aclose(self) -> None:
        """Close the engines' connections and the reader thread."""
        self.close()


async def read_once(
    url_or_path: str, timeout: float = 2.0, limits: PageLimits = DEFAULT_LIMITS
) -> EngineReading:
    """Read one page (URL, file:// URL or path) or multiprocess dir once and return its reading.

    Raises PageError with what went wrong in words (refused, no answer, not an engine's page).
    """
    if not url_or_path.startswith(("http://", "https://", "file://")):
        url_or_path = os.path.abspath(url_or_path)  # a page or a dir given by a relative path
    target = configured_target(url_or_path)
    if os.path.isdir(_file_path(url_or_path)):
        reading = reading_from_multiproc(MultiprocReader(_file_path(url_or_path), limits), url=url_or_path)
        return replace(reading, name=name_for(target, reading.kind))
    if _is_file(url_or_path):
        try:
            page = read_page_file(_file_path(url_or_path), limits)
        except OSError as exc:
            raise PageError(f"cannot read {_file_path(url_or_path)}: {exc.strerror or exc}") from exc
        reading = reading_from_bytes(page, url=url_or_path, source="file", limits=limits)
        return replace(reading, name=name_for(target, reading.kind))
    start = time.perf_counter()
    client = page_client(url_or_path, timeout, limits)
    try:
        data = await asyncio.to_thread(client.get)
    except READ_ERRORS as exc:
        raise PageError(describe_error(exc, timeout)) from exc
    finally:
        client.close()
    reading = reading_from_bytes(data, url=url_or_path, limits=limits)
    return replace(reading, name=name_for(target, reading.kind), scrape_seconds=time.perf_counter() - start)
