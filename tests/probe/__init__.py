"""Tests of exporter/probe/, one file per module (or per behaviour of one module)."""
