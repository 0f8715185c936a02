"""The daemon's scheduled probe: decide when the GPU is idle enough, run the probe in a subprocess.

The sidecar never imports torch, Triton or CUDA: the probe runs as `python -m exporter probe --json`
in its own process, pinned to one GPU by UUID, and its JSON result comes back here.

Wiring, in the Sampler (`exporter/sampling.py`: one scheduler for the process when `probe.enabled`;
it holds what goes in Snapshot.probe, a `ProbeSummary` per GPU label):

    probes = ProbeScheduler(cfg)
    # every tick, with the new Snapshot at the end of the history:
    snap = dataclasses.replace(snap, probe=probes.tick((*history, snap)))
    # at shutdown (Sampler.aclose):
    await probes.close()

Underneath: `should_run_probe(history, cfg)` decides, `run_probe_async(uuid, cfg, self_check_url(cfg))`
runs one GPU's probe (cancelling the task kills the subprocess), `must_stop(snap, cfg)` says when
to cancel, and `record(state, gpu_label, result)` keeps each GPU's summary.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from exporter.config import Config, ProbeConfig
from exporter.probe import logic
from exporter.snapshot import Snapshot
from exporter.snapshot.probe import NO_PROBE, ProbeSummary


def engine_has_work(snap: Snapshot) -> bool | None:
    """Return True if any engine has running or waiting requests, None if an engine cannot tell."""
    unknown = False
    for eng in snap.engines:
        if (eng.running or 0) > 0 or (eng.waiting or 0) > 0:
            return True
        if eng.running is None and eng.waiting is None:
            unknown = True
    return None if unknown else False


def gpu_busy(snap: Snapshot, index: int) -> float | None:
    """Return a GPU's busy ratio at a tick: the picked source, else NVML utilization, else None."""
    picked = snap.busy.get(index)
    if picked is not None:
        return picked[0]
    reading = snap.gpu(index)
    return reading.utilization if reading is not None else None


def last_run_at(snap: Snapshot) -> float | None:
    """Return the unix time of the latest probe recorded in a Snapshot, or None."""
    stamps = [e.timestamp for e in snap.probe.values() if e.timestamp is not None]
    return max(stamps) if stamps else None


def _probe_cfg(cfg: Config | ProbeConfig) -> ProbeConfig:
    return cfg if isinstance(cfg, ProbeConfig) else cfg.probe


def should_run_probe(
    snapshots: Sequence[Snapshot], cfg: Config | ProbeConfig, last_run: float | None = None
) -> bool:
    """Return whether the scheduled probe may start now.

    Yes only when it is enabled; the history reaches back `idle_seconds`; in every snapshot of
    that span no engine had running or waiting requests (an engine that reports neither counts as
    busy) and every GPU's busy ratio was known and <= `idle_busy_max`; and at least
    `interval_seconds` passed since the last run (`last_run`, else the newest Snapshot.probe).
    """
    pc = _probe_cfg(cfg)
    if not pc.enabled or not snapshots:
        return False
    latest = snapshots[-1]
    if not latest.gpus:
        return False
    last = last_run if last_run is not None else last_run_at(latest)
    if last is not None and latest.at - last < pc.interval_seconds:
        return False
    since = latest.mono - pc.idle_seconds
    if snapshots[0].mono > since:
        return False  # not enough history to call the GPU idle
    for snap in snapshots:
        if snap.mono < since:
            continue
        if engine_has_work(snap) is not False:
            return False
        for g in latest.gpus:
            busy = gpu_busy(snap, g.index)
            if busy is None or busy > pc.idle_busy_max:
                return False
    return True


def must_stop(snap: Snapshot, cfg: Config | ProbeConfig) -> bool:
    """Return whether a running scheduled probe must be cancelled: an engine has (or may have) work."""
    return engine_has_work(snap) is not False


def self_check_url(cfg: Config) -> str | None:
    """Return this sidecar's own /metrics URL for the probe to check, or None when it cannot."""
    if not cfg.probe.check_self or cfg.web.tls_cert_file or cfg.web.basic_auth_file:
        return None
    host = cfg.web.address
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "[::1]"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{cfg.web.port}/metrics"


def probe_command(pc: ProbeConfig, check_url: str | None = None, python: str | None = None) -> list[str]:
    """Return the argv of one scheduled probe run (on CUDA device 0 of the environment's GPUs)."""
    cmd = [
        python or sys.executable,
        "-m",
        "exporter",
        "probe",
        "--json",
        "--gpu",
        "0",
        "--no-matmul",
        "--buffer-gib",
        "2",
    ]
    if pc.duty:
        cmd += ["--duty", ",".join(f"{d:g}" for d in pc.duty), "--seconds", f"{pc.phase_seconds:g}"]
    else:
        cmd += ["--duty", "none"]
    if check_url:
        cmd += ["--check-url", check_url]
    return cmd


