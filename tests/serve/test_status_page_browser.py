"""The status page in a real browser: Debian's headless Chromium loads / from the real daemon in demo mode.

`make system-deps` installs Chromium; without it this test is skipped. Set BOUNDWATCH_SCREENSHOT=PATH
to keep the screenshot (docs/status-page.png is made that way).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import time
from pathlib import Path

import pytest

from exporter.serve.statuspage import REASON_TEXT
from tests.fakes.pagedom import Node, parse
from tests.fakes.promserver import http_get, running_demo

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium (make system-deps installs it)")

PHASE_SECONDS = 6.0  # idle -> gpu -> host -> quota -> graph: one cycle in 30 s
WINDOW_SECONDS = 40  # the history the page draws: the whole cycle and then some
CYCLING_GPUS = 4


def chromium(workdir: Path, *args: str, timeout: float = 90.0) -> str:
    """Run headless Chromium with a profile of its own in workdir; return its stdout."""
    assert CHROMIUM is not None
    profile = workdir / "chromium-profile"
    argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
    argv += ["--no-first-run", "--hide-scrollbars", f"--user-data-dir={profile}", *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _phases_seen(snapshot: dict, seen: set[tuple[str, str]]) -> None:
    for v in snapshot["verdicts"]:
        first = v["reasons"][0] if v["verdict"] == "host" and v["reasons"] else ""
        seen.add((v["verdict"], first))


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


@pytest.mark.timeout(300)
def test_a_person_sees_each_gpu_its_timeline_and_why_it_is_host_bound(tmp_path: Path) -> None:
    """Run the demo through a whole cycle, then check what Chromium shows and take the screenshot."""
    config = tmp_path / "boundwatch.toml"
    config.write_text(f"history_seconds = {WINDOW_SECONDS}\n")
    flags = ["--gpus", str(CYCLING_GPUS), "--idle-gpus", "1", "--phase-seconds", str(PHASE_SECONDS)]
    with running_demo(tmp_path / "demo", *flags, "--config", str(config)) as (target, started):
        base = f"http://{target}"
        wanted = {
            ("idle", ""),
            ("gpu", ""),
            ("host", "api_server_saturated"),
            ("host", "cpu_quota_throttled"),
            ("host", "cuda_graph_fallback"),
        }
        seen: set[tuple[str, str]] = set()
        full = started + max(5 * PHASE_SECONDS, WINDOW_SECONDS) + 1  # a whole cycle, and a full window
        changes: list[tuple[float, str]] = []  # GPU 0's verdict changes after that
        while time.monotonic() < full + 2 * PHASE_SECONDS + 10:
            snapshot = json.loads(http_get(f"{base}/api/snapshot")[1])
            _phases_seen(snapshot, seen)
            now, verdict = time.monotonic(), snapshot["verdicts"][0]["verdict"]
            if now > full and (not changes or changes[-1][1] != verdict):
                changes.append((now, verdict))
            # Look a third of a phase after a change (Chromium's start adds a second or more): mid-phase.
            if wanted <= seen and len(changes) >= 2 and now > changes[-1][0] + PHASE_SECONDS / 3:
                break
            time.sleep(0.25)
        assert wanted <= seen, f"the demo never showed {wanted - seen}"
        shot = Path(os.environ.get("BOUNDWATCH_SCREENSHOT") or tmp_path / "status-page.png").resolve()
        chromium(tmp_path, f"--screenshot={shot}", "--window-size=1400,900", f"{base}/")
        dom_text = chromium(tmp_path, "--dump-dom", f"{base}/")

    dom = parse(dom_text)
    assert "DEMO DATA" in dom.find(id="banner").text()
    rows = {int(r.attrs["data-gpu"]): r for r in dom.find_all("div", "gpu")}
    assert sorted(rows) == list(range(CYCLING_GPUS + 1))
    grid = [c for c in dom.find("div", "grid").children if isinstance(c, Node)]
    timelines = {g: grid[grid.index(row) + 1].find("svg", "timeline") for g, row in rows.items()}
    evidence = {g: grid[grid.index(row) + 2].find("dl", "evidence") for g, row in rows.items()}

    # The GPU that never gets work stays idle the whole window.
    assert rows[CYCLING_GPUS].attrs["data-verdict"] == "idle"
    assert {s.attrs["data-verdict"] for s in timelines[CYCLING_GPUS].find_all("rect", "seg")} == {"idle"}

    # Each cycling GPU's timeline went through idle, GPU-bound and host-bound; the reasons are on it.
    titles = []
    for g in range(CYCLING_GPUS):
        segs = timelines[g].find_all("rect", "seg")
        assert {"idle", "gpu", "host"} <= {s.attrs["data-verdict"] for s in segs}, g
        titles += [s.text() for s in segs]
        assert timelines[g].find("path", "busy").attrs["d"].startswith("M")
    for reason in ("API server saturated", "CPU quota throttled", "CUDA graphs not used"):
        assert any(t.startswith(f"host-bound: {reason}") for t in titles), reason

    # A host-bound GPU now: its verdict, its reasons in words, and the headline naming it.
    host = [g for g, row in rows.items() if row.attrs["data-verdict"] == "host"]
    assert host, "with 4 GPUs staggered over 5 phases, at least two are host-bound at any time"
    for g in host:
        assert rows[g].find("span", "verdict").text() == "host-bound"
        shown = rows[g].find("div", "reasons").text()
        assert shown and all(part in REASON_TEXT.values() for part in shown.split(", ")), shown
        assert f"GPU {g}: " in dom.find(id="headline").text()
        assert any("hot" in dd.attrs.get("class", "") for dd in evidence[g].find_all("dd"))

    # The evidence beside each GPU, as numbers a person reads.
    for g in rows:
        values = {dd.attrs["data-evidence"]: dd.text() for dd in evidence[g].find_all("dd")}
        assert set(values) == {"busy", "queue", "api", "quota", "graphs", "power"}
        assert re.fullmatch(r"\d+% \(gpm\)", values["busy"]), values["busy"]
        assert re.fullmatch(r"busiest thread \d\.\d\d core", values["api"]), values["api"]
        assert re.fullmatch(r"\d+ W of 700 W", values["power"]), values["power"]

    # Never a command line: the demo's API servers run `python3 -m vllm.entrypoints... --model ...`.
    assert "vllm.entrypoints" not in dom_text and "--model" not in dom_text
    assert [e.text() for e in dom.find_all("li")] == [
        "nvml: up",
        "host: up",
        "engine: up",
        "agent: up",
    ]

    assert _png_size(shot) == (1400, 900)
    assert shot.stat().st_size > 20_000  # a drawn page, not a blank one
