"""CUDA graphs on the lab's CPU path: a stand-in for the parts of torch the light agent's hooks see.

On a machine without torch, `install()` puts a small `torch` with `torch.cuda.CUDAGraph` (capture and
replay, no GPU work) in this process's modules, before the agent starts, so the hooks patch it as they
patch torch's; the CPU model then captures one graph per batch size and replays it on each graph-mode
decode step. The light agent counts those replays, and an eager step replays none: the scenario lab's
eager switch reads on the CPU path as on the GPU (the graph-step share falls to 0). Where a real torch
is importable nothing is installed (None): the CPU model then steps without graphs, as before.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from typing import Any


class _CUDAGraph:
    """torch._C._CUDAGraph's place: the replay itself (torch's is C++)."""

    def __init__(self) -> None:
        self.captured = False
        self.replays = 0

    def replay(self) -> None:
        """Replay: count it (the step's "GPU" time is the CPU model's sleep)."""
        self.replays += 1


class CUDAGraph(_CUDAGraph):
    """torch.cuda.CUDAGraph as torch 2.x has it: capture_begin / capture_end, and `replay` a shim over the base's."""

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        """Begin a capture (nothing is recorded on the CPU path)."""

    def capture_end(self) -> None:
        """End the capture."""
        self.captured = True

    def replay(self) -> None:
        """Replay the captured graph (torch's own words: a shim over the C++ method)."""
        super().replay()


def install() -> types.ModuleType | None:
    """Put the stand-in `torch` in sys.modules and return its `cuda`; None where a real torch is importable."""
    have = sys.modules.get("torch")
    if have is not None:
        return getattr(have, "cuda", None) if getattr(have, "__version__", "") == "0.0-lab" else None
    if importlib.util.find_spec("torch") is not None:
        return None
    torch = types.ModuleType("torch")
    cuda = types.ModuleType("torch.cuda")
    torch.__version__ = "0.0-lab"  # type: ignore[attr-defined]
    state = {"initialized": True}  # the CPU path's "CUDA" is up from the start (the agent starts after it)
    cuda.is_initialized = lambda: state["initialized"]  # type: ignore[attr-defined]
    cuda.current_device = lambda: 0  # type: ignore[attr-defined]
    cuda.device_count = lambda: 1  # type: ignore[attr-defined]
    cuda.CUDAGraph = CUDAGraph  # type: ignore[attr-defined]
    torch.cuda = cuda  # type: ignore[attr-defined]
    sys.modules["torch"], sys.modules["torch.cuda"] = torch, cuda
    return cuda


def capture(cuda: types.ModuleType | None, sizes: tuple[int, ...]) -> dict[int, Any]:
    """Capture one graph per batch size through `cuda` (whose CUDAGraph the hooks may have patched); {} without."""
    if cuda is None:
        return {}
    graphs = {}
    for size in sizes:
        g = cuda.CUDAGraph()
        g.capture_begin()
        g.capture_end()
        graphs[size] = g
    return graphs
