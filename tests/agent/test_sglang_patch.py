"""SGLang's way in against a small SGLang-shaped package: HookRegistry hooks on run_batch and _forward_raw."""

import json
import socket
import subprocess
import sys
from pathlib import Path

from exporter import wire
from exporter.config import AgentFeedConfig
from exporter.sources.agent_feed import AgentFeed
from tests.agent import fake_sglang
from tests.agent.fresh import fresh_env

ROOT = Path(__file__).resolve().parents[2]

CODE = """
import json, os
from sglang.srt.managers.scheduler import run_scheduler_process
run_scheduler_process(None, None, 0, 0, 0, None, None)
from exporter import agent
a = agent.current()
role = a.settings.role
agent.stop()
print(json.dumps({"pid": os.getpid(), "role": role}))
"""


def test_scheduler_steps_counts_and_graph_modes_reach_the_feed(tmp_path: Path) -> None:
    env = fresh_env(tmp_path, [fake_sglang])
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(str(tmp_path / "agent.sock"))
    try:
        r = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout.strip().splitlines()[-1])
        rx.setblocking(False)
        datagrams = []
        while True:
            try:
                datagrams.append(rx.recv(wire.MAX_DATAGRAM_BYTES))
            except BlockingIOError:
                break
    finally:
        rx.close()
    assert out["role"] == "sglang_scheduler"
    feed = AgentFeed(AgentFeedConfig(socket=str(tmp_path / "unused.sock")))
    for d in datagrams:
        feed.receive(d)
    (steps,) = feed.collect().steps
    assert (steps.pid, steps.engine, steps.steps) == (out["pid"], "sglang", 4)
    assert steps.tokens == 900 + 3 * 2 and steps.seqs == 2 + 3 * 2
    assert (steps.graph_steps, steps.eager_steps) == (3, 1)
    assert (steps.running, steps.waiting, steps.max_num_seqs, steps.dp_rank) == (2.0, 0.0, 32, 0)
    # left rule: 2 waiting after the prefill until the first decode; 2 running over the three decode gaps
    assert 0 < steps.waiting_seconds < steps.running_seconds


def test_only_the_first_attention_tp_pipeline_and_context_rank_speaks_for_sglang_steps(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """As SGLang's scheduler decides (pp_rank, attn_tp_rank and attn_cp_rank all 0): one speaker a DP rank."""
    import types

    from exporter.agent import plugins

    class Unpublished:
        def __getattr__(self, name: str) -> int:
            raise RuntimeError(f"{name} not published yet")  # as SGLang's ParallelContext does

    ctx: dict[str, object] = {}
    monkeypatch.setitem(
        sys.modules, plugins.SGLANG_SCHEDULER, types.SimpleNamespace(get_parallel=lambda: ctx["p"])
    )

    def place(**fields: object) -> tuple[bool, int]:
        ctx["p"] = types.SimpleNamespace(**fields)
        return plugins._sglang_place(object())

    assert place(attn_tp_rank=0, pp_rank=0, attn_cp_rank=0, dp_rank=2) == (True, 2)
    assert place(attn_tp_rank=0, pp_rank=1, attn_cp_rank=0, dp_rank=2)[0] is False  # a later pipeline stage
    assert place(attn_tp_rank=0, pp_rank=0, attn_cp_rank=1)[0] is False  # a context-parallel peer
    assert place(attn_tp_rank=3, pp_rank=0)[0] is False
    assert place(attn_tp_rank=0, dp_rank=None, attn_dp_rank=1) == (True, 1)  # DP attention
    ctx["p"] = Unpublished()
    scheduler = types.SimpleNamespace(tp_rank=0, pp_rank=0, dp_rank=3)
    assert plugins._sglang_place(scheduler) == (True, 3)  # falls back to the scheduler's own fields
