"""`boundwatch diagnose`: sample for N seconds and print the verdict, its evidence and the likely fixes."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from exporter.commands import ConfigFlags

HELP = "sample for N seconds and print whether each GPU is GPU- or host-bound, the evidence, and likely fixes"


def add_sampling_flags(p: argparse.ArgumentParser, seconds: float) -> None:
    """Add the flags that say where Snapshots come from and for how long."""
    p.add_argument("--seconds", type=float, default=seconds, help=f"how long to sample (default {seconds:g})")
    p.add_argument(
        "--url",
        default=None,
        help="read a running daemon (its base URL, e.g. http://127.0.0.1:9482); "
        "default: the local daemon if it answers, else sample in this process",
    )
    p.add_argument("--local", action="store_true", help="sample in this process even if a daemon answers")


def add_parser(subparsers: Any, config_flags: ConfigFlags) -> argparse.ArgumentParser:
    """Add the `diagnose` sub-command."""
    p = subparsers.add_parser("diagnose", help=HELP, description=__doc__)
    add_sampling_flags(p, 10.0)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    config_flags(p)
    return p


def emit(rep: dict[str, Any], as_json: bool) -> None:
    """Print a report as text or JSON."""
    from exporter.analysis.diagnosis import format_text

    if as_json:
        print(json.dumps(rep, indent=2, sort_keys=False))
    else:
        print(format_text(rep), end="")


def run(args: argparse.Namespace) -> int:
    """Sample, diagnose, print; exit 0, 1 when nothing was sampled, 2 when the daemon named cannot be reached."""
    from exporter.analysis.diagnosis import report
    from exporter.commands._live import DaemonUnreachable, collect

    cfg = args.cfg

    def say(msg: str) -> None:
        print(f"diagnose: {msg}", file=sys.stderr, flush=True)

    try:
        snaps = collect(cfg, args.seconds, args.url, args.local, say=say)
    except DaemonUnreachable as exc:
        say(str(exc))
        return 2
    if not snaps:
        say("no snapshot came in")
        return 1
    emit(report(snaps, cfg), args.json)
    return 0
