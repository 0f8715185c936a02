"""Tests of exporter/analysis/, one file per module (or per behaviour of one module)."""
