"""The Triton self-test probe: HBM bandwidth, a known duty-cycle load, a bf16 matmul rate.

logic.py is pure (CI-tested); check.py reads the sidecar's /metrics; gpu.py imports torch and
Triton lazily and runs the kernels; scheduled.py lets the daemon run the probe in a subprocess
while the GPU is idle. Importing this package loads no GPU library.
"""
