"""The engine source: find vLLM and SGLang engines on the host and read their scheduler state every tick.

Per engine and tick it reads the metrics page over HTTP (aiohttp), a page from a file, or, when
the engine runs in prometheus multiprocess mode on this host, its PROMETHEUS_MULTIPROC_DIR files
directly (no request to the serving process, and per-API-server histogram counts); then the CPU
of each API-server process and its busiest thread, and the cgroups of the engine's processes.
Discovery scans the process table every `DISCOVER_EVERY_SECONDS`; CPU is sampled every tick.
"""

from __future__ import annotations

import asyncio
import glob
import json
import os
import re
import struct
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlparse

import aiohttp
import structlog
from prometheus_client.parser import text_string_to_metric_families

from exporter.analysis import dedup, engine_page
from exporter.analysis.engine import window_acceptance
from exporter.config import Config
from exporter.snapshot.engine import EngineReading
from exporter.snapshot.host import CgroupCpu, ProcessCpu
from exporter.sources import procs
from exporter.sources.base import BlockingReader, SourceUnavailable
from exporter.sources.cgroup import cgroup_path_of, read_cgroup_cpu

log = structlog.get_logger("boundwatch.engine")

DISCOVER_EVERY_SECONDS = 5.0
SPEC_WINDOW_SECONDS = 10.0
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
    extra: dict[str, str] = field(default_factory=dict)


# --- pages --------------------------------------------------------------------------------


def parse_page(text: str, *, prefilter: bool = True) -> list[Sample]:
    """Parse a metrics page with prometheus_client's parser, cut down to the wanted lines first."""
    body = engine_page.prefilter(text) if prefilter else text
    out: list[Sample] = []
    for fam in text_string_to_metric_families(body):
        out.extend(Sample(s.name, dict(s.labels), float(s.value)) for s in fam.samples)
    return out


def reading_from_page(text: str, *, name: str = "", url: str = "", source: str = "http") -> EngineReading:
    """Return the normalised reading of one page (steps filled in for what the page alone says)."""
    samples = parse_page(text)
    if engine_page.detect_kind(samples) is None:
        raise ValueError("no vllm: or sglang: metrics on the page")
    reading = engine_page.normalise(
        samples, name=name, url=url, source=source, multiprocess=engine_page.looks_multiprocess(text)
    )
    return replace(reading, steps=dedup.step_count(reading))


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
        _, sample, labels, _help = json.loads(key)
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

    def __init__(self, path: str) -> None:
        self.path = path
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
        for filename in sorted(glob.glob(os.path.join(self.path, "*.db"))):
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
                    data = head + fh.read(max(0, used - 8))
                index = self._index.get(filename)
                if index is None or used < index.scanned_to:  # new, or replaced by a new process
                    index = self._index[filename] = _FileIndex()
                if used > index.scanned_to:
                    _scan(data, index.scanned_to, used, index)
            except (OSError, RuntimeError, ValueError, struct.error):
                self._index.pop(filename, None)
                continue  # a file being created or removed under us
            for value_pos, sample, lkey, bucket in index.entries:
                value, ts = _TWO_DOUBLES.unpack_from(data, value_pos)
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


def reading_from_multiproc(
    path: str | MultiprocReader, *, name: str = "", url: str = "", kind: str | None = None
) -> EngineReading:
    """Return the normalised reading of an engine's multiprocess files (a reader keeps its index)."""
    reader = path if isinstance(path, MultiprocReader) else MultiprocReader(path)
    path = reader.path
    samples, per_pid = reader.read()
    if engine_page.detect_kind(samples) is None and kind is None:
        raise ValueError(f"no vllm: or sglang: metrics in {path}")
    reading = engine_page.normalise(
        samples, name=name, url=url, source="multiproc_files", multiprocess=True, kind=kind
    )
    reading = replace(reading, iteration_count_by_pid=per_pid if reading.kind == "vllm" else ())
    if reading.kind == "vllm" and reading.api_server_count is None and per_pid:
        reading = replace(reading, api_server_count=len(per_pid), api_server_count_source="multiproc_files")
    return replace(reading, steps=dedup.step_count(reading))


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


