"""`boundwatch probe`: run the Triton self-test on one GPU, print JSON, exit 0 pass / 1 fail / 2 can't run."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from exporter.commands import ConfigFlags
from exporter.probe import logic

HELP = "run the GPU self-test: HBM bandwidth, a known duty-cycle load, a bf16 matmul (needs torch + triton)"


def add_parser(subparsers: Any, config_flags: ConfigFlags) -> argparse.ArgumentParser:
    """Add the `probe` sub-command."""
    p = subparsers.add_parser("probe", help=HELP, description=__doc__)
    configure(p)
    return p


def configure(p: argparse.ArgumentParser) -> None:
    """Add the probe's flags to a parser."""
    p.add_argument(
        "--json", action="store_true", help="print only the JSON result (default: JSON plus a summary)"
    )
    p.add_argument("--gpu", type=int, default=0, help="CUDA device index (default 0)")
    p.add_argument(
        "--duty",
        default="0.25,0.5,0.9",
        help="busy fractions of the duty-cycle phases, comma-separated (default 0.25,0.5,0.9); 'none' skips them",
    )
    p.add_argument("--seconds", type=float, default=5.0, help="measured seconds per duty phase (default 5)")
    p.add_argument(
        "--settle",
        type=float,
        default=None,
        help="seconds of load before each phase's window opens (default 3 with --check-url, else 1)",
    )
    p.add_argument(
        "--check-url",
        default=None,
        help="the sidecar's /metrics URL: compare its busy counters with the in-kernel truth per phase",
    )
    p.add_argument(
        "--agent",
        choices=("auto", "on", "off"),
        default="auto",
        help="attach the in-process CUPTI agent (auto: when --check-url is given)",
    )
    p.add_argument("--no-bandwidth", action="store_true", help="skip the HBM bandwidth test")
    p.add_argument("--no-matmul", action="store_true", help="skip the bf16 matmul rate")
    p.add_argument(
        "--buffer-gib", type=float, default=4.0, help="size of each copy buffer in GiB (default 4)"
    )
    p.add_argument("--tolerance", type=float, default=None, help="allowed CUPTI busy error (default 0.01)")
    p.add_argument("--out", default=None, help="also write the JSON result to this file")


def run(args: argparse.Namespace) -> int:
    """Run the probe and return its exit code."""
    try:
        duty = (
            () if str(args.duty).strip().lower() in {"", "none", "off"} else logic.parse_duty_list(args.duty)
        )
    except ValueError as exc:
        print(f"boundwatch probe: --duty: {exc}", file=sys.stderr)
        return logic.EXIT_UNAVAILABLE
    thresholds = logic.Thresholds(
        duty_tolerance={"cupti": args.tolerance} if args.tolerance is not None else None
    )
    from exporter.probe import gpu  # imports no torch/triton until it runs

    log = (lambda _m: None) if args.json else (lambda m: print(f"probe: {m}", file=sys.stderr, flush=True))
    result = gpu.run_probe(
        device=args.gpu,
        duty=duty,
        seconds=args.seconds,
        settle=args.settle,
        check_url=args.check_url,
        bandwidth=not args.no_bandwidth,
        matmul=not args.no_matmul,
        agent={"auto": None, "on": True, "off": False}[args.agent],
        thresholds=thresholds,
        buffer_bytes=int(args.buffer_gib * (1 << 30)),
        log=log,
    )
    text = json.dumps(result, indent=None if args.json else 2, sort_keys=False)
    print(text, flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(json.dumps(result, indent=2) + "\n")
    if not args.json:
        print(summary(result), file=sys.stderr)
    return int(result.get("exit_code", logic.EXIT_UNAVAILABLE))


def summary(result: dict[str, Any]) -> str:
    """Return a few human lines about a probe result."""
    lines = [f"probe {result.get('status')}: {result.get('message', '')}"]
    bw = result.get("bandwidth")
    if bw:
        lines.append(
            f"  HBM copy {bw['bytes_per_second'] / 1e9:.0f} GB/s"
            + (f", {bw['ratio_to_torch']:.3f} of torch copy_" if bw.get("ratio_to_torch") else "")
            + (f", {bw['ratio_to_nominal']:.3f} of nominal" if bw.get("ratio_to_nominal") else "")
        )
    for ph in (result.get("duty") or {}).get("phases", []):
        srcs = ", ".join(f"{s} {v['busy_ratio']:.4f}" for s, v in (ph.get("sources") or {}).items())
        lines.append(
            f"  duty {ph['target']:g}: truth {ph.get('truth', float('nan')):.4f}; {srcs or 'no source'}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run `probe` without the CLI framework (python -m exporter.commands.probe)."""
    p = argparse.ArgumentParser(prog="boundwatch probe", description=__doc__)
    configure(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
