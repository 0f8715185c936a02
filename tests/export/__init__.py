"""Tests of exporter/export/, one file per module (or per behaviour of one module)."""
