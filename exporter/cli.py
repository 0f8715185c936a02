"""Command line: parse flags, configure logging, run the daemon or a sub-command.

`boundwatch` alone (or `boundwatch run`) starts the daemon. Every module in
`exporter/commands/` with `add_parser(subparsers, config_flags)` and `run(args) -> int` adds a
sub-command; it gets `add_config_flags` and the loaded Config (`args.cfg`) from here.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import pkgutil
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from exporter import __version__
from exporter.config import DEFAULT_PORT, Config, ConfigError, load
from exporter.logs import configure


class _Group:
    """An argument group whose flags leave no attribute when not given (so `run` keeps earlier flags)."""

    def __init__(self, group: argparse._ArgumentGroup) -> None:
        self._group = group

    def add_argument(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("default", argparse.SUPPRESS)
        action = self._group.add_argument(*args, **kwargs)
        FLAG_NAMES.setdefault(action.dest, "/".join(action.option_strings))


FLAG_NAMES: dict[str, str] = {}  # configuration key -> the flag that sets it, for error messages


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """Add the flags that override configuration keys."""
    g = _Group(
        parser.add_argument_group("configuration (flags override BOUNDWATCH_* variables and the TOML file)")
    )
    g.add_argument("--config", metavar="FILE", help="TOML configuration file (also BOUNDWATCH_CONFIG)")
    g.add_argument("--address", dest="web.address", metavar="ADDR", help="listen address (default 0.0.0.0)")
    g.add_argument(
        "--port", dest="web.port", type=int, metavar="PORT", help=f"listen port (default {DEFAULT_PORT})"
    )
    g.add_argument(
        "--tick", dest="tick_seconds", type=float, metavar="S", help="sampling tick in seconds (default 0.5)"
    )
    g.add_argument("--log-level", dest="log_level", choices=["debug", "info", "warning", "error"])
    g.add_argument("--log-format", dest="log_format", choices=["auto", "json", "console"])
    g.add_argument(
        "--engine-url",
        dest="engine.urls",
        action="append",
        metavar="URL",
        help="engine /metrics URL or page file (repeatable; discovered engines are added)",
    )
    g.add_argument(
        "--agent-socket", dest="agent.socket", metavar="PATH", help="unix socket the agents send to"
    )
    g.add_argument(
        "--web.config.file",
        dest="web.config_file",
        metavar="FILE",
        help="Prometheus exporter-toolkit web config (TLS, client certificates, basic_auth_users, headers)",
    )
    for name in ("nvml", "host", "engine", "agent"):
        g.add_argument(
            f"--no-{name}",
            dest=f"{name}.enabled",
            action="store_const",
            const=False,
            help=f"disable the {name} source",
        )
    g.add_argument(
        "--check-config",
        action="store_true",
        help="print the effective configuration as JSON and exit (2 if invalid)",
    )


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Return the configuration keys that flags set."""
    skip = {"config", "check_config", "command", "func"}
    return {
        k: v for k, v in vars(args).items() if v is not None and k not in skip and ("." in k or k in _TOP)
    }


_TOP = {
    f for f in Config.__dataclass_fields__ if f not in {"web", "nvml", "host", "engine", "agent", "verdict"}
}


def config_from(args: argparse.Namespace) -> Config:
    """Build the configuration from parsed flags, the environment and the TOML file."""
    return load(getattr(args, "config", None), overrides=overrides(args), override_origins=FLAG_NAMES)


def _commands() -> list[Any]:
    import exporter.commands as pkg

    mods = []
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        mod = importlib.import_module(f"exporter.commands.{info.name}")
        if hasattr(mod, "add_parser") and hasattr(mod, "run"):
            mods.append(mod)
    return mods


class _Parser(argparse.ArgumentParser):
    """The top-level parser: a sub-command's flag typed before the sub-command is named as such.

    argparse reads `boundwatch --seconds 2 diagnose` as the command "2" ("invalid choice"); this
    says that --seconds belongs to diagnose and goes after it.
    """

    argv: Sequence[str] = ()

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        self.argv = list(sys.argv[1:] if args is None else args)
        return super().parse_args(self.argv, namespace)

    def error(self, message: str) -> NoReturn:
        misplaced = _misplaced(self, self.argv)
        if misplaced is not None:
            flag, takers, command = misplaced
            if command in takers:
                message = f"{flag} is an option of `{command}`: put it after the command (boundwatch {command} {flag} ...)"
            else:
                named = [f"`{t}`" for t in takers]
                listed = named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]
                message = f"{flag} is an option of {listed} only: put it after one of them"
        super().error(message)


def _misplaced(parser: argparse.ArgumentParser, argv: Sequence[str]) -> tuple[str, list[str], str] | None:
    """Return a flag before the sub-command that only sub-commands take, those that take it, and the command typed.

    None when every flag before the command is the top level's own (or unknown to every command).
    """
    subs = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    if subs is None:
        return None
    end = next((i for i, t in enumerate(argv) if t in subs.choices or t == "--"), len(argv))
    command = argv[end] if end < len(argv) else ""
    for token in argv[:end]:  # the command's own flags follow it
        if not token.startswith("-") or token == "-":
            continue
        flag = token.split("=", 1)[0]
        if flag in parser._option_string_actions:
            continue
        takers = sorted(name for name, p in subs.choices.items() if flag in p._option_string_actions)
        if takers:
            return flag, takers, command
    return None


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser with every sub-command."""
    parser = _Parser(
        prog="boundwatch",
        description="Tell, live, whether each GPU is GPU-bound or host-bound, and why. "
        "Without a sub-command, run the sidecar daemon and serve Prometheus metrics.",
    )
    parser.add_argument("--version", action="version", version=f"boundwatch {__version__}")
    add_config_flags(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    run_p = sub.add_parser("run", help="run the sidecar daemon (the default)")
    add_config_flags(run_p)
    for mod in _commands():
        before = set(sub.choices)
        mod.add_parser(sub, add_config_flags)
        for name in set(sub.choices) - before:
            sub.choices[name].set_defaults(func=mod.run)
    return parser


def run_daemon(cfg: Config) -> int:
    """Run the daemon until SIGTERM/SIGINT."""
    from exporter.daemon import serve

    try:
        asyncio.run(serve(cfg))
    except OSError as exc:
        print(f"boundwatch: cannot listen on {cfg.web.address}:{cfg.web.port}: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line and return the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cfg = config_from(args)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"boundwatch: configuration error: {problem}", file=sys.stderr)
        return 2
    if getattr(args, "check_config", False):
        print(json.dumps(cfg.as_dict(), indent=2, sort_keys=True))
        return 0
    configure(cfg.log_level, cfg.log_format)
    command = getattr(args, "command", None)
    if command in (None, "run"):
        return run_daemon(cfg)
    args.cfg = cfg
    return int(args.func(args))
