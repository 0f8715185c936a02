"""What a tick's CPU is made of at the daemon's cadence: the same work run hot (back to back) and cold (after a sleep).

The daemon sleeps most of each 0.5 s tick, and after a sleep the CPU's state for its code and data
may be gone (other processes ran, a VM's core was given to another guest). This bench runs,
in this process, each piece of work N times back to back (hot) and N times each after a
`time.sleep(--sleep)` (cold), the thread's CPU per run (utime + stime of the process, which runs no
other thread), less what a bare sleep's wake-up costs (measured the same way, alternating):

- `wake`: `time.sleep` alone, the cost of waking (kept as a figure of its own, subtracted from the rest);
- `null_tick`: the real `Sampler.tick()` with four sources whose reads are done at once and the
  pipeline's `advance` replaced by one that returns its input (the tick's own machinery);
- `advance`: the real pipeline `advance` on captured ticks of the real daemon (`--capture`, the
  pickles that `BW_COST_CAPTURE=PATH bench/sidecar_cost.py --gpus N` writes), each on its own
  captured history, one captured tick a run, in turn;
- `snapshot`: one `Snapshot(...)` built, the smallest piece of a tick's work;
- with `--capture`, `advance` timed alone after a sleep and an untimed step (`AFTER`): once on
  another captured tick (its code run, the data still cold), a 1.5 ms busy loop of none of its code,
  or 20 MB zeroed (the caches' data pushed out). Which of these removes the cold cost says whether it
  is the code's first run (branch predictors, instruction caches: as on a VM whose core ran other
  guests) or the data.

Cold over hot says how much of a tick's CPU is the cost of touching memory again after a sleep rather
than of the instructions; where it is large, cutting the objects a tick touches (and the threads that
wake) pays, and cutting instructions on hot paths pays little.

    .venv/bin/python bench/cold_tick.py --capture /tmp/cap.8 --out bench/results/cold_tick_vm.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pickle
import platform
import resource
import statistics
import sys
import time
from collections.abc import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def per_run(fn: Callable[[], object], runs: int, sleep: float) -> float:
    """Return the process CPU per run of fn, in us, with a sleep of `sleep` s before each (0: none)."""
    t0 = _cpu()
    for _ in range(runs):
        if sleep > 0:
            time.sleep(sleep)
        fn()
    return (_cpu() - t0) / runs * 1e6


def null_tick() -> Callable[[], None]:
    """Return one step of the real Sampler.tick() with null sources and an identity advance."""
    import exporter.sampling as sampling
    from exporter.config import load

    sampling.advance = lambda history, raw, cfg: raw  # type: ignore[assignment]
    loop = asyncio.new_event_loop()
    asyncio.events._set_running_loop(loop)  # tick() asks for the running loop: none runs

    class Done:
        def __init__(self, name: str) -> None:
            self.name = name

        async def read(self) -> None:
            return None

        def close(self) -> None:
            pass

        def start_read(self) -> asyncio.Future[None]:
            f = loop.create_future()
            f.set_result(None)
            return f

    cfg = load(overrides={"probe.enabled": False}, environ={})
    s = sampling.Sampler(cfg, [Done(n) for n in ("nvml", "host", "engine", "agent")])

    def one() -> None:
        step = s.tick()
        try:
            step.send(None)
        except StopIteration:
            return
        raise SystemExit("a null tick awaited")

    for _ in range(600):  # a full history, as the daemon's after two minutes
        one()
    return one


def advance_runs(path: str) -> Callable[[], None]:
    """Return a function that runs the real advance on the next captured tick (in turn)."""
    from bench.sidecar_cost import mappingproxy_of  # what the capture pickled its mapping fields with
    from exporter.analysis.pipeline import advance

    sys.modules["__main__"].mappingproxy_of = mappingproxy_of  # type: ignore[attr-defined]
    with open(path, "rb") as f:
        got = pickle.load(f)
    ticks, cfg = got["ticks"], got["cfg"]
    i = [0]

    def one() -> None:
        history, raw = ticks[i[0] % len(ticks)]
        i[0] += 1
        advance(history, raw, cfg)

    for _ in range(len(ticks)):
        one()
    return one


def timed_after(fn: Callable[[], object], runs: int, sleep: float, before: Callable[[], object]) -> float:
    """Return the thread's CPU of fn alone, in us a run, each run after a sleep and then `before` (untimed)."""
    total = 0.0
    for _ in range(runs):
        time.sleep(sleep)
        before()
        t = time.thread_time()
        fn()
        total += time.thread_time() - t
    return total / runs * 1e6


