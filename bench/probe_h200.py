"""Run the probe on a GPU machine: standalone, then end-to-end through a real sidecar's /metrics.

    python bench/probe_h200.py [--out bench/results/probe_h200.json] [--sidecar] [--seconds S]

Standalone: `boundwatch probe` (bandwidth, matmul, duty 0.25/0.5/0.9 against in-process NVML/GPM).
With --sidecar: start `python -m exporter run` here, wait for /metrics, then run
`boundwatch probe --no-bandwidth --no-matmul --check-url ...` (the agent attaches when it exists),
so the sidecar's busy counters are compared with the in-kernel truth. Writes one JSON file.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

PORT = 9482


def probe(args: list[str], timeout: float) -> dict:
    """Run `python -m exporter probe --json ARGS` and return its result plus exit code."""
    cmd = [sys.executable, "-m", "exporter", "probe", "--json", *args]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    sys.stderr.write(proc.stderr[-3000:])
    try:
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        result = {"status": "error", "message": "no JSON", "stdout": proc.stdout[-2000:]}
    result["command"] = " ".join(["boundwatch", "probe", "--json", *args])
    result["process_exit_code"] = proc.returncode
    result["wall_seconds"] = time.time() - t0
    return result


def wait_metrics(url: str, seconds: float, proc: subprocess.Popen) -> bool:
    """Wait until the sidecar serves a page with GPU busy counters (False if it died)."""
    deadline = time.time() + seconds
    while time.time() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if b"boundwatch_gpu_observed_seconds_total" in r.read():
                    return True
        except OSError:
            pass
        time.sleep(0.25)
    return False


def main() -> int:
    """Run the probes and write the results file."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/probe_h200.json")
    ap.add_argument("--sidecar", action="store_true", help="also run the end-to-end self-test")
    ap.add_argument("--standalone", action="store_true", help="run the standalone probe")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument(
        "--settle", type=float, default=None, help="default: the probe's (3 s with a sidecar, else 1)"
    )
    ap.add_argument("--duty", default="0.25,0.5,0.9")
    a = ap.parse_args()
    report: dict = {
        "machine": platform.node(),
        "python": platform.python_version(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gpu": subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,clocks.max.sm,power.limit",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
        ).stdout.strip(),
    }
    common = ["--duty", a.duty, "--seconds", str(a.seconds)]
    if a.settle is not None:
        common += ["--settle", str(a.settle)]
    if a.standalone:
        report["standalone"] = probe(common, timeout=300)
    if a.sidecar:
        url = f"http://127.0.0.1:{PORT}/metrics"
        log = open(Path(os.environ.get("OUT", "/tmp")) / "sidecar.log", "w")
        side = subprocess.Popen(
            [sys.executable, "-m", "exporter", "run", "--port", str(PORT), "--address", "127.0.0.1"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            report["sidecar_ready"] = wait_metrics(url, 30, side)
            report["end_to_end"] = probe(
                ["--no-bandwidth", "--no-matmul", "--check-url", url, *common], timeout=300
            )
        finally:
            side.terminate()
            side.wait(10)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(report, indent=2) + "\n")
    for key in ("standalone", "end_to_end"):
        r = report.get(key)
        if not r:
            continue
        print(f"== {key}: {r.get('status')} (exit {r.get('process_exit_code')}): {r.get('message')}")
        bw = r.get("bandwidth")
        if bw:
            print(
                f"   copy {bw['bytes_per_second'] / 1e9:.0f} GB/s, torch copy_ {bw['torch_copy_bytes_per_second'] / 1e9:.0f}"
                f" GB/s, ratio {bw['ratio_to_torch']:.4f}, of nominal {bw['ratio_to_nominal']}"
            )
        mm = r.get("matmul")
        if mm:
            print(
                f"   matmul {mm['flops_per_second'] / 1e12:.0f} TFLOP/s, torch {mm['torch_flops_per_second'] / 1e12:.0f},"
                f" rel err {mm['relative_error_vs_torch']:.1e}"
            )
        for ph in (r.get("duty") or {}).get("phases", []):
            srcs = {s: round(v["busy_ratio"], 4) for s, v in (ph.get("sources") or {}).items()}
            loc = {s: round(v["busy_ratio"], 4) for s, v in (ph.get("local_sources") or {}).items()}
            print(
                f"   duty {ph['target']}: truth {ph.get('truth', 0):.4f} steady {ph.get('truth_steady', 0):.4f}"
                f" bursts {ph.get('bursts')} primary {ph.get('primary_source')} {srcs} local {loc} pass {ph.get('pass')}"
            )
        print("   agent:", r.get("agent"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
