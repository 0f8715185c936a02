"""The daemon's lifecycle: build the sources, tick, serve HTTP, stop cleanly on SIGTERM/SIGINT.

SIGHUP is logged and ignored (a new configuration needs a restart), never a kill without cleanup.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import socket
import ssl
from collections.abc import Callable, Iterator

import structlog

from exporter import __version__
from exporter.config import Config
from exporter.sampling import Sampler
from exporter.serve.listener import (
    BACKLOG,
    ConnectionGuard,
    RateLimitedLoopErrors,
    connection_cap,
    raise_descriptor_limit,
)
from exporter.serve.web import LISTENER, make_app, make_runner
from exporter.sources.base import Source
from exporter.sources.host import HostSource
from exporter.sources.nvml import NvmlSource

log = structlog.get_logger("boundwatch")

# The cycle collector's young generation is collected after this many allocations net (Python's
# default: 700). A tick allocates tens of thousands of short-lived objects (readings, Snapshots,
# verdict facts) freed by reference counting; at 700, 64 GPUs cost ~1.1 ms of collector per tick
# (6% of the daemon's CPU, bench/README.md "Session 5"), at 20,000 0.1-0.6 ms; at 100,000 (several
# ticks' worth) most of a tick's objects are gone before a pass looks at them: ~0 ms (session 11).
# Objects alive after start-up (modules, configuration) are frozen out of the collector's passes.
GC_YOUNG_THRESHOLD = 100_000


@contextlib.contextmanager
def _collector_tuned() -> Iterator[None]:
    """Freeze what start-up made and collect the young generation less often; restore both after."""
    before = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(before[0], GC_YOUNG_THRESHOLD), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


async def _until_stopped(stop: asyncio.Event) -> None:
    """Wait for stop, with the collector tuned for serving meanwhile."""
    with _collector_tuned():
        await stop.wait()


def build_sources(cfg: Config) -> list[Source]:
    """Return the enabled sources, in tick order."""
    sources: list[Source] = []
    if cfg.nvml.enabled:
        # the scheduled self-test reads each GPU's busy share against its idle bar every tick
        also = (cfg.probe.idle_busy_max,) if cfg.probe.enabled else ()
        sources.append(NvmlSource(cfg.nvml, also_edges=also))
    if cfg.host.enabled:
        sources.append(HostSource(cfg.host))
    if cfg.engine.enabled:
        from exporter.sources.engine import EngineSource

        sources.append(EngineSource(cfg))
    if cfg.agent.enabled:
        from exporter.sources.agent_feed import AgentFeed

        sources.append(AgentFeed(cfg.agent))
    return sources


def sd_notify(message: str, environ: dict[str, str] | None = None) -> bool:
    """Send one sd_notify message when systemd gave us a NOTIFY_SOCKET; return whether it was sent."""
    path = (environ if environ is not None else os.environ).get("NOTIFY_SOCKET")
    if not path:
        return False
    if path.startswith("@"):
        path = "\0" + path[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(path)
            sock.send(message.encode())
        return True
    except OSError:
        return False


def _ssl_context(cfg: Config) -> ssl.SSLContext | None:
    if cfg.web.config_file:
        from exporter import webconfig

        return webconfig.load(cfg.web.config_file).ssl_context()
    if not cfg.web.tls_cert_file or not cfg.web.tls_key_file:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cfg.web.tls_cert_file, cfg.web.tls_key_file)
    return ctx


def _on_sighup() -> None:
    log.warning("sighup_ignored", reason="configuration reload is not supported: restart to apply it")


def _listening_socket(address: str, port: int) -> socket.socket:
    """Return a non-blocking TCP socket listening on address:port."""
    family, kind, proto, _, where = socket.getaddrinfo(
        address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(where)
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


async def serve(
    cfg: Config,
    sources: list[Source] | None = None,
    stop: asyncio.Event | None = None,
    on_ready: Callable[[int], None] | None = None,
) -> None:
    """Run the daemon until stop is set (or SIGTERM/SIGINT arrives)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(RateLimitedLoopErrors())
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGHUP, _on_sighup)
    sources = build_sources(cfg) if sources is None else sources
    watchdog = os.environ.get("WATCHDOG_USEC")

    def on_tick(_snap: object) -> None:
        if watchdog:
            sd_notify("WATCHDOG=1")

    sampler = Sampler(cfg, sources, on_tick=on_tick)  # from here on, the sampler owns the sources
    await sampler.start()
    w = cfg.web
    runner = None
    try:  # anything that fails before the daemon listens closes the sampler (its threads, NVML) first
        await sampler.tick()  # serve a first Snapshot from the start
        app = make_app(cfg, sampler)
        runner = make_runner(app, w)
        await runner.setup()
        server = runner.server
        if server is None:  # setup() sets it
            raise RuntimeError("the web runner has no server after setup()")
        guard = ConnectionGuard(
            server,
            connection_cap(w.max_connections, raise_descriptor_limit()),
            w.header_timeout_seconds,
            stats=app[LISTENER],
        )
        tls = _ssl_context(cfg)
        listener = _listening_socket(w.address, w.port)
    except BaseException:
        if runner is not None:
            await runner.cleanup()
        await sampler.aclose()
        raise
    accepting = asyncio.create_task(guard.serve(listener, tls), name="accept")
    port = listener.getsockname()[1]
    log.info(
        "listening",
        version=__version__,
        address=w.address,
        port=port,
        tick_seconds=cfg.tick_seconds,
        sources=[s.name for s in sources],
        max_connections=guard.max_connections,
    )
    sd_notify("READY=1")
    if on_ready is not None:
        on_ready(port)
    ticking = asyncio.create_task(sampler.run(stop), name="sampler")
    try:
        await _until_stopped(stop)
    finally:
        log.info("stopping")
        sd_notify("STOPPING=1")
        ticking.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticking
        accepting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await accepting
        listener.close()
        await runner.cleanup()
        await sampler.aclose()
