"""`boundwatch agent-check`: say which libcupti and cupti-python this process would use and whether CUPTI starts.

Prints JSON; exit 0 when the agent could start CUPTI here, 1 when it could not (the JSON says why),
2 on a usage error. `--install-pth` also writes the BOUNDWATCH_AGENT autostart hook into
site-packages (or a given directory).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import sysconfig
import time
from typing import Any

from exporter.commands import ConfigFlags

HELP = "check the in-process CUPTI agent here: libcupti, cupti-python, whether CUPTI can start (JSON)"


def add_parser(subparsers: Any, config_flags: ConfigFlags) -> argparse.ArgumentParser:
    """Add the `agent-check` sub-command."""
    p = subparsers.add_parser("agent-check", help=HELP, description=__doc__)
    p.add_argument(
        "--no-torch", action="store_true", help="do not import torch first (torch brings its own libcupti)"
    )
    p.add_argument("--socket", default=None, help="agent socket to report on (default: the agent's default)")
    p.add_argument(
        "--install-pth",
        nargs="?",
        const="",
        default=None,
        metavar="DIR",
        help="write boundwatch_agent.pth (BOUNDWATCH_AGENT autostart) into DIR (default: site-packages)",
    )
    return p


def install_pth(directory: str | None = None) -> str:
    """Write the autostart .pth file and return its path."""
    from exporter.agent.plugins import PTH_LINE, PTH_NAME

    target = directory or sysconfig.get_paths()["purelib"]
    path = os.path.join(target, PTH_NAME)
    with open(path, "w") as fh:
        fh.write(PTH_LINE)
    return path


def socket_report(socket_path: str | None = None) -> dict[str, Any]:
    """Say where this process's agent sends, why, and whether a sidecar there accepts its datagrams."""
    import socket

    from exporter import wire

    if socket_path:
        path, why = socket_path, "given with --socket"
    elif os.environ.get("BOUNDWATCH_AGENT_SOCKET"):
        path, why = os.environ["BOUNDWATCH_AGENT_SOCKET"], "set by BOUNDWATCH_AGENT_SOCKET"
    else:
        path, why = wire.agent_socket_choice()
    out: dict[str, Any] = {"socket": path, "socket_reason": why, "uid": os.getuid()}
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(path)
            out["sidecar_listening"], out["socket_error"] = True, None
        except OSError as exc:
            out["sidecar_listening"], out["socket_error"] = False, f"{type(exc).__name__}: {exc.strerror}"
    return out


def check(import_torch: bool = True, socket_path: str | None = None) -> dict[str, Any]:
    """Return what the agent finds in this process; starts and stops CUPTI once."""
    from exporter.agent.cuptilib import cupti_python_version, loaded_libcupti

    out: dict[str, Any] = {"python": sys.version.split()[0], "cupti_python": cupti_python_version() or None}
    if import_torch:
        try:
            import torch

            out["torch"] = torch.__version__
            out["torch_cuda"] = torch.version.cuda
        except Exception as exc:
            out["torch"] = None
            out["torch_error"] = f"{type(exc).__name__}: {exc}"
    out["libcupti_loaded_before"] = loaded_libcupti()
    out.update(socket_report(socket_path))
    socket_path = out["socket"]
    try:
        from exporter.agent.core import Agent, Settings
    except Exception as exc:
        out.update(can_start=False, state="unavailable", detail=f"{type(exc).__name__}: {exc}")
        return out
    agent = Agent(Settings.from_env(socket=socket_path, role="generic"))
    t = time.perf_counter()
    state = agent.start()
    out["start_seconds"] = round(time.perf_counter() - t, 4)
    out["state"] = state
    out["detail"] = agent.detail
    out["lib"] = agent.lib_text
    out["mode"] = agent.mode
    out["cupti_attributes"] = agent.cupti_attributes
    out["hw_trace"] = agent.hw_trace
    lib = agent._lib
    if lib is not None:
        from exporter.agent.cuptilib import api_version_text

        out["libcupti"] = {
            "path": lib.path,
            "api_version": lib.api_version,
            "version": api_version_text(lib.api_version),
        }
        py = (out["cupti_python"] or "").split(".")
        out["versions_match"] = py[:2] == api_version_text(lib.api_version).split(".")[:2]
    out["libcupti_loaded_after"] = loaded_libcupti()
    agent.stop()
    out["can_start"] = state == "running"
    return out


def run(args: argparse.Namespace) -> int:
    """Run the check, print JSON, return 0 if CUPTI can start here, else 1."""
    result: dict[str, Any] = {}
    if getattr(args, "install_pth", None) is not None:
        try:
            result["pth"] = install_pth(args.install_pth or None)
        except OSError as exc:
            result["pth_error"] = str(exc)
    result.update(check(import_torch=not args.no_torch, socket_path=args.socket))
    print(json.dumps(result, indent=2, sort_keys=True))
    return 0 if result.get("can_start") else 1
