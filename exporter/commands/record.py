"""`boundwatch record FILE`: write N seconds of Snapshots as JSON lines, to replay elsewhere."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from exporter import __version__
from exporter.commands import ConfigFlags

HELP = "record N seconds of Snapshots to a JSON-lines file (analyse it with `boundwatch replay`)"


def add_parser(subparsers: Any, config_flags: ConfigFlags) -> argparse.ArgumentParser:
    """Add the `record` sub-command."""
    from exporter.commands.diagnose import add_sampling_flags

    p = subparsers.add_parser("record", help=HELP, description=__doc__)
    p.add_argument("file", metavar="FILE", help="where to write the recording ('-' for stdout)")
    add_sampling_flags(p, 60.0)
    config_flags(p)
    return p


def run(args: argparse.Namespace) -> int:
    """Record; exit 0, 1 when nothing was sampled, 2 when the file cannot be written or the daemon reached."""
    import platform

    from exporter.commands._live import DaemonUnreachable, collect
    from exporter.snapshot import codec

    cfg = args.cfg
    try:
        out = sys.stdout if args.file == "-" else open(args.file, "w", encoding="utf-8")
    except OSError as exc:
        print(f"record: cannot write {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    count = 0
    try:
        out.write(
            codec.header(
                boundwatch=__version__,
                python=platform.python_version(),
                started=time.time(),
                tick_seconds=cfg.tick_seconds,
                verdict=cfg.as_dict()["verdict"],
                roofline=cfg.as_dict()["roofline"],
            )
            + "\n"
        )

        def write(snap: Any) -> None:
            nonlocal count
            out.write(codec.dumps(snap) + "\n")
            out.flush()
            count += 1

        collect(
            cfg,
            args.seconds,
            args.url,
            args.local,
            on_snapshot=write,
            say=lambda m: print(f"record: {m}", file=sys.stderr),
        )
    except DaemonUnreachable as exc:
        print(f"record: {exc}", file=sys.stderr)
        return 2
    finally:
        if out is not sys.stdout:
            out.close()
    print(f"record: {count} snapshots written to {args.file}", file=sys.stderr)
    return 0 if count else 1
