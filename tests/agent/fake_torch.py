"""A stand-in for torch (an outside party): a real `torch.cuda.CUDAGraph` class to patch, and CUDA state flags.

`write(dir)` writes a `torch` package into dir; a subprocess with dir on sys.path imports it as torch.
"""

from pathlib import Path

TORCH_INIT = """
from . import cuda
__version__ = "0.0-fake"
"""

TORCH_CUDA = '''
_initialized = False
_device = 0
_devices = 1
calls = []


def is_initialized():
    return _initialized


def current_device():
    if not _initialized:
        raise RuntimeError("the fake torch refuses to initialise CUDA for the agent")
    return _device


def device_count():
    return _devices


def init(device=0):
    """What the application does: initialise CUDA on a device."""
    global _initialized, _device
    _initialized, _device = True, device


class CUDAGraph:
    def __init__(self):
        self.replays = 0
        self.captured = False

    def capture_begin(self, pool=None, capture_error_mode="global"):
        calls.append(("capture_begin", pool, capture_error_mode))

    def capture_end(self):
        self.captured = True
        calls.append(("capture_end",))

    def replay(self):
        self.replays += 1
        return "replayed"


class graph:
    """torch.cuda.graph: the context manager engines capture with."""

    def __init__(self, cuda_graph, pool=None):
        self.g, self.pool = cuda_graph, pool

    def __enter__(self):
        self.g.capture_begin(self.pool, capture_error_mode="thread_local")

    def __exit__(self, *exc):
        self.g.capture_end()
'''


# torch 2.11's `torch.cuda.CUDAGraph` as its torch/cuda/graphs.py reads: `replay` a shim over the C++
# `torch._C._CUDAGraph.replay` (pybind keeps that as an `instancemethod` around a builtin). Code run
# with it defines `_CUDAGraph` first; `INSTANCEMETHOD` defines `instancemethod`, pybind's wrapper.
INSTANCEMETHOD = """
import ctypes
instancemethod = ctypes.pythonapi.PyInstanceMethod_New
instancemethod.restype, instancemethod.argtypes = ctypes.py_object, [ctypes.py_object]
"""

GRAPH_2_11 = '''
class CUDAGraph(_CUDAGraph):
    def replay(self) -> None:
        r"""Replay the CUDA work captured by this graph."""
        super().replay()

    def capture_begin(self, pool=None, capture_error_mode="global"):
        pass

    def capture_end(self):
        pass
'''


def write(root: Path) -> Path:
    """Write the fake torch package under root; return root (put it on sys.path)."""
    pkg = root / "torch"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(TORCH_INIT)
    (pkg / "cuda.py").write_text(TORCH_CUDA)
    return root
