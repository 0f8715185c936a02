"""The engine source: find vLLM and SGLang engines on the host and read their scheduler state every tick.

Per engine and tick it reads the metrics page over HTTP (one kept-alive connection per engine,
read on the source's own thread: engine_http.py), a page from a file, or, when
the engine runs in prometheus multiprocess mode on this host, its PROMETHEUS_MULTIPROC_DIR files
directly (no request to the serving process, and per-API-server histogram counts); then the CPU
of each API-server process and its busiest thread, and the cgroups of the engine's processes.
The page is cut, parsed and bounded in engine_scrape.py; the engines are found in engine_discovery.py.
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
cost the engine nothing) every tick reads. A page whose connection is refused (nothing listens
on its port: an engine loading or gone, or a process that only looks like one) is read again at
the next tick, then after 1, 2 and 4 s, then every `REFUSED_BACKOFF_MAX_SECONDS`, until it
answers (32 look-alike processes: the daemon 1.80% of a core read at every tick, 1.25% with the
back-off; bench/down_engines.py). A read that times out or answers badly is read again at the
next tick, as before: an API server too busy to answer is the seed's signature, not an engine
that is gone.

One engine's bad page never hides the others: what its read lost is counted in its reading
(`page_refused`), and a read that fails is that engine's error reading. Each engine's change
of state, and each engine found or lost, is logged once.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Sequence
from urllib.parse import urlparse

import structlog

from exporter.config import Config
from exporter.snapshot import Snapshot
from exporter.snapshot.engine import EngineReading, Placement, refused_tuple
from exporter.snapshot.frozen import replace
from exporter.snapshot.host import CgroupCpu, ProcessCpu
from exporter.sources import placement, procs
from exporter.sources.base import BlockingReader, SourceUnavailable
from exporter.sources.cgroup import cgroup_path_of, cgroup_version, read_cgroup_cpu
from exporter.sources.engine_discovery import (
    EngineTarget,
    configured_target,
    find_engines,
    merge_targets,
    name_for,
)
from exporter.sources.engine_scrape import (
    DEFAULT_LIMITS,
    READ_ERRORS,
    EnginePageClient,
    MultiprocReader,
    PageError,
    PageLimits,
    describe_error,
    multiproc_dir_usable,
    page_client,
    raw_from_bytes,
    raw_from_multiproc,
    read_page_file,
)
from exporter.sources.pseudofiles import KeptFiles

log = structlog.get_logger("boundwatch.engine")

DISCOVER_EVERY_SECONDS = 5.0
MAX_PLACED = 64  # engines whose placements are kept for one process table (more are worked out each tick)
MAX_CGROUPS = 16  # cgroups read an engine each tick (each is read, and labels series); the rest are counted
# All the HTTP pages of one tick are read in at most this many engine timeouts: the engine
# source's thread gives up after 4 (BlockingReader), so hung engines cannot fail the others' build.
READ_BUDGET_TIMEOUTS = 3
REFUSED_BACKOFF_MAX_SECONDS = 4.0  # the longest wait between reads of a page whose connection is refused


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
    reads_in_thread = True  # its reads run in its reader's thread: the Sampler may start a tick's read ahead

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
        # the /proc and cgroup files read each tick, kept open (engine thread only; closed by it)
        self._files = KeptFiles()
        self._cpu = procs.CpuTracker(self.proc_root, hot_every=procs.HOT_LIST_SECONDS, files=self._files)
        self._table = procs.ProcessTable(self.proc_root)
        self._found_targets: list[EngineTarget] | None = None  # what discovery found last
        self._cgroup_paths: dict[int, str] = {}  # pid -> cgroup path, until the table changes
        # engine pids -> their placements, made from the process table's rows `_placed_from` (a new dict
        # at each refresh, which empties this): worked out once a discovery period, not each tick
        self._placed: dict[tuple[int, ...], tuple[Placement, ...]] = {}
        self._placed_from: object = None
        self._cgroup_version: tuple[float, int] | None = None  # (looked at, v1 or v2), once a period
        self._blocking = BlockingReader(
            "engine", max(1.0, cfg.engine.timeout_seconds * 4), on_exit=self._files.close
        )
        # url -> its kept-alive connection (engine thread only)
        self._clients: dict[str, EnginePageClient] = {}
        self._names: dict[str, str] = {}  # target url -> engine name once its kind is known
        self._readers: dict[str, MultiprocReader] = {}  # multiprocess dir -> its reader (and file index)
        self._said_none = False
        self._found: set[str] = set()  # names of the engines discovery found last time
        self._states: dict[str, str] = {}  # engine name -> "up" or the class of its error
        self._agent_counted: frozenset[str] = frozenset()  # engines the newest Snapshot counted by agent
        # engine name -> (when, the last good page reading): carried between slow reads
        self._pages: dict[str, tuple[float, EngineReading]] = {}
        # url -> (refusals in a row, when it is read again, the refusal in words, the read's seconds):
        # the pages nothing serves, read again after a back-off
        self._refused: dict[str, tuple[int, float, str, float]] = {}
        self.page_reads = 0  # HTTP reads of engine pages started (for tests and benches)
        self._unread_engines = 0  # engines the last discovery found beyond its bound
        self._unread_cgroups = 0  # the engines' cgroups past MAX_CGROUPS at the last build
        self._build_unread = 0  # the same, counted during a build (engine thread only)

    @property
    def over_bound(self) -> int:
        """Return what the last reads left unread past their bounds: engines, their API servers, processes, cgroups."""
        return self._unread_engines + sum(t.over_bound for t in self._targets) + self._unread_cgroups

    @property
    def targets(self) -> tuple[EngineTarget, ...]:
        """Return the engines being read."""
        return tuple(self._targets)

    async def read(self) -> tuple[EngineReading, ...]:
        """Return this tick's reading of every engine (a failed engine carries `error`)."""
        if not self.cfg.engine.enabled:
            raise SourceUnavailable("engine source disabled")
        now = self._clock()
        if self._discovery_due(now):
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
        readings = await self._blocking.run(self._build_job(now))
        self._log_states(readings)
        return readings

    def start_read(self) -> asyncio.Future[tuple[EngineReading, ...]]:
        """Start this tick's read and return its future: one call in the source's thread (the Sampler's way).

        A tick that looks for engines again, or has none to read, runs `read()` in a task instead.
        """
        now = self._clock()
        if not self.cfg.engine.enabled or self._discovery_due(now) or not self._targets:
            return asyncio.ensure_future(self.read())
        self._said_none = False
        future = self._blocking.submit(self._build_job(now))
        future.add_done_callback(self._built)  # logs each engine's change of state, before the tick goes on
        return future

    def _discovery_due(self, now: float) -> bool:
        return self.cfg.engine.discover and (
            self._discovered_at is None or now - self._discovered_at >= self._discover_every
        )

    def _build_job(self, now: float) -> Callable[[], tuple[EngineReading, ...]]:
        """Return this tick's build for the source's thread, with the page readings to carry decided now."""
        carry = [self._carried(t, now) for t in self._targets]
        return lambda: self._build(carry, now)

    def _built(self, future: asyncio.Future[tuple[EngineReading, ...]]) -> None:
        if not future.cancelled() and future.exception() is None:
            self._log_states(future.result())

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
        self._found_targets, unread = find_engines(self.proc_root, list(self._table.rows.values()))
        if unread and unread != self._unread_engines:
            log.warning(
                "engines_over_bound",
                unread=unread,
                read=len(self._found_targets),
                detail="processes that look like engines beyond the bound: those started last are not read",
            )
        self._unread_engines = unread  # an int: one store, read on the loop by `over_bound`
        for t in self._found_targets:
            if t.over_bound and t.name not in self._found:
                log.warning("engine_over_bound", engine=t.name, unread=t.over_bound)
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

    def _fetch(
        self, target: EngineTarget, due: bool, budget_end: float, now: float
    ) -> tuple[bytes | None, str, float]:
        """Return (page bytes or None, error, seconds) for a target read over HTTP; files are read later.

        Runs in the engine source's thread, over the target's kept-alive connection. A page whose
        connection was refused is not read again before its back-off ends: its last refusal stands.
        """
        if not due or self._use_files(target) or _is_file(target.url) or not target.url:
            return None, "", 0.0
        refused = self._refused.get(target.url)
        if refused is not None and now < refused[1]:
            return None, refused[2], refused[3]  # the last read's refusal and time stand
        self.page_reads += 1
        start = time.perf_counter()
        timeout = self.cfg.engine.timeout_seconds
        client = self._clients.get(target.url)
        if client is None:
            client = self._clients[target.url] = page_client(
                target.url, timeout, self._limits, self.cfg.engine.page_filter, target.kind or ""
            )
        client.timeout = min(timeout, budget_end - time.monotonic())
        off = client.filter_off
        try:
            if client.timeout <= 0:
                raise TimeoutError("the other engines' reads took this tick's time")
            data = client.get()
        except READ_ERRORS as exc:
            error, seconds = describe_error(exc, timeout), time.perf_counter() - start
            if _refused(exc):
                n = refused[0] + 1 if refused is not None else 1
                # the next tick reads it again once; then 1, 2, 4 s later (half a tick early: a tick's jitter)
                wait = min(REFUSED_BACKOFF_MAX_SECONDS, 2.0 ** (n - 2)) if n > 1 else 0.0
                self._refused[target.url] = (n, now + wait - self.cfg.tick_seconds / 2, error, seconds)
            else:
                self._refused.pop(target.url, None)
            return None, error, seconds
        finally:
            if client.filter_off != off:
                log.info("engine_page_read_whole", url=target.url, reason=client.filter_off)
        self._refused.pop(target.url, None)
        return data, "", time.perf_counter() - start

    def _use_files(self, target: EngineTarget) -> bool:
        return self.cfg.engine.read_multiproc_files and multiproc_dir_usable(target.multiproc_dir)

    def _build(self, carry: Sequence[EngineReading | None], now: float) -> tuple[EngineReading, ...]:
        """Read and parse pages or read files (or carry a page not due), then add API-server CPU and cgroups.

        Runs off the event loop, in the engine source's thread.
        """
        budget_end = time.monotonic() + READ_BUDGET_TIMEOUTS * self.cfg.engine.timeout_seconds
        pages = [
            self._fetch(t, c is None, budget_end, now) for t, c in zip(self._targets, carry, strict=True)
        ]
        read_now = {t.url for t in self._targets}
        for url in [u for u in self._clients if u not in read_now]:
            self._clients.pop(url).close()  # an engine no longer read: its connection goes
        for url in [u for u in self._refused if u not in read_now]:
            del self._refused[url]
        rows = self._table.rows
        cpu = self._cpu.sample(
            info
            for t in self._targets
            for pid in t.api_server_pids
            if (info := rows.get(pid) or procs.proc_info(self.proc_root, pid))
        )
        out = []
        self._build_unread = 0
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
        self._files.sweep()  # the files of processes, threads and cgroups no longer read are closed
        self._unread_cgroups = self._build_unread  # an int: one store, read on the loop by `over_bound`
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
        unread: set[str] = set()
        for pid in dict.fromkeys((target.root_pid, *target.api_server_pids, *target.engine_pids)):
            path = self._cgroup_of(pid)
            if path in cgroups:
                continue
            if len(cgroups) >= MAX_CGROUPS:
                unread.add(path)
            else:
                version = self._cgroup_version_at(now)
                cg = read_cgroup_cpu(self.cgroup_root, path, version, now=now, files=self._files)
                if cg is not None:
                    cgroups[path] = cg
        self._build_unread += len(unread)
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
            placements=self._placements(target.engine_pids),
        )

    def _placements(self, pids: tuple[int, ...]) -> tuple[Placement, ...]:
        """Return where an engine's processes run, worked out again only when the process table changed.

        Placements read the table's rows alone (titles, parents, the environment at exec) while every
        pid is in it; a pid not yet in it is read now, each tick, until the table has it.
        """
        rows = self._table.rows
        if rows is not self._placed_from:  # a new table: what was made from the last one goes
            self._placed, self._placed_from = {}, rows
        got = self._placed.get(pids)
        if got is None:
            got = placement.placements(self.proc_root, pids, rows)
            if len(self._placed) < MAX_PLACED and all(
                pid in rows for pid in pids[: placement.MAX_PLACEMENTS]
            ):
                self._placed[pids] = got
        return got

    def _cgroup_version_at(self, now: float) -> int:
        """Return whether the cgroup tree is v1 or v2, looked at once per discovery period."""
        if self._cgroup_version is None or now - self._cgroup_version[0] >= self._discover_every:
            self._cgroup_version = (now, cgroup_version(self.cgroup_root))
        return self._cgroup_version[1]

    def _cgroup_of(self, pid: int) -> str:
        """Return a process's cgroup path, read once per discovery period (or per tick, once dropped)."""
        path = self._cgroup_paths.get(pid)
        if path is None:
            path = self._cgroup_paths[pid] = cgroup_path_of(self.proc_root, pid, self._files)
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
    """Read one page (URL, file:// URL or path) or multiprocess dir once and return its raw reading.

    The reading holds the page raw, as a tick's does; `analysis.engine_page.normalise_once` gives
    its figures (what `boundwatch inspect` shows). Raises PageError with what went wrong in words
    (refused, no answer, not an engine's page).
    """
    if not url_or_path.startswith(("http://", "https://", "file://")):
        url_or_path = os.path.abspath(url_or_path)  # a page or a dir given by a relative path
    target = configured_target(url_or_path)
    if os.path.isdir(_file_path(url_or_path)):
        reading = raw_from_multiproc(MultiprocReader(_file_path(url_or_path), limits), url=url_or_path)
        return replace(reading, name=name_for(target, reading.kind))
    if _is_file(url_or_path):
        try:
            page = read_page_file(_file_path(url_or_path), limits)
        except OSError as exc:
            raise PageError(f"cannot read {_file_path(url_or_path)}: {exc.strerror or exc}") from exc
        reading = raw_from_bytes(page, url=url_or_path, source="file", limits=limits)
        return replace(reading, name=name_for(target, reading.kind))
    start = time.perf_counter()
    client = page_client(url_or_path, timeout, limits)
    try:
        data = await asyncio.to_thread(client.get)
    except READ_ERRORS as exc:
        raise PageError(describe_error(exc, timeout)) from exc
    finally:
        client.close()
    reading = raw_from_bytes(data, url=url_or_path, limits=limits)
    return replace(reading, name=name_for(target, reading.kind), scrape_seconds=time.perf_counter() - start)


def _refused(exc: BaseException) -> bool:
    """Say whether a failed page read was a refused connection (nothing listens), not a slow or bad answer."""
    return isinstance(exc, ConnectionRefusedError) or isinstance(exc.__cause__, ConnectionRefusedError)
