"""Which processes on the host are engines: vLLM and SGLang, their API servers, ports and multiprocess dirs.

`discover` reads the process table (or takes the one the caller holds) and returns one
`EngineTarget` per engine, at most MAX_ENGINES: its page's URL (the port from the flags, a
listening socket, or the kind's default; the address loopback, or the one `--host` names where the
engine's own process listens there), its root and every descendant process, its API servers (titled `APIServer_<i>`,
or the children holding the listening socket), its multiprocess dir (reached through
/proc/<pid>/root when it is in another container), its CUDA_VISIBLE_DEVICES, the batch limit and
the CUDA graph settings its command line gives. API servers whose parent is not recognised (a
wrapper script) are grouped into engines by their multiprocess dir and socket; engines that
would share a name are made distinct and only one of them reads the page. `configured_target`,
`merge_targets` and `name_for` join the configured URLs with what discovery found.
"""

from __future__ import annotations

import ipaddress
import os
import re
import stat
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlparse

from exporter.snapshot.engine import GraphConfig, ascii_int
from exporter.sources import procs
from exporter.sources.engine_flags import graph_config
from exporter.sources.engine_scrape import multiproc_dir_usable

DEFAULT_PORTS = {"vllm": 8000, "sglang": 30000}
API_SERVER_TITLE = re.compile(r"^(?:\S*::)?APIServer_([0-9]{1,6})\b")  # 7 digits or more: no API server
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


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
    # its API servers past MAX_API_SERVERS and processes past MAX_PROCESSES, not read, and its command
    # line and its processes' environments cut at their bounds (procs.MAX_CMDLINE_*, MAX_ENVIRON_BYTES)
    over_bound: int = 0


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


ANY_ADDRESS = ("0.0.0.0", "::", "", "localhost")  # --host values read over loopback


def _flag_port(kind: str, cmdline: Sequence[str]) -> int:
    """Return the port an engine's flags give, else its kind's default."""
    port = ascii_int(_flag(cmdline, "--port"), 5)
    return port if port is not None and 0 < port < 65536 else DEFAULT_PORTS[kind]


def _page_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}/metrics" if ":" in host else f"http://{host}:{port}/metrics"


def _host_of(
    proc_root: str, cmdline: Sequence[str], port: int, holders: Iterable[int], tables: procs.TcpTables
) -> str:
    """Return the address to read an engine's page at: loopback, or an address its own processes listen on.

    `--host` names the address an engine binds, but a command line can name any host at all (a
    process titled as an engine by anyone on the host): the daemon must never be sent to read a
    page elsewhere. So a `--host` that is not loopback or the unspecified address is used only
    where one of the engine's processes (`holders`) holds a listening socket at that address and
    port; a host name is replaced by the address such a socket is bound to. Anything else is read
    at 127.0.0.1, where a page that is not there fails as any engine that is down.
    """
    flag = _flag(cmdline, "--host")
    if flag is None or flag in ANY_ADDRESS:
        return "127.0.0.1"
    try:
        named = ipaddress.ip_address(flag)
    except ValueError:
        named = None
    if named is not None and named.is_loopback:
        return str(named)
    bound = sorted(
        {
            addr
            for pid in holders
            for addr, p in procs.listening_sockets(proc_root, pid, tables).values()
            if p == port
        }
    )
    if named is not None and str(named) in bound:
        return str(named)
    for addr in bound:  # a host name: the address it was bound at (unspecified: loopback reaches it)
        return "127.0.0.1" if ipaddress.ip_address(addr).is_unspecified else addr
    return "127.0.0.1"


MAX_CONFIG_BYTES = 1 << 20
# spaces and tabs only: `\s` also takes newlines, and `^\s*` over a file of blank lines is quadratic
_YAML_MAX_NUM_SEQS = re.compile(
    rb"^[ \t]*max[-_]num[-_]seqs[ \t]*:[ \t]*(\d{1,8})[ \t]*(?:#.*)?$", re.MULTILINE
)


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
    limit = ascii_int(value, 8)
    return limit if limit is not None and 0 < limit <= 10_000_000 else None


def _listening_port(proc_root: str, kind: str, pids: Iterable[int], tables: procs.TcpTables) -> int | None:
    """Return the port the engine's processes listen on (the kind's default first), None if none is seen."""
    ports: set[int] = set()
    for pid in pids:
        ports |= procs.listening_ports(proc_root, pid, tables)
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


