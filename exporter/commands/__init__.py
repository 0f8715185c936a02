"""Sub-commands: each module has add_parser(subparsers) and run(args) -> int."""
