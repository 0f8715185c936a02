"""Tests of exporter/serve/, one file per module (or per behaviour of one module)."""
