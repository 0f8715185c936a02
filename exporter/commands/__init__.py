"""Sub-commands: each module has `add_parser(subparsers, config_flags)` and `run(args) -> int`.

A command takes what it needs as parameters and imports nothing of the command line:
`config_flags(parser)` adds the configuration flags (the CLI passes its own), and `run` finds the
loaded Config as `args.cfg`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

ConfigFlags = Callable[[argparse.ArgumentParser], None]
