"""Ways in: the autostart hook is inert without BOUNDWATCH_AGENT; the .pth line is one valid statement."""

import os
import subprocess
import sys
from pathlib import Path

from exporter.agent.plugins import PTH_LINE

ROOT = Path(__file__).resolve().parents[2]


def run_with_pth(tmp_path: Path, env_value: str | None, code: str) -> subprocess.CompletedProcess[str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "boundwatch_agent.pth").write_text(PTH_LINE)
    # a sitecustomize adds our site dir the way site-packages is added, so the .pth runs at start-up
    (site / "sitecustomize.py").write_text(f"import site; site.addsitedir({str(site)!r})\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOUNDWATCH")}
    env["PYTHONPATH"] = f"{site}{os.pathsep}{ROOT}"
    if env_value is not None:
        env["BOUNDWATCH_AGENT"] = env_value
        env["BOUNDWATCH_AGENT_SOCKET"] = str(tmp_path / "agent.sock")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_pth_does_nothing_when_boundwatch_agent_is_unset(tmp_path: Path) -> None:
    r = run_with_pth(tmp_path, None, "import sys; print('exporter.agent' in sys.modules)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_pth_waits_for_torch_before_starting(tmp_path: Path) -> None:
    code = (
        "import sys; from exporter import agent; from exporter.agent import importhook; "
        "print(agent.current() is None, 'torch' in importhook.waiting())"
    )
    r = run_with_pth(tmp_path, "1", code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True True"


def test_pth_now_starts_at_interpreter_start_and_the_process_runs_normally(tmp_path: Path) -> None:
    code = "from exporter import agent; a = agent.current(); print(None if a is None else a.state)"
    r = run_with_pth(tmp_path, "now", code)
    assert r.returncode == 0, r.stderr
    # started by the .pth line before this code ran: running, or unavailable where the machine lacks a part
    assert r.stdout.strip() in {"running", "unavailable"}, r.stdout


def test_vllm_plugin_does_nothing_without_vllm() -> None:
    from exporter.agent import plugins

    plugins.vllm_plugin()
    plugins.sglang_plugin()
    assert "vllm" not in sys.modules


def test_sglang_plugin_starts_the_agent_only_inside_the_scheduler_process(
    monkeypatch, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    import pytest

    pytest.importorskip("numpy")
    from exporter import agent
    from exporter.agent import plugins

    monkeypatch.setenv("BOUNDWATCH_AGENT_SOCKET", str(tmp_path / "agent.sock"))
    plugins.sglang_plugin()  # the launcher, a detokenizer: nothing starts
    assert agent.current() is None

    def run_scheduler_process() -> None:
        plugins.sglang_plugin()

    try:
        run_scheduler_process()
        a = agent.current()
        assert a is not None and a.settings.role == "sglang_scheduler"
    finally:
        agent.stop()
