"""`boundwatch inspect engine URL_OR_FILE`: read an engine's metrics once and print the normalised reading as JSON."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from exporter.analysis.dedup import counter_delta, step_count, step_increments
from exporter.analysis.engine_page import normalise_once
from exporter.commands import ConfigFlags
from exporter.snapshot.engine import EngineReading

if TYPE_CHECKING:
    from exporter.sources.engine_discovery import EngineTarget

HELP = "read an engine's /metrics (URL, page file or PROMETHEUS_MULTIPROC_DIR) and print what boundwatch makes of it"


def add_parser(subparsers: Any, config_flags: ConfigFlags) -> argparse.ArgumentParser:
    """Add `inspect engine`."""
    p = subparsers.add_parser("inspect", help=HELP, description=HELP)
    what = p.add_subparsers(dest="inspect_what", required=True)
    e = what.add_parser("engine", help="one vLLM or SGLang engine", description=HELP)
    e.add_argument(
        "target", metavar="URL_OR_FILE", help="http(s)://host:port/metrics, file://, a page file, or a dir"
    )
    e.add_argument(
        "--interval",
        type=float,
        default=0.0,
        help="read twice, this many seconds apart, and add tokens/s and steps/s (default: read once)",
    )
    e.add_argument("--timeout", type=float, default=2.0, help="HTTP timeout in seconds (default 2)")
    e.add_argument(
        "--proc-root", default="/proc", help="where to look for the engine's processes (default /proc)"
    )
    e.set_defaults(func=run)
    return p


def _local_engine(reading: EngineReading, proc_root: str) -> EngineTarget | None:
    """Return the engine on this host that serves the reading's port, if discovery finds it."""
    from exporter.sources.engine_discovery import discover

    port = urlparse(reading.url).port if reading.url.startswith(("http://", "https://")) else None
    if port is None:
        return None
    try:
        targets = discover(proc_root)
    except OSError:
        return None
    return next((t for t in targets if t.url and urlparse(t.url).port == port), None)


def describe(
    reading: EngineReading, prev: EngineReading | None = None, seconds: float = 0.0
) -> dict[str, Any]:
    """Return the reading as plain data; with an earlier reading, add rates over the seconds between."""
    steps = reading.steps
    out: dict[str, Any] = {
        "engine": reading.name,
        "kind": reading.kind,
        "model": reading.model,
        "url": reading.url,
        "read_from": reading.source,
        "multiprocess": reading.multiprocess,
        "running": reading.running,
        "waiting": reading.waiting,
        "kv_cache_usage": reading.kv_cache_usage,
        "prompt_tokens_total": reading.prompt_tokens_total,
        "generation_tokens_total": reading.generation_tokens_total,
        "preemptions_total": reading.preemptions_total,
        "spec_decode": {
            "draft_tokens_total": reading.spec_draft_tokens_total,
            "accepted_tokens_total": reading.spec_accepted_tokens_total,
            "acceptance": reading.spec_acceptance
            if reading.spec_acceptance is not None
            else (
                reading.spec_accepted_tokens_total / reading.spec_draft_tokens_total
                if reading.spec_draft_tokens_total and reading.spec_accepted_tokens_total is not None
                else None
            ),
        },
        "steps": None
        if steps is None
        else {"method": steps.method, "total": steps.total, "lower": steps.lower, "upper": steps.upper},
        "iteration_tokens": {"count": reading.iteration_count, "sum": reading.iteration_tokens_sum},
        "api_servers": {
            "count": reading.api_server_count,
            "count_from": reading.api_server_count_source or None,
            "kv_cache_pid_series": reading.kv_cache_pid_series,
            "iteration_count_by_pid": dict(reading.iteration_count_by_pid) or None,
        },
        "data_parallel_engines": reading.data_parallel_engines,
        "max_num_seqs": reading.max_num_seqs,
        "page": {
            "truncated": reading.page_truncated,
            "undecodable_characters": reading.page_decode_errors,
            "refused_values": reading.rejected_values,
        },
        "scrape_seconds": reading.scrape_seconds,
    }
    if prev is not None and seconds > 0:
        gen = counter_delta(prev.generation_tokens_total, reading.generation_tokens_total)
        prompt = counter_delta(prev.prompt_tokens_total, reading.prompt_tokens_total)
        out["rates"] = {
            "seconds": seconds,
            "generation_tokens_per_second": None if gen is None else gen / seconds,
            "prompt_tokens_per_second": None if prompt is None else prompt / seconds,
            "steps_per_second": {m: v / seconds for m, v in step_increments(prev, reading).items()},
        }
    return out


async def _inspect(
    target: str, interval: float, timeout: float
) -> tuple[EngineReading, EngineReading | None, float]:
    from exporter.sources.engine import read_once

    first = normalise_once(await read_once(target, timeout))
    if interval <= 0:
        return first, None, 0.0
    start = time.monotonic()
    await asyncio.sleep(interval)
    second = normalise_once(await read_once(target, timeout))
    return second, first, time.monotonic() - start


def run(args: argparse.Namespace) -> int:
    """Read the engine and print JSON; exit 1 with a message on stderr when it cannot be read."""
    try:
        reading, prev, seconds = asyncio.run(_inspect(args.target, args.interval, args.timeout))
    except (TimeoutError, OSError, ValueError) as exc:  # PageError says what failed in words
        reason = str(exc) or type(exc).__name__
        print(f"boundwatch: cannot read engine metrics at {args.target}: {reason}", file=sys.stderr)
        return 1
    except Exception as exc:  # aiohttp errors and the like: say what failed, never a traceback
        print(
            f"boundwatch: cannot read engine metrics at {args.target}: {type(exc).__name__}: {exc}",
            file=sys.stderr,
        )
        return 1
    local = _local_engine(reading, args.proc_root)
    procs = [{"server": i, "pid": pid} for i, pid in enumerate(local.api_server_pids)] if local else []
    if local is not None and local.max_num_seqs is not None:
        reading = replace(reading, max_num_seqs=local.max_num_seqs)
    if procs and reading.api_server_count_source not in ("processes", "cmdline"):
        reading = replace(reading, api_server_count=len(procs), api_server_count_source="processes")
        reading = replace(reading, steps=step_count(reading))
        if prev is not None:
            prev = replace(prev, api_server_count=len(procs), api_server_count_source="processes")
    data = describe(reading, prev, seconds)
    data["api_servers"]["processes"] = procs or None
    print(json.dumps(data, indent=2))
    return 0
