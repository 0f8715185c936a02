"""`boundwatch agent-check`: a JSON verdict on CUPTI in this process, and the .pth installer."""

import argparse
import json
from pathlib import Path

import pytest

from exporter.agent.plugins import PTH_LINE
from exporter.commands import agent_check


def test_agent_check_says_why_cupti_cannot_start_here(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("numpy")
    try:
        from cupti import cupti

        cupti.get_timestamp()
        pytest.skip("CUPTI starts here; the GPU run covers that case")
    except Exception:
        pass
    args = argparse.Namespace(no_torch=True, socket=str(tmp_path / "agent.sock"), install_pth=None)
    rc = agent_check.run(args)
    out = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert out["can_start"] is False and out["state"] == "unavailable" and out["detail"]
    assert out["socket"].endswith("agent.sock") and out["sidecar_listening"] is False


def test_install_pth_writes_the_autostart_line(tmp_path: Path) -> None:
    path = agent_check.install_pth(str(tmp_path))
    assert Path(path).name == "boundwatch_agent.pth"
    assert Path(path).read_text() == PTH_LINE
    assert PTH_LINE.startswith("import ") and PTH_LINE.count("\n") == 1  # site runs one import line
