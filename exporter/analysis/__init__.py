"""Pure analysis: dataclasses in, dataclasses out; no I/O, no asyncio, no prometheus_client."""
