"""`boundwatch catalogue`: print every exported metric as a Markdown table or JSON."""

from __future__ import annotations

import argparse
import json
from typing import Any

from exporter.catalogue import METRICS
from exporter.commands import ConfigFlags

AREA_TITLES = {
    "self": "boundwatch itself",
    "gpu": "GPU (NVML)",
    "busy": "GPU busy time (CUPTI agent, GPM, NVML)",
    "engine": "Engine (vLLM, SGLang) and API servers",
    "host": "Host and cgroups",
    "verdict": "The verdict",
    "probe": "Self-test probe",
}


def markdown() -> str:
    """Return the catalogue as Markdown tables, one per area."""
    lines: list[str] = []
    for area, title in AREA_TITLES.items():
        rows = [m for m in METRICS if m.area == area]
        if not rows:
            continue
        lines += [f"#### {title}", "", "| metric | type | labels | help |", "|---|---|---|---|"]
        for m in rows:
            labels = ", ".join(f"`{label}`" for label in m.labels) or "-"
            lines.append(f"| `{m.name}` | {m.kind} | {labels} | {m.help.replace('|', '/')} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def add_parser(sub: Any, config_flags: ConfigFlags) -> None:
    """Add the catalogue sub-command."""
    p = sub.add_parser("catalogue", help="print every exported metric (Markdown or JSON)")
    p.add_argument("--json", action="store_true", help="print JSON instead of Markdown")


def run(args: argparse.Namespace) -> int:
    """Print the catalogue."""
    if args.json:
        print(json.dumps([m.__dict__ for m in METRICS], indent=2))
    else:
        print(markdown(), end="")
    return 0