def spin(seconds: float) -> None:
    """Busy the CPU in a tiny Python loop (no code of the daemon's) for `seconds`."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


# What is cold after a sleep, for `advance` (timed alone, after an untimed step once awake):
# `after_first`: advance run once on another tick first (its code warm, this tick's data as cold as
# ever); `after_spin`: 1.5 ms of a tiny loop first (the CPU busy again, none of the daemon's code run);
# `after_memset`: 20 MB zeroed first (what the caches held pushed out, again none of its code run).
AFTER: dict[str, Callable[[Callable[[], None]], object]] = {
    "after_first": lambda one: one(),
    "after_spin": lambda one: spin(0.0015),
    "after_memset": lambda one: bytes(20_000_000),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--capture", help="BW_COST_CAPTURE pickle of the real daemon's ticks (for `advance`)")
    ap.add_argument("--sleep", type=float, default=0.1, help="the sleep before each cold run, s")
    ap.add_argument("--runs", type=int, default=40, help="runs per measurement")
    ap.add_argument("--rounds", type=int, default=5, help="rounds (hot and cold alternate within each)")
    ap.add_argument("--out", help="JSON results")
    args = ap.parse_args()
    if args.sleep <= 0 or args.runs < 1 or args.rounds < 1:
        ap.error("--sleep must be > 0, --runs and --rounds >= 1")
    from exporter.snapshot import Snapshot

    work: dict[str, Callable[[], object]] = {
        "null_tick": null_tick(),
        "snapshot": lambda: Snapshot(seq=1, at=0.0, mono=0.0, interval=0.5, dt=0.5),
    }
    if args.capture:
        work["advance"] = advance_runs(args.capture)
    rows: dict[str, dict[str, list[float]]] = {"wake": {"cold": []}}
    rows.update({name: {"hot": [], "cold": []} for name in work})
    if "advance" in work:
        rows["advance"].update({kind: [] for kind in AFTER})
    for r in range(args.rounds):
        wake = per_run(lambda: None, args.runs, args.sleep)
        rows["wake"]["cold"].append(wake)
        for name, fn in work.items():
            rows[name]["hot"].append(per_run(fn, args.runs, 0.0))
            rows[name]["cold"].append(per_run(fn, args.runs, args.sleep) - wake)
        if "advance" in work:
            one = work["advance"]
            for kind, before in AFTER.items():
                rows["advance"][kind].append(
                    timed_after(one, args.runs, args.sleep, lambda b=before, o=one: b(o))
                )
        print(f"round {r}: wake {wake:.1f} us; " + "; ".join(
            f"{n} hot {rows[n]['hot'][-1]:.1f} cold {rows[n]['cold'][-1]:.1f} us" for n in work
        ))  # fmt: skip
    summary = {
        name: {kind: round(statistics.median(v), 1) for kind, v in by.items()} for name, by in rows.items()
    }
    for s in summary.values():
        if "hot" in s and s["hot"] > 0:
            s["cold_over_hot"] = round(s["cold"] / s["hot"], 2)
    print("median us per run:", json.dumps(summary))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {
                    "bench": "cold_tick",
                    "argv": sys.argv[1:],
                    "host": platform.node(),
                    "python": platform.python_version(),
                    "cpus": os.cpu_count(),
                    "summary": summary,
                    "rounds": rows,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
