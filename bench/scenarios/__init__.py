"""The scenario lab: field cases reproduced on a real GPU, watched by the real sidecar (see lab.py)."""
