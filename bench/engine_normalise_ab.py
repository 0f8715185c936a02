"""CPU of reading and normalising one engine page, before (the source normalised) and after (analysis does), paired.

    python3 bench/engine_normalise_ab.py [--base main] [--rounds 12] [--out bench/results/engine_normalise_ab.json]

Before: `exporter/sources/engine.py` of `--base` (read by `git show`, loaded beside this checkout's
other modules, which it calls the same way; a commit from before session 8, when that one file
held the page's reading), whose `reading_from_bytes` / `reading_from_multiproc`
cut, parse, bound and normalise in the source. After: this checkout's `raw_from_bytes` /
`raw_from_multiproc` (`sources/engine_scrape.py`: the raw reading) and `analysis.engine_page.read_raw` (normalise and step
count), plus `sampling.retire` (the raw page dropped from the Snapshot before the newest). Inputs:
the bench's 72 KB vLLM page (`bench/results/engine_sample_page.prom`) and a multiprocess dir
written by 4 API-server processes (`engine_sample.write_files`). One tick's pipeline
(`pipeline.advance` over a 20-tick history) is timed both ways too. Each round times a block of
calls of each side, the order alternating round by round; CPU ms per call (`time.process_time`).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "fakes" / "engine"))

from bench.engine_sample import write_files  # noqa: E402
from exporter.analysis import engine_page, pipeline  # noqa: E402
from exporter.config import Config  # noqa: E402
from exporter.sampling import retire  # noqa: E402
from exporter.snapshot import Snapshot  # noqa: E402
from exporter.snapshot.totals import EMPTY  # noqa: E402
from exporter.sources import engine_scrape as new  # noqa: E402

PAGE = ROOT / "bench" / "results" / "engine_sample_page.prom"


def load_base(base: str) -> Any:
    """Return the engine source module of another commit, as a module beside this checkout's packages."""
    text = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{base}:exporter/sources/engine.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "engine_base.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("engine_base", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["engine_base"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def block_ms(fn: Callable[[], object], n: int) -> float:
    """Return CPU ms per call over a block of n calls."""
    t0 = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - t0) / n * 1e3


def paired(before: Callable[[], object], after: Callable[[], object], rounds: int, n: int) -> dict[str, Any]:
    """Time both sides round by round, alternating which goes first; return medians and the paired ratio."""
    b, a = [], []
    for r in range(rounds):
        for side in ("b", "a") if r % 2 == 0 else ("a", "b"):
            (b if side == "b" else a).append(block_ms(before if side == "b" else after, n))
    ratios = [x / y for x, y in zip(a, b, strict=True)]
    return {
        "before_ms_median": round(statistics.median(b), 4),
        "after_ms_median": round(statistics.median(a), 4),
        "after_over_before_median": round(statistics.median(ratios), 4),
        "after_over_before_min_max": [round(min(ratios), 4), round(max(ratios), 4)],
        "before_ms": [round(x, 4) for x in b],
        "after_ms": [round(x, 4) for x in a],
        "calls_per_block": n,
    }


def tick_pair(base: Any, data: bytes, cfg: Config) -> tuple[Callable[[], object], Callable[[], object]]:
    """Return one tick's read + pipeline (+ retire), before and after, each over its own 20-tick history."""
    state = {"b": [], "a": []}  # type: dict[str, list[Snapshot]]

    def tick(side: str, reading: Any) -> None:
        hist = state[side]
        seq = len(hist) + 1
        raw = Snapshot(seq, 1000.0 + seq / 2, seq / 2, 0.5, 0.5 if hist else 0.0, engines=(reading,))
        snap = pipeline.advance(hist, raw, cfg)
        if hist:
            hist[-1] = retire(hist[-1]) if side == "a" else dataclasses.replace(hist[-1], totals=EMPTY)
        hist.append(snap)
        del hist[:-20]

    def before() -> None:
        tick("b", base.reading_from_bytes(data, name="vllm:8000"))

    def after() -> None:
        tick("a", new.raw_from_bytes(data, name="vllm:8000"))

    return before, after


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="main")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "engine_normalise_ab.json"))
    args = ap.parse_args()
    base = load_base(args.base)
    data = PAGE.read_bytes()
    cfg = Config()
    assert dataclasses.replace(
        engine_page.read_raw(new.raw_from_bytes(data)), raw=None
    ) == base.reading_from_bytes(data)
    results: dict[str, Any] = {}
    results["page_72kb"] = paired(
        lambda: base.reading_from_bytes(data, name="vllm:8000"),
        lambda: engine_page.read_raw(new.raw_from_bytes(data, name="vllm:8000")),
        args.rounds,
        100,
    )
    with tempfile.TemporaryDirectory() as mp_dir:
        write_files(mp_dir, servers=4, engines=1)
        old_reader, new_reader = base.MultiprocReader(mp_dir), new.MultiprocReader(mp_dir)
        results["multiproc_4_servers"] = paired(
            lambda: base.reading_from_multiproc(old_reader, name="vllm:8000"),
            lambda: engine_page.read_raw(new.raw_from_multiproc(new_reader, name="vllm:8000")),
            args.rounds,
            200,
        )
    before, after = tick_pair(base, data, cfg)
    results["tick_page_72kb_advance_retire"] = paired(before, after, args.rounds, 50)
    out = {
        "bench": "engine_normalise_ab",
        "base": subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", args.base], capture_output=True, text=True
        ).stdout.strip(),
        "head": subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, no GPU",
        "rounds": args.rounds,
        "results": results,
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    for name, r in results.items():
        print(
            f"{name}: before {r['before_ms_median']} ms, after {r['after_ms_median']} ms, "
            f"after/before {r['after_over_before_median']} ({r['after_over_before_min_max']})"
        )


if __name__ == "__main__":
    main()