def probe_env(gpu_uuid: str | None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return the subprocess environment: pinned to one GPU by UUID, never auto-starting an agent twice."""
    env = dict(os.environ if base is None else base)
    if gpu_uuid:
        uuid = gpu_uuid if gpu_uuid.upper().startswith(("GPU-", "MIG-")) else f"GPU-{gpu_uuid}"
        env["CUDA_VISIBLE_DEVICES"] = uuid
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env.pop("BOUNDWATCH_AGENT", None)  # the probe attaches the agent itself when it checks /metrics
    return env


def parse_output(returncode: int | None, stdout: str, stderr: str = "") -> dict[str, Any]:
    """Return the probe's JSON result from its stdout, or an error result saying what went wrong."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                result = json.loads(line)
            except json.JSONDecodeError:
                break
            if isinstance(result, dict):
                result.setdefault("finished_at", time.time())
                return result
    tail = (stderr.strip().splitlines() or [""])[-1][:300]
    return logic.unavailable(
        f"probe subprocess exited {returncode} without a result" + (f": {tail}" if tail else ""),
        finished_at=time.time(),
    )


def run_probe(
    gpu_uuid: str | None, cfg: Config | ProbeConfig, check_url: str | None = None
) -> dict[str, Any]:
    """Run one probe in a subprocess and return its result (blocking; for threads and tests)."""
    pc = _probe_cfg(cfg)
    try:
        proc = subprocess.run(
            probe_command(pc, check_url),
            env=probe_env(gpu_uuid),
            capture_output=True,
            text=True,
            timeout=pc.timeout_seconds,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired:
        return logic.unavailable(f"probe timed out after {pc.timeout_seconds:g} s", finished_at=time.time())
    return parse_output(proc.returncode, proc.stdout, proc.stderr)


async def run_probe_async(
    gpu_uuid: str | None, cfg: Config | ProbeConfig, check_url: str | None = None
) -> dict[str, Any]:
    """Run one probe in a subprocess without blocking the event loop; cancelling kills the subprocess."""
    pc = _probe_cfg(cfg)
    proc = await asyncio.create_subprocess_exec(
        *probe_command(pc, check_url),
        env=probe_env(gpu_uuid),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=pc.timeout_seconds)
    except TimeoutError:
        _kill(proc)
        await proc.wait()
        return logic.unavailable(f"probe timed out after {pc.timeout_seconds:g} s", finished_at=time.time())
    except asyncio.CancelledError:
        _kill(proc)
        with contextlib.suppress(Exception):
            await asyncio.shield(proc.wait())
        raise
    return parse_output(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))


def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def record(
    state: Mapping[str, ProbeSummary], gpu: str, result: Mapping[str, Any]
) -> Mapping[str, ProbeSummary]:
    """Return Snapshot.probe with one GPU's entry replaced by the summary of its latest result."""
    new = dict(state)
    new[gpu] = logic.summarize(result)
    return MappingProxyType(new)


Runner = Callable[[str | None, Config, str | None], Awaitable[dict[str, Any]]]


class ProbeScheduler:
    """Drive the scheduled probe from the daemon's tick loop and hold what goes in Snapshot.probe.

    Call `tick(history)` once per tick, inside the event loop, after the newest Snapshot is in
    `history`; put its return value in `Snapshot.probe`. It starts the probe (one GPU after the
    other, each in a subprocess) when `should_run_probe` says so, cancels it as soon as an engine
    has work, and records each GPU's summary. `close()` at shutdown.
    """

    def __init__(self, cfg: Config, runner: Runner | None = None) -> None:
        self.cfg = cfg
        self.state: Mapping[str, ProbeSummary] = NO_PROBE
        self.started_at: float | None = None
        self.runs = 0
        self._runner: Runner = runner or run_probe_async
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        """Return whether a probe is in flight."""
        return self._task is not None and not self._task.done()

    def tick(self, history: Sequence[Snapshot]) -> Mapping[str, ProbeSummary]:
        """Start, watch or cancel the probe for this tick; return the mapping for Snapshot.probe."""
        if not history:
            return self.state
        latest = history[-1]
        if self.running:
            if must_stop(latest, self.cfg):
                assert self._task is not None
                self._task.cancel()
        elif should_run_probe(history, self.cfg, last_run=self.started_at):
            self.started_at = latest.at  # the snapshots' clock, which should_run_probe compares with
            self.runs += 1
            targets = [(str(g.index), g.uuid) for g in latest.gpus]
            self._task = asyncio.get_running_loop().create_task(self._run(targets))
        return self.state

    async def _run(self, targets: Sequence[tuple[str, str]]) -> None:
        url = self_check_url(self.cfg)
        for label, uuid in targets:
            try:
                result = await self._runner(uuid, self.cfg, url)
            except asyncio.CancelledError:
                self.state = record(
                    self.state,
                    label,
                    logic.unavailable("cancelled: an engine got work", finished_at=time.time()),
                )
                raise
            self.state = record(self.state, label, result)

    async def close(self) -> None:
        """Cancel a probe in flight and wait until its subprocess is gone."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
