"""What an engine's command line says about its CUDA graphs: off, or up to which decode batch they were captured.

Without any agent this is the only view of CUDA-graph coverage, and it is the one seed 000 needed:
vLLM captures decode graphs up to `max_cudagraph_capture_size` **tokens**, and a step carries
sequences x (1 + speculative depth) tokens, so a capture size of 64 with depth 1 covers about 32
sequences; anything above falls back to eager mode. Read from the flags as each version spells them:

- vLLM: `--enforce-eager`; `--max-cudagraph-capture-size N`, `--cuda-graph-sizes N [N ...]`,
  `-O`/`--compilation-config` JSON (`max_cudagraph_capture_size`, `cudagraph_capture_sizes`,
  `cudagraph_mode` NONE) and its dotted form `-O.max_cudagraph_capture_size=N`;
  `--speculative-config` JSON `num_speculative_tokens`.
- SGLang: `--disable-cuda-graph`; `--cuda-graph-max-bs N`, `--cuda-graph-bs N [N ...]` (in sequences);
  `--speculative-num-draft-tokens`.

Nothing is guessed: a default that depends on the version (vLLM's capture size) stays unknown.
Values are bounded; a malformed one is ignored and counted (`GraphConfig.refused`, exported as
boundwatch_engine_flags_refused).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

from exporter.snapshot.engine import GraphConfig, ascii_int

MAX_FLAG_CHARS = 4096
MAX_CAPTURE = 1 << 20


def _values(cmdline: Sequence[str], *names: str) -> list[str]:
    """Return every value given to the flags (`--x v`, `--x=v`, `--x v1 v2 ...` up to the next flag)."""
    out: list[str] = []
    for i, arg in enumerate(cmdline):
        for name in names:
            if arg == name:
                j = i + 1
                while j < len(cmdline) and not cmdline[j].startswith("-"):
                    out.append(cmdline[j][:MAX_FLAG_CHARS])
                    j += 1
            elif arg.startswith(name + "="):
                out.append(arg.split("=", 1)[1][:MAX_FLAG_CHARS])
    return out


def _int(text: object) -> int | None:
    if isinstance(text, bool):
        return None
    value = text if isinstance(text, int) else ascii_int(text.strip(), 9) if isinstance(text, str) else None
    return value if value is not None and 0 < value <= MAX_CAPTURE else None


class _Reader:
    """Read one command line's flags, counting the values given that could not be read (bad JSON, a bad number)."""

    def __init__(self, cmdline: Sequence[str]) -> None:
        self.cmdline = cmdline
        self.refused = 0

    def values(self, *names: str) -> list[str]:
        return _values(self.cmdline, *names)

    def number(self, value: object) -> int | None:
        got = _int(value)
        if got is None and value is not None:
            self.refused += 1
        return got

    def max_of(self, values: Sequence[object]) -> int | None:
        got = [v for v in (self.number(x) for x in values) if v is not None]
        return max(got) if got else None

    def json(self, text: str) -> dict[str, object]:
        try:
            got = json.loads(text)
        except (ValueError, RecursionError):  # a command line nested past the parser's depth is refused too
            got = None
        if not isinstance(got, dict):
            self.refused += 1
            return {}
        return got


def graph_config(kind: str, cmdline: Sequence[str]) -> GraphConfig | None:
    """Return what the command line says about CUDA graphs (with the values it refused), or None when it says nothing."""
    r = _Reader(cmdline)
    got = _graph_config(kind, r)
    if got is None:
        return GraphConfig(refused=r.refused) if r.refused else None
    return dataclasses.replace(got, refused=r.refused)


def _graph_config(kind: str, r: _Reader) -> GraphConfig | None:
    cmdline = r.cmdline
    if kind == "sglang":
        if "--disable-cuda-graph" in cmdline:
            return GraphConfig(off=True, source="--disable-cuda-graph")
        bs = r.max_of(r.values("--cuda-graph-max-bs")) or r.max_of(r.values("--cuda-graph-bs"))
        drafts = r.number(next(iter(r.values("--speculative-num-draft-tokens")), None))
        if bs is None:
            return None
        # SGLang captures per batch of sequences (each with its draft tokens)
        return GraphConfig(capture_limit=bs, limit_in_tokens=False, spec_tokens=(drafts or 1) - 1,
                           source="--cuda-graph-max-bs")  # fmt: skip
    if kind != "vllm":
        return None
    if "--enforce-eager" in cmdline:
        return GraphConfig(off=True, source="--enforce-eager")
    limit: int | None = None
    source = ""
    compilation: dict[str, object] = {}
    for text in r.values("-O", "--compilation-config"):
        compilation.update(r.json(text))
    for arg in cmdline:  # dotted form: -O.key=value, --compilation-config.key=value
        for prefix in ("-O.", "--compilation-config."):
            if arg.startswith(prefix) and "=" in arg:
                key, value = arg[len(prefix) :].split("=", 1)
                compilation[key] = value[:MAX_FLAG_CHARS]
    mode = str(compilation.get("cudagraph_mode", "")).upper()
    if mode in ("NONE", "0"):
        return GraphConfig(off=True, source="cudagraph_mode=NONE")
    if (v := r.number(compilation.get("max_cudagraph_capture_size"))) is not None:
        limit, source = v, "max_cudagraph_capture_size"
    sizes = compilation.get("cudagraph_capture_sizes")
    if limit is None and isinstance(sizes, list) and (v := r.max_of(sizes)) is not None:
        limit, source = v, "cudagraph_capture_sizes"
    if limit is None and (v := r.max_of(r.values("--max-cudagraph-capture-size"))) is not None:
        limit, source = v, "--max-cudagraph-capture-size"
    if limit is None and (v := r.max_of(r.values("--cuda-graph-sizes"))) is not None:
        limit, source = v, "--cuda-graph-sizes"
    spec = 0
    for text in r.values("--speculative-config", "--speculative_config"):
        spec = r.number(r.json(text).get("num_speculative_tokens")) or spec
    if limit is None:
        return None
    return GraphConfig(capture_limit=limit, limit_in_tokens=True, spec_tokens=spec, source=source)
