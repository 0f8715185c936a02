"""Render the latest Snapshot as Prometheus metric families, and serve them over HTTP."""