# Any process can take an engine's title or command line: what discovery reads is bounded.
MAX_ENGINES = 32  # engines read at once
MAX_API_SERVERS = 64  # an engine's API servers read (lowest index first): a series and a CPU read each
MAX_PROCESSES = 512  # an engine's processes (its main process first) whose cgroups and GPUs are read
MAX_UNRECOGNISED = 256  # API servers under no recognised engine whose environments and sockets are read


def discover(proc_root: str, table: Sequence[procs.ProcInfo] | None = None) -> list[EngineTarget]:
    """Find the engines running on this host, their API servers, processes and multiprocess dirs.

    `table` is the process table when the caller holds one (read now otherwise). At most
    MAX_ENGINES are returned (`find_engines` also says how many more were found).
    """
    return find_engines(proc_root, table)[0]


def find_engines(
    proc_root: str, table: Sequence[procs.ProcInfo] | None = None, limit: int = MAX_ENGINES
) -> tuple[list[EngineTarget], int]:
    """Return the engines `discover` finds, at most `limit` of them, and how many more it left unread.

    Every engine costs reads each tick and a set of series, and any user can start processes that
    look like engines: past the bound, those whose main process started first are kept (an engine
    serving for hours is not pushed out by processes started after it), and the rest are counted.
    """
    table = list(procs.processes(proc_root)) if table is None else list(table)
    by_pid = {p.pid: p for p in table}
    roots: dict[int, str] = {}
    for p in table:
        kind = engine_kind_of(p)
        if kind and not (p.ppid in by_pid and engine_kind_of(by_pid[p.ppid]) == kind):
            roots[p.pid] = kind
    found = [_Engine(root, kind) for root, kind in sorted(roots.items())]
    tables = procs.TcpTables(proc_root)  # each network namespace's sockets read once this pass
    found += _unrecognised(proc_root, table, by_pid, roots, tables)
    unread = max(0, len(found) - limit)
    if unread:
        started = {p.pid: p.start_ticks for p in table}
        kept = set(
            sorted(range(len(found)), key=lambda i: (started.get(found[i].root, 0), found[i].root))[:limit]
        )
        found = [e for i, e in enumerate(found) if i in kept]
    targets = [_target(proc_root, table, by_pid, e, tables) for e in found]
    return _distinct(proc_root, targets, tables), unread


def _unrecognised(
    proc_root: str,
    table: Sequence[procs.ProcInfo],
    by_pid: dict[int, procs.ProcInfo],
    roots: dict[int, str],
    tables: procs.TcpTables,
) -> list[_Engine]:
    """Return the engines of API servers whose parent was not recognised (a wrapper script launched vLLM).

    Servers under one parent are one engine when they share a multiprocess dir and a listening
    socket and their indices differ; otherwise (unrelated processes that took the same title)
    each group, or each server, is an engine of its own. A parent that is an init (pid 1) never
    stands for an engine, since every orphan of the host is its child.
    """
    under: dict[int, bool] = {}  # pid -> whether a recognised engine is above it (each pid walked once)
    titled = [
        p for p in table if API_SERVER_TITLE.match(p.title) and not _under_root(by_pid, p.pid, roots, under)
    ]
    # the environments and sockets of at most MAX_UNRECOGNISED of them are read, those started first
    titled = sorted(titled, key=lambda p: (p.start_ticks, p.pid))[:MAX_UNRECOGNISED]
    by_parent: dict[int, list[procs.ProcInfo]] = defaultdict(list)
    for p in titled:
        by_parent[p.ppid].append(p)
    out: list[_Engine] = []
    for parent, servers in sorted(by_parent.items()):
        groups: dict[tuple[str, frozenset[int]], list[procs.ProcInfo]] = defaultdict(list)
        for s in servers:
            env = procs.read_environ(proc_root, s.pid).get(MULTIPROC_ENV, "")
            groups[(env, frozenset(procs.listening_sockets(proc_root, s.pid, tables)))].append(s)
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
    proc_root: str,
    table: Sequence[procs.ProcInfo],
    by_pid: dict[int, procs.ProcInfo],
    e: _Engine,
    tables: procs.TcpTables,
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
    over = max(0, len(servers) - MAX_API_SERVERS) + max(0, len(pids) - MAX_PROCESSES)
    servers, pids = servers[:MAX_API_SERVERS], pids[:MAX_PROCESSES]
    server_set = {pid for _, pid in servers}
    port: int | None = None
    port_known = _flag(cmdline, "--port") is not None
    if not port_known:
        port = _listening_port(proc_root, e.kind, server_set or {e.root}, tables)
        port_known = port is not None
    if port is None:
        port = _flag_port(e.kind, cmdline)
    url = _page_url(_host_of(proc_root, cmdline, port, server_set or {e.root}, tables), port)
    asc = _flag(cmdline, "--api-server-count", "-asc")
    mp_dir = cuda = None
    if info is not None and e.rooted and info.cmdline_cut:
        over += 1  # the flags read from it may have been past the bound
    for pid in dict.fromkeys([*server_set, *pids]):  # the servers are among the pids too: read once
        env, cut = procs.environ_of(proc_root, pid)
        over += cut
        if mp_dir is None and env.get(MULTIPROC_ENV):
            mp_dir = resolve_in(proc_root, pid, env[MULTIPROC_ENV])
        if cuda is None and pid not in server_set:
            cuda = env.get("CUDA_VISIBLE_DEVICES")
    if servers:
        server_pids: tuple[int, ...] = tuple(pid for _, pid in servers)
    elif e.kind == "sglang" or asc in (None, "1"):
        server_pids = (e.root,)  # the main process serves HTTP itself
    else:  # several API servers without titles (vLLM 0.10): the children holding the listening socket
        server_pids = _socket_holders(proc_root, e.root, list(pids[1:]), port, tables)[:MAX_API_SERVERS]
    return EngineTarget(
        url=url,
        kind=e.kind,
        name=f"{e.kind}:{port}",
        root_pid=e.root,
        api_server_pids=server_pids,
        engine_pids=pids,
        api_server_count_cmdline=ascii_int(asc, 6),
        multiproc_dir=mp_dir,
        cuda_visible_devices=cuda,
        servers_titled=bool(servers),
        port_known=port_known,
        max_num_seqs=batch_limit(proc_root, e.root, e.kind, cmdline),
        graph_config=graph_config(e.kind, cmdline),
        over_bound=over,
    )


