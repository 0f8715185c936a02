"""`boundwatch assets DIR`: write the Grafana dashboards, alert rules and systemd unit shipped with boundwatch."""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from exporter.commands import ConfigFlags

HELP = "copy the dashboards, alert rules and systemd unit into DIR (DIR/dashboards, DIR/alerts, DIR/systemd)"
FOLDERS = ("dashboards", "alerts", "systemd")


def add_parser(subparsers: Any, config_flags: ConfigFlags) -> argparse.ArgumentParser:
    """Add the `assets` sub-command."""
    p = subparsers.add_parser("assets", help=HELP, description=__doc__)
    p.add_argument("dir", metavar="DIR", nargs="?", help="where to write them (omit with --list)")
    p.add_argument("--list", action="store_true", help="print the files and exit")
    p.add_argument("--force", action="store_true", help="overwrite files that exist")
    return p


def sources() -> dict[str, list[Any]]:
    """Return each folder's files: from the installed package (a wheel), else from the checkout."""
    packaged = resources.files("exporter") / "assets"
    checkout = Path(__file__).resolve().parent.parent.parent
    out: dict[str, list[Any]] = {}
    for folder in FOLDERS:
        base: Any = packaged / folder
        if not base.is_dir():
            base = checkout / folder
        files = (
            sorted((f for f in base.iterdir() if f.is_file()), key=lambda f: f.name) if base.is_dir() else []
        )
        out[folder] = files
    return out


def run(args: argparse.Namespace) -> int:
    """Copy (or list) the assets; exit 1 when one would be overwritten without --force, 2 without any."""
    found = sources()
    if not any(found.values()):
        print("assets: none found (neither in the package nor in a checkout)", file=sys.stderr)
        return 2
    if args.list or args.dir is None:
        for folder, files in found.items():
            for f in files:
                print(f"{folder}/{f.name}")
        return 0
    root = Path(args.dir)
    plan = [(f, root / folder / f.name) for folder, files in found.items() for f in files]
    clashes = [str(target) for _, target in plan if target.exists()]
    if clashes and not args.force:
        print(f"assets: would overwrite {', '.join(clashes)} (use --force)", file=sys.stderr)
        return 1
    for source, target in plan:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source.read_bytes())
        print(target)
    return 0
