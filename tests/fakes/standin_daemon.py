"""Run the real daemon with the NVML stand-in in place of the driver: `python -m tests.fakes.standin_daemon 8 run ...`.

The first argument is the number of stand-in GPUs (H200 values, distinct UUIDs); the rest are
boundwatch's own arguments. Used by the daemon tests and `bench/scrape_flood.py` for a realistic
8-GPU page on a machine without a GPU.
"""

from __future__ import annotations

import sys

from tests.fakes.nvml_standin import FakeGpu, FakeNvml


def standin(count: int) -> FakeNvml:
    """Return a stand-in NVML with `count` GPUs, each its own UUID and bus id."""
    gpus = [FakeGpu(uuid=f"GPU-8f3c0d5e-0000-0000-0000-{i + 1:012d}", pids=()) for i in range(count)]
    return FakeNvml(gpus)


def main(argv: list[str]) -> int:
    """Install the stand-in as `pynvml`, then run boundwatch's command line."""
    sys.modules["pynvml"] = standin(int(argv[0]))  # type: ignore[assignment]
    from exporter.cli import main as boundwatch

    return boundwatch(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
