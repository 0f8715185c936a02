"""bench/light_agent_overhead.py runs where there is no torch or GPU: GPU parts skipped, CPU parts measured."""

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_light_overhead_bench_runs_without_a_gpu(tmp_path: Path) -> None:
    out = tmp_path / "light.json"
    r = subprocess.run(
        [sys.executable, str(ROOT / "bench/light_agent_overhead.py"), "--out", str(out), "--rounds", "1",
         "--seconds", "0.3"],
        capture_output=True, text=True, timeout=180, cwd=ROOT,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["order"] == ["none", "light"]
    light = next(x for x in data["runs"] if x["mode"] == "light")
    if "skipped" in light["gpu"]:
        assert "GPU workloads skipped" in light["gpu"]["skipped"]
    assert light["agent_mode"] == "light" and light["agent"]["state"] == "running"
    assert set(data["summary"]) >= {"cpu_steps", "pause"}
    assert data["summary"]["cpu_steps"]["none_per_s"] > 0 and data["messages_received"] >= 1


def _loop(per_s: float) -> dict:  # type: ignore[type-arg]
    return {"per_s": per_s, "max_us": 10.0}


def _pair(added_us: float) -> dict:  # type: ignore[type-arg]
    return {"raw_us": 1000.0, "added_us": added_us, "cost_pct": added_us / 10}


def _child(mode: str, decode_per_s: float, added_us: float) -> dict:  # type: ignore[type-arg]
    """A child's result as a GPU host gives it: timed loops and side-by-side pairs in both modes."""
    gpu = {"decode_b1": _loop(decode_per_s), "decode_b1_same_process": _pair(added_us), "eager": _loop(500.0)}
    return {
        "mode": mode,
        "gpu": gpu,
        "cpu_steps": _loop(2e5),
        "plain_cpu": _loop(2.5e5),
        "cpu_steps_same_process": _pair(added_us / 10),
        "pause": {"max_us": 100.0},
        "pause_after_decode": {"max_us": 200.0},
    }


def test_the_summary_of_gpu_runs_keeps_the_pairs_of_each_mode_apart_and_ratios_the_timed_loops() -> None:
    sys.path.insert(0, str(ROOT))
    from bench.light_agent_overhead import summarise

    runs = [_child("none", 700.0, 0.1), _child("light", 693.0, 1.0), _child("light", 693.0, 3.0)]
    runs.append(_child("none", 707.0, -0.1))
    s = summarise(runs)
    assert s["decode_b1"]["ratio"] == round(693.0 / 703.5, 5)  # medians of each mode's processes
    assert (
        s["decode_b1_same_process"]["added_us_median"] == 2.0
        and s["decode_b1_same_process"]["processes"] == 2
    )
    assert s["decode_b1_same_process_aa"]["added_us_median"] == 0.0  # the processes without the agent
    assert s["noise_none_vs_none"] == {"decode_b1": 1.01, "eager": 1.0, "cpu_steps": 1.0, "plain_cpu": 1.0}
    assert s["plain_cpu"]["ratio"] == 1.0 and s["pause"]["added_us"] == 0.0


def test_a_pause_is_named_by_the_collection_another_thread_ran_through_it() -> None:
    import gc
    import threading

    sys.path.insert(0, str(ROOT))
    from bench.light_agent_overhead import Spans, pause_attributed

    junk = [[i] for i in range(300_000)]  # a heap a full collection takes milliseconds over
    spans = Spans()
    stop = threading.Event()

    def collect() -> None:
        while not stop.wait(0.05):
            gc.collect()

    gc.callbacks.append(spans.on_gc)
    t = threading.Thread(target=collect, name="collector")
    t.start()
    try:
        p = pause_attributed(2.0, spans)  # 2 s: >= 5 collections even on a loaded 2-core machine
    finally:
        stop.set()
        t.join()
        gc.callbacks.remove(spans.on_gc)
    assert len(junk) == 300_000
    assert spans.what(0, 1) == "other"  # nothing overlapped the process's first nanosecond
    assert p["spans"]["gc2@collector"][0] >= 5
    assert any(what == "gc2@collector" for _, what in p["top"]), p["top"]
    assert p["over_100us_by_cause"].get("gc2@collector", 0) >= 1


def test_the_engine_like_probe_makes_its_call_and_names_the_agents_longest_gap() -> None:
    import threading

    sys.path.insert(0, str(ROOT))
    from bench.light_agent_overhead import Spans, pause_attributed

    class Agent:
        def tick(self) -> None:  # holds the GIL 2 ms, as a long tick would
            t = time.perf_counter_ns()
            while time.perf_counter_ns() - t < 2_000_000:
                pass

    a, spans, stop, calls = Agent(), Spans(), threading.Event(), [0]
    spans.wrap(a, "tick", "tick")

    def ticks() -> None:
        while not stop.wait(0.1):
            a.tick()

    t = threading.Thread(target=ticks, name="agent")
    t.start()
    try:
        p = pause_attributed(0.65, spans, call=lambda: calls.__setitem__(0, calls[0] + 1))
    finally:
        stop.set()
        t.join()
    assert calls[0] > 1000  # one call an iteration
    assert p["agent_max_us"] >= 2000, p["top"]
    assert p["over_100us_by_cause"].get("tick", 0) >= 3
    assert p["agent_max_us"] <= p["max_us"]
