"""Tests of exporter/snapshot/, one file per module (or per behaviour of one module)."""
