"""Tests of exporter/sources/, one file per module (or per behaviour of one module)."""
