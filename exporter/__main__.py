"""Run the boundwatch command line: `python -m exporter`."""

from exporter.cli import main

raise SystemExit(main())
