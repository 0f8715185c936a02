"""boundwatch: is each GPU GPU-bound or host-bound, and why.

Importing this package imports nothing else, so the in-process agent can use
`exporter.wire` and `exporter.analysis.intervals` without pulling in the sidecar.
"""

__version__ = "0.1.0"