def _distinct(proc_root: str, targets: list[EngineTarget], tables: procs.TcpTables) -> list[EngineTarget]:
    """Give engines that would share a name distinct names, and never let two read the same page.

    Of the engines named alike, the one whose processes listen on the port keeps the name and the
    URL (a process with only the command line, `vllm serve --port N`, started earlier, is no engine
    there), then the one whose port is known (from its flags or its sockets) and that shares the
    daemon's network namespace; the others are named `<name>-2`, `-3`... and read only their
    multiprocess files, if any.
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
                not _listens(proc_root, targets[i], tables),
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


def _listens(proc_root: str, t: EngineTarget, tables: procs.TcpTables) -> bool:
    """Say whether an engine's main process or an API server holds a listening socket on its name's port."""
    port = ascii_int(t.name.rpartition(":")[2], 5)
    if port is None:
        return False
    pids = dict.fromkeys(p for p in (t.root_pid, *t.api_server_pids) if p)
    return any(port in procs.listening_ports(proc_root, pid, tables) for pid in pids)


def _socket_holders(
    proc_root: str, root: int, children: Sequence[int], port: int, tables: procs.TcpTables
) -> tuple[int, ...]:
    """Return the children that hold the engine's listening socket (its API servers)."""
    listening = procs.listening_inodes(proc_root, root, port, tables)
    if not listening:
        return ()
    return tuple(pid for pid in sorted(children) if procs.socket_inodes(proc_root, pid) & listening)


def resolve_in(proc_root: str, pid: int, path: str) -> str:
    """Return a path as this process can reach it: as is, or through /proc/<pid>/root (another container)."""
    if multiproc_dir_usable(path):
        return path
    inside = os.path.join(proc_root, str(pid), "root", path.lstrip("/"))
    return inside if multiproc_dir_usable(inside) else path


def _under_root(
    by_pid: dict[int, procs.ProcInfo], pid: int, roots: dict[int, str], seen: dict[int, bool]
) -> bool:
    """Say whether a recognised engine's root is an ancestor of a process; `seen` keeps every answer found.

    Each process is walked once over all calls (a chain of thousands of titled processes would
    otherwise be walked once per process in it).
    """
    path: dict[int, None] = {}  # the ancestors walked, in order (a dict: a cycle is found at once)
    answer = False
    cur = by_pid.get(pid)
    while cur is not None and cur.ppid not in path and cur.ppid != pid:
        parent = cur.ppid
        if parent in seen:
            answer = seen[parent] or parent in roots
            break
        if parent in roots:
            answer = True
            break
        path[parent] = None
        cur = by_pid.get(parent)
    for p in path:
        seen[p] = answer
    seen[pid] = answer
    return answer


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
