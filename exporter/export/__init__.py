"""Render the latest Snapshot as Prometheus metric families (serving them is exporter.serve's)."""
