"""Tests of exporter/commands/, one file per module (or per behaviour of one module)."""
