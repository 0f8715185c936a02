"""End to end: boundwatch demo -> a real Prometheus with the shipped rules -> a real Alertmanager -> a webhook.

The rules are the shipped ones rendered by tools/gen_alerts.py with second-long windows. Three targets:
- demo A: GPU 0 GPU-bound, then host-bound (saturated API server, requests running), then GPU-bound
  again; GPU 1 idle all along;
- demo B: NVML disabled by configuration (`--no-nvml`), GPU-bound on CUPTI;
- the real daemon on this machine (no GPU here: NVML is absent hardware).
The page must reach the receiver during A's host-bound phase, for GPU 0 only, and resolve after it;
B, the real daemon and A's idle GPU page nothing, and no BoundwatchSourceDown fires anywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.fakes.promql import gen_alerts
from tests.fakes.promserver import (
    PROMETHEUS,
    _stop,
    _wait_http,
    free_port,
    running_daemon,
    running_demo,
    running_prometheus,
)
from tests.fakes.wait import wait_until

ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
PAGE = "BoundwatchGPUStarvedWhileWorkPending"
PHASE = 24.0  # seconds per demo phase: gpu, host, gpu
SHORT = {
    "rate_window": "8s",
    "page_for": "3s",
    "api_server_for": "3s",
    "throttling_for": "3s",
    "graph_fallback_for": "3s",
    "clock_for": "3s",
    "source_down_for": "3s",
    "agent_missing_for": "3s",
    "agent_lookback": "1m",
    "down_for": "3s",
}

pytestmark = [
    pytest.mark.prometheus,
    pytest.mark.skipif(PROMETHEUS is None or ALERTMANAGER is None, reason="prometheus/alertmanager missing"),
]


class Receiver:
    """An aiohttp webhook receiver on loopback, in its own thread, keeping every notification."""

    def __init__(self) -> None:
        self.port = free_port()
        self.notifications: list[tuple[float, dict[str, Any]]] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    async def _hook(self, request: web.Request) -> web.Response:
        body = await request.read()
        if len(body) <= 1 << 20:
            self.notifications.append((time.monotonic(), json.loads(body)))
        return web.Response(text="ok")

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/hook", self._hook)
        runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())

    def __enter__(self) -> Receiver:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def alerts(self) -> list[tuple[float, str, dict[str, Any]]]:
        """Return (received at, status, alert) for every alert of every notification."""
        return [(t, a["status"], a) for t, n in self.notifications for a in n["alerts"]]


@contextlib.contextmanager
def running_alertmanager(workdir: Path, hook: str) -> Iterator[str]:
    """Run Debian's Alertmanager routing everything to a webhook, grouped per alert, GPU and host."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = {
        "route": {
            "receiver": "hook",
            "group_by": ["alertname", "instance", "gpu"],
            "group_wait": "1s",
            "group_interval": "1s",
            "repeat_interval": "1h",
        },
        "receivers": [{"name": "hook", "webhook_configs": [{"url": hook, "send_resolved": True}]}],
    }
    (workdir / "alertmanager.yml").write_text(json.dumps(config))
    port = free_port()
    log = workdir / "alertmanager.log"
    args = [
        str(ALERTMANAGER),
        f"--config.file={workdir / 'alertmanager.yml'}",
        f"--storage.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
        "--log.level=warn",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, cwd=workdir, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_http(proc, f"http://127.0.0.1:{port}/-/ready", log, 30.0)
        yield f"127.0.0.1:{port}"
    finally:
        _stop(proc)


@pytest.mark.timeout(170)
def test_page_reaches_the_receiver_in_the_host_bound_phase_and_resolves_after(tmp_path: Path) -> None:
    """Deliver the GPU-starved page for demo A's GPU 0 while it is host-bound, resolve it after, page nothing else."""
    rules = tmp_path / "boundwatch.rules.yml"
    rules.write_text(gen_alerts().render(SHORT))
    phases = ["--phases", "gpu,host,gpu", "--no-stagger", "--phase-seconds", str(PHASE)]
    with (
        Receiver() as receiver,
        running_alertmanager(tmp_path / "am", f"http://127.0.0.1:{receiver.port}/hook") as am,
        running_demo(tmp_path / "a", "--gpus", "1", "--idle-gpus", "1", *phases) as (demo_a, started),
        running_demo(tmp_path / "b", "--no-nvml", "--gpus", "1", "--phases", "gpu") as (demo_b, _),
        running_daemon(tmp_path / "real") as real,
        running_prometheus(
            tmp_path / "prom", {"boundwatch": [demo_a, demo_b, real.target]}, [rules], alertmanagers=[am]
        ) as prom,
    ):
        host_from, host_to = started + PHASE, started + 2 * PHASE
        pages = lambda status: [  # noqa: E731
            (t, a) for t, s, a in receiver.alerts() if a["labels"]["alertname"] == PAGE and s == status
        ]
        fired = wait_until(lambda: pages("firing"), 3 * PHASE, 0.25, "the page at the receiver")
        resolved = wait_until(lambda: pages("resolved"), 2 * PHASE, 0.25, "the page resolved at the receiver")
        time.sleep(2)  # anything else in flight arrives
        # Prometheus saw B without any nvml series, and the real daemon's nvml down as absent hardware.
        assert not prom.query(f'boundwatch_source_up{{instance="{demo_b}",source="nvml"}}')["data"]["result"]
        assert prom.query(f'boundwatch_source_up{{instance="{real.target}",source="nvml"}} == 0')["data"][
            "result"
        ]
        assert prom.query(f'boundwatch_demo{{instance="{demo_a}"}} == 1')["data"]["result"]

    first_fire, alert = fired[0]
    assert alert["labels"]["instance"] == demo_a and alert["labels"]["gpu"] == "0"
    assert alert["labels"]["severity"] == "critical" and "source" not in alert["labels"]
    assert host_from < first_fire < host_to, (first_fire - started, PHASE)
    assert resolved[0][0] > host_to and resolved[0][0] > first_fire
    received = receiver.alerts()
    assert {
        (a["labels"]["instance"], a["labels"].get("gpu"))
        for _, _, a in received
        if a["labels"]["alertname"] == PAGE
    } == {(demo_a, "0")}
    others = {(a["labels"]["alertname"], a["labels"].get("instance")) for _, _, a in received}
    assert not [o for o in others if o[1] in (demo_b, real.target)], others
    assert not [o for o in others if o[0] == "BoundwatchSourceDown"], others
