"""Collect N seconds of Snapshots for `diagnose` and `record`: from a running daemon, or sampled here.

A running daemon owns the agent socket, so when one answers its Snapshots are read from
`/api/snapshot` (polled at twice the tick rate, de-duplicated by sequence number); otherwise the
sources are sampled in this process with the daemon's own Sampler.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from exporter.config import Config
from exporter.snapshot import Snapshot, codec

OnSnapshot = Callable[[Snapshot], None]


class DaemonUnreachable(Exception):
    """The daemon a user named does not answer: the message says why (refused, no answer, TLS...)."""


def base_url(url: str) -> str:
    """Return a daemon's base URL from what a user typed (a base URL or any page of it)."""
    url = url.rstrip("/")
    for page in ("/metrics", "/api/snapshot", "/healthz"):
        if url.endswith(page):
            return url[: -len(page)]
    return url


def daemon_answers(url: str, timeout: float = 0.5) -> bool:
    """Say whether a boundwatch daemon serves /healthz at a base URL."""
    try:
        with urllib.request.urlopen(base_url(url) + "/healthz", timeout=timeout) as resp:
            return bool(resp.status == 200 and "status" in json.loads(resp.read() or b"{}"))
    except (OSError, ValueError, urllib.error.URLError):
        return False


def why_unreachable(url: str, timeout: float = 2.0) -> str | None:
    """Return why a daemon's base URL does not answer (None when something answers there)."""
    try:
        with urllib.request.urlopen(base_url(url) + "/healthz", timeout=timeout):
            return None
    except urllib.error.HTTPError as exc:
        return "it has no /healthz (is it a boundwatch daemon?)" if exc.code == 404 else None
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, ConnectionRefusedError):
            return "connection refused (nothing listens on that port)"
        if isinstance(reason, TimeoutError):
            return f"no answer within {timeout:g} s"
        return str(getattr(reason, "strerror", None) or reason)
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except (OSError, ValueError) as exc:
        return str(exc) or type(exc).__name__


def from_daemon(
    url: str, seconds: float, tick: float, on_snapshot: OnSnapshot | None = None
) -> list[Snapshot]:
    """Return the daemon's Snapshots over the next `seconds`."""
    page = base_url(url) + "/api/snapshot"
    out: list[Snapshot] = []
    seen = -1
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(page, timeout=max(1.0, tick * 2)) as resp:
                snap = codec.from_json(json.loads(resp.read()))
        except (OSError, ValueError, urllib.error.URLError):
            snap = None
        if snap is not None and snap.seq != seen:
            seen = snap.seq
            out.append(snap)
            if on_snapshot is not None:
                on_snapshot(snap)
        time.sleep(tick / 2)
    return out


async def _sample_here(cfg: Config, seconds: float, on_snapshot: OnSnapshot | None) -> list[Snapshot]:
    from exporter.daemon import build_sources
    from exporter.sampling import Sampler

    out: list[Snapshot] = []

    def keep(snap: Snapshot) -> None:
        out.append(snap)
        if on_snapshot is not None:
            on_snapshot(snap)

    sampler = Sampler(cfg, build_sources(cfg), on_tick=keep)
    await sampler.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.call_later(seconds + cfg.tick_seconds / 2, stop.set)
    try:
        await sampler.run(stop)
    finally:
        await sampler.aclose()
    return out


def sample_here(cfg: Config, seconds: float, on_snapshot: OnSnapshot | None = None) -> list[Snapshot]:
    """Return `seconds` of Snapshots sampled in this process."""
    return asyncio.run(_sample_here(cfg, seconds, on_snapshot))


def collect(
    cfg: Config,
    seconds: float,
    url: str | None,
    local: bool,
    on_snapshot: OnSnapshot | None = None,
    say: Callable[[str], None] = lambda _m: None,
) -> list[Snapshot]:
    """Return `seconds` of Snapshots: from the daemon at url (or the default one if it answers), else here."""
    default = f"http://127.0.0.1:{cfg.web.port}"
    if not local and url is not None:
        problem = why_unreachable(url)
        if problem is not None:
            raise DaemonUnreachable(f"cannot reach the daemon at {base_url(url)}: {problem}")
    if not local and (url is not None or daemon_answers(default)):
        target = url or default
        say(f"reading the daemon at {base_url(target)} for {seconds:g} s")
        return from_daemon(target, seconds, cfg.tick_seconds, on_snapshot)
    say(f"sampling in this process for {seconds:g} s (no daemon answered at {default})")
    return sample_here(cfg, seconds, on_snapshot)
