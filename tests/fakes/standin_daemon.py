"""Run the real daemon with the NVML stand-in in place of the driver: `python -m tests.fakes.standin_daemon 8 run ...`.

The first argument is the number of stand-in GPUs (H200 values, distinct UUIDs); the rest are
boundwatch's own arguments. Used by the daemon tests (`standin_daemon()`, here) and
`bench/scrape_flood.py` for a realistic 8-GPU page on a machine without a GPU.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from tests.fakes.nvml_standin import FakeGpu, FakeNvml

if TYPE_CHECKING:  # the daemon this module runs never imports the tests' HTTP helpers
    from tests.fakes.promserver import Daemon


def standin(count: int) -> FakeNvml:
    """Return a stand-in NVML with `count` GPUs, each its own UUID and bus id."""
    gpus = [FakeGpu(uuid=f"GPU-8f3c0d5e-0000-0000-0000-{i + 1:012d}", pids=()) for i in range(count)]
    return FakeNvml(gpus)


@contextlib.contextmanager
def standin_daemon(
    workdir: Path,
    gpus: int = 1,
    args: tuple[str, ...] = ("--no-engine",),
    env: dict[str, str] | None = None,
    preexec: Callable[[], None] | None = None,
    context: ssl.SSLContext | None = None,
) -> Iterator[Daemon]:
    """Run the daemon with `gpus` stand-in GPUs until the block exits."""
    from tests.fakes.promserver import ROOT, Daemon, _stop, _wait_http, listening_port

    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "boundwatch.log"
    cmd = [sys.executable, "-m", "tests.fakes.standin_daemon", str(gpus), "run", "--address", "127.0.0.1"]
    cmd += ["--port", "0", "--agent-socket", str(workdir / "agent.sock"), "--log-format", "json"]
    cmd += list(args)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("BOUNDWATCH_")}
    environ["PYTHONPATH"] = str(ROOT)
    environ.update(env or {})
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=environ, stdout=out, stderr=subprocess.STDOUT, preexec_fn=preexec
        )
    try:
        daemon = Daemon(
            listening_port(proc, log, 60.0), log, proc, "https" if context is not None else "http"
        )
        _wait_http(proc, daemon.metrics_url, log, 60.0, context, expect=b"boundwatch_")
        yield daemon
    finally:
        _stop(proc)


def main(argv: list[str]) -> int:
    """Install the stand-in as `pynvml`, then run boundwatch's command line."""
    sys.modules["pynvml"] = standin(int(argv[0]))  # type: ignore[assignment]
    from exporter.cli import main as boundwatch

    return boundwatch(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
