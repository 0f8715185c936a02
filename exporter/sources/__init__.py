"""I/O: one module per outside party, each a small class behind the Source protocol."""