def _url_of(kind: str, cmdline: Sequence[str]) -> tuple[str, int]:
    flag = _flag(cmdline, "--port")
    port = int(flag) if flag and flag.isdigit() else DEFAULT_PORTS[kind]
    host = _flag(cmdline, "--host") or "127.0.0.1"
    if host in ("0.0.0.0", "::", "", "localhost"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/metrics", port


def discover(proc_root: str) -> list[EngineTarget]:
    """Find the engines running on this host, their API servers, processes and multiprocess dirs."""
    table = list(procs.processes(proc_root))
    by_pid = {p.pid: p for p in table}
    roots: dict[int, str] = {}
    for p in table:
        kind = engine_kind_of(p)
        if kind and not (p.ppid in by_pid and engine_kind_of(by_pid[p.ppid]) == kind):
            roots[p.pid] = kind
    # API servers whose parent was not recognised (a wrapper script launched vLLM): the parent is the root.
    for p in table:
        if API_SERVER_TITLE.match(p.title) and not any(a.pid in roots for a in _ancestors(by_pid, p.pid)):
            roots.setdefault(p.ppid, "vllm")
    targets = []
    for root, kind in sorted(roots.items()):
        info = by_pid.get(root)
        cmdline = info.cmdline if info else ()
        url, port = _url_of(kind, cmdline)
        desc = procs.descendants(table, root)
        servers = sorted(
            ((int(m.group(1)), d.pid) for d in desc if (m := API_SERVER_TITLE.match(d.title))),
        )
        asc = _flag(cmdline, "--api-server-count", "-asc")
        mp_dir = cuda = None
        server_set = {pid for _, pid in servers}
        for pid in [*server_set, *(d.pid for d in desc), root]:
            env = procs.read_environ(proc_root, pid)
            if mp_dir is None and env.get(MULTIPROC_ENV):
                mp_dir = resolve_in(proc_root, pid, env[MULTIPROC_ENV])
            if cuda is None and pid not in server_set:
                cuda = env.get("CUDA_VISIBLE_DEVICES")
        if servers:
            server_pids: tuple[int, ...] = tuple(pid for _, pid in servers)
        elif kind == "sglang" or asc in (None, "1"):
            server_pids = (root,)  # the main process serves HTTP itself
        else:  # several API servers without titles (vLLM 0.10): the children holding the listening socket
            server_pids = _socket_holders(proc_root, root, [d.pid for d in desc], port)
        targets.append(
            EngineTarget(
                url=url,
                kind=kind,
                name=f"{kind}:{port}",
                root_pid=root,
                api_server_pids=server_pids,
                engine_pids=(root, *(d.pid for d in desc)),
                api_server_count_cmdline=int(asc) if asc and asc.isdigit() else None,
                multiproc_dir=mp_dir,
                cuda_visible_devices=cuda,
            )
        )
    return targets


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
    return f"{kind}:{stem}" if stem else kind


# --- the source -----------------------------------------------------------------------------


def _is_file(url: str) -> bool:
    return url.startswith("file://") or url.startswith("/")


def _file_path(url: str) -> str:
    return urlparse(url).path if url.startswith("file://") else url


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
    ) -> None:
        self.cfg = cfg
        self.proc_root = proc_root or cfg.host.proc_root
        self.cgroup_root = cgroup_root or cfg.host.cgroup_root
        self._discover_every = discover_every
        self._configured = [configured_target(u) for u in cfg.engine.urls]
        self._targets: list[EngineTarget] = list(self._configured)
        self._discovered_at: float | None = None
        self._cpu = procs.CpuTracker(self.proc_root)
        self._blocking = BlockingReader("engine", max(1.0, cfg.engine.timeout_seconds * 4))
        self._session: aiohttp.ClientSession | None = None
        self._names: dict[str, str] = {}  # target url -> engine name once its kind is known
        self._closing: asyncio.Task[None] | None = None
        self._readers: dict[str, MultiprocReader] = {}  # multiprocess dir -> its reader (and file index)
        self._spec: dict[str, deque[tuple[float, float | None, float | None]]] = {}
        self._said_none = False

    @property
    def targets(self) -> tuple[EngineTarget, ...]:
        """Return the engines being read."""
        return tuple(self._targets)

    async def read(self) -> tuple[EngineReading, ...]:
        """Return this tick's reading of every engine (a failed engine carries `error`)."""
        if not self.cfg.engine.enabled:
            raise SourceUnavailable("engine source disabled")
        now = time.monotonic()
        if self.cfg.engine.discover and (
            self._discovered_at is None or now - self._discovered_at >= self._discover_every
        ):
            found = await self._blocking.run(lambda: discover(self.proc_root))
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
        pages = await asyncio.gather(*(self._fetch(t) for t in self._targets))
        return await self._blocking.run(lambda: self._build(pages))

    async def _fetch(self, target: EngineTarget) -> tuple[str | None, str, float]:
        """Return (page text or None, error, seconds) for a target read over HTTP; files are read later."""
        if self._use_files(target) or _is_file(target.url) or not target.url:
            return None, "", 0.0
        start = time.perf_counter()
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.cfg.engine.timeout_seconds)
            )
        try:
            async with self._session.get(target.url) as resp:
                if resp.status != 200:
                    return None, f"HTTP {resp.status}", time.perf_counter() - start
                text = await resp.text()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            return (
                None,
                f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__,
                time.perf_counter() - start,
            )
        return text, "", time.perf_counter() - start

    def _use_files(self, target: EngineTarget) -> bool:
        return self.cfg.engine.read_multiproc_files and multiproc_dir_usable(target.multiproc_dir)

    def _build(self, pages: Sequence[tuple[str | None, str, float]]) -> tuple[EngineReading, ...]:
        """Parse pages or read files, then add API-server CPU and cgroups (runs off the event loop)."""
        cpu = self._cpu.sample(
            info
            for t in self._targets
            for pid in t.api_server_pids
            if (info := procs.proc_info(self.proc_root, pid))
        )
        out = []
        for target, (text, error, seconds) in zip(self._targets, pages, strict=True):
            reading = self._read_one(target, text, error, seconds)
            reading = self._with_processes(target, reading, cpu)
            out.append(self._with_acceptance(reading))
        return tuple(out)

    def _with_acceptance(self, reading: EngineReading) -> EngineReading:
        """Fill the spec-decode acceptance over the last SPEC_WINDOW_SECONDS from the counters."""
        if reading.error or reading.spec_acceptance is not None or reading.spec_draft_tokens_total is None:
            return reading
        now = time.monotonic()
        hist = self._spec.setdefault(reading.name, deque())
        hist.append((now, reading.spec_accepted_tokens_total, reading.spec_draft_tokens_total))
        while len(hist) > 2 and now - hist[1][0] >= SPEC_WINDOW_SECONDS:
            hist.popleft()
        return replace(reading, spec_acceptance=window_acceptance(hist))

    def _read_one(self, target: EngineTarget, text: str | None, error: str, seconds: float) -> EngineReading:
        kind = target.kind or "unknown"
        name = self._names.get(target.url) or (name_for(target, kind) if target.kind else "")
        start = time.perf_counter()
        try:
            if self._use_files(target):
                assert target.multiproc_dir is not None
                reader = self._readers.get(target.multiproc_dir)
                if reader is None:
                    reader = self._readers[target.multiproc_dir] = MultiprocReader(target.multiproc_dir)
                reading = reading_from_multiproc(reader, name=name, url=target.url, kind=target.kind)
            elif _is_file(target.url):
                page = Path(_file_path(target.url)).read_text()
                reading = reading_from_page(page, name=name, url=target.url, source="file")
            elif text is not None:
                reading = reading_from_page(text, name=name, url=target.url)
            else:
                return EngineReading(
                    name=name or name_for(target, kind), kind=kind, url=target.url, error=error or "no page"
                )
        except Exception as exc:  # one engine's bad page must not hide the others
            return EngineReading(
                name=name or name_for(target, kind),
                kind=kind,
                url=target.url,
                error=f"{type(exc).__name__}: {exc}",
            )
        if not name:
            name = name_for(target, reading.kind)
            self._names[target.url] = name
            reading = replace(reading, name=name)
        return replace(reading, scrape_seconds=seconds + time.perf_counter() - start)

    def _with_processes(
        self, target: EngineTarget, reading: EngineReading, cpu: dict[int, ProcessCpu]
    ) -> EngineReading:
        """Add API-server CPU, the API-server count and the engine's cgroups to a reading."""
        if target.root_pid is None:
            return reading
        servers = tuple(cpu[pid] for pid in target.api_server_pids if pid in cpu)
        titled = sum(1 for pid in target.api_server_pids if pid != target.root_pid)
        count, how = reading.api_server_count, reading.api_server_count_source
        if titled:
            count, how = titled, "processes"
        elif target.api_server_count_cmdline:
            count, how = target.api_server_count_cmdline, "cmdline"
        elif count is None and target.api_server_pids == (target.root_pid,):
            count, how = 1, "processes"
        cgroups: dict[str, CgroupCpu] = {}
        for pid in target.engine_pids:
            path = cgroup_path_of(self.proc_root, pid)
            if path not in cgroups:
                cg = read_cgroup_cpu(self.cgroup_root, path)
                if cg is not None:
                    cgroups[path] = cg
        servers = tuple(replace(s, cgroup=cgroup_path_of(self.proc_root, s.pid)) for s in servers)
        reading = replace(
            reading,
            api_servers=servers,
            api_server_count=count,
            api_server_count_source=how,
            cgroups=tuple(cgroups.values()),
            pids=target.engine_pids,
            cuda_visible_devices=target.cuda_visible_devices,
        )
        return replace(reading, steps=dedup.step_count(reading))

    def close(self) -> None:
        """Close the HTTP session and the reader thread."""
        self._blocking.close()
        if self._session is not None and not self._session.closed:
            session, self._session = self._session, None
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
            if loop is not None:
                self._closing = loop.create_task(session.close())

    async def aclose(self) -> None:
        """Close the HTTP session (await it) and the reader thread."""
        if self._session is not None:
            await self._session.close()
            self._session = None
        self._blocking.close()


async def read_once(url_or_path: str, timeout: float = 2.0) -> EngineReading:
    """Read one page (URL, file:// URL or path) or multiprocess dir once and return its reading."""
    if not url_or_path.startswith(("http://", "https://", "file://")):
        url_or_path = os.path.abspath(url_or_path)  # a page or a dir given by a relative path
    target = configured_target(url_or_path)
    if os.path.isdir(_file_path(url_or_path)):
        reading = reading_from_multiproc(_file_path(url_or_path), url=url_or_path)
        return replace(reading, name=name_for(target, reading.kind))
    if _is_file(url_or_path):
        page = Path(_file_path(url_or_path)).read_text()
        reading = reading_from_page(page, url=url_or_path, source="file")
        return replace(reading, name=name_for(target, reading.kind))
    start = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        async with session.get(url_or_path) as resp:
            if resp.status != 200:
                raise OSError(f"{url_or_path}: HTTP {resp.status}")
            text = await resp.text()
    reading = reading_from_page(text, url=url_or_path)
    return replace(reading, name=name_for(target, reading.kind), scrape_seconds=time.perf_counter() - start)
