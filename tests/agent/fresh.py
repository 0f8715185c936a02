"""Run agent code in a fresh interpreter beside the stand-in packages (torch, vLLM, SGLang) it needs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def fresh_env(
    tmp_path: Path, fakes: Iterable[ModuleType], env: dict[str, str] | None = None
) -> dict[str, str]:
    """Write each fake package under tmp_path/fake; return an environment that imports them and this tree.

    No BOUNDWATCH_* setting of the caller's leaks in; the agent's socket is tmp_path/agent.sock.
    """
    for fake in fakes:
        fake.write(tmp_path / "fake")
    full = {k: v for k, v in os.environ.items() if not k.startswith("BOUNDWATCH")}
    full["PYTHONPATH"] = f"{tmp_path / 'fake'}{os.pathsep}{ROOT}"
    full["BOUNDWATCH_AGENT_SOCKET"] = str(tmp_path / "agent.sock")
    full.update(env or {})
    return full


def run_fresh(
    tmp_path: Path,
    code: str,
    fakes: Iterable[ModuleType],
    env: dict[str, str] | None = None,
    timeout: float = 60,
) -> Any:
    """Run code with the fakes importable (fresh_env); assert it exits 0 and return the JSON it prints last."""
    r = subprocess.run(
        [sys.executable, "-c", code],
        env=fresh_env(tmp_path, fakes, env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


class ListSender:
    """The agent's sender, keeping each message it is handed in `sent` (for code run by run_fresh)."""

    dropped = sent_n = 0

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def next_seq(self) -> int:
        return 0

    def send(self, message: Any) -> None:
        self.sent.append(message)

    def encode(self, message: Any) -> Any:
        return message  # kept as the Message: the tests read its fields

    def send_data(self, data: Any, windows: int = 0) -> bool:
        self.sent.append(data)
        return True

    def close(self) -> None:
        pass
