"""`boundwatch replay FILE`: analyse a recording (from `boundwatch record`) and print the diagnose report."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from exporter.commands import ConfigFlags

HELP = "print the diagnose report of a recording, with this host's thresholds (--config)"


def add_parser(subparsers: Any, config_flags: ConfigFlags) -> argparse.ArgumentParser:
    """Add the `replay` sub-command."""
    p = subparsers.add_parser("replay", help=HELP, description=__doc__)
    p.add_argument("file", metavar="FILE", help="a recording, optionally gzipped ('-' for stdin)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--verdicts",
        action="store_true",
        help="also print each tick's verdict per GPU (JSON lines on stderr)",
    )
    config_flags(p)
    return p


def run(args: argparse.Namespace) -> int:
    """Read, merge the agents' windows again and re-classify with the current thresholds, report; exit 2 when the file is not a recording."""
    import json

    from exporter.analysis import pipeline
    from exporter.analysis.diagnosis import report
    from exporter.commands.diagnose import emit
    from exporter.snapshot import codec

    try:
        if args.file == "-":
            fh: Any = sys.stdin
        elif args.file.endswith(".gz"):
            import gzip

            fh = gzip.open(args.file, "rt", encoding="utf-8")
        else:
            fh = open(args.file, encoding="utf-8")
    except OSError as exc:
        print(f"replay: {exc}", file=sys.stderr)
        return 2
    with fh:
        try:
            _head, snaps_it = codec.read_lines(fh)
            snaps = list(snaps_it)
        except ValueError as exc:
            print(f"replay: {args.file}: {exc}", file=sys.stderr)
            return 2
    snaps = pipeline.replay(snaps, args.cfg)
    if args.verdicts:
        for s in snaps:
            row = {"seq": s.seq, "at": s.at, **{str(x.gpu): [x.verdict, *x.reasons] for x in s.verdicts}}
            print(json.dumps(row), file=sys.stderr)
    emit(report(snaps, args.cfg, reclassify=False), args.json)
    return 0
