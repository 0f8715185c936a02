"""A small SGLang-shaped package (an outside party): names read from the SGLang 0.5.23 wheel —
`load_plugins()` in run_scheduler_process, HookRegistry AROUND/AFTER hooks applied after the plugins
load, Scheduler.run_batch(batch), ModelRunner._forward_raw returning ModelRunnerOutput.can_run_graph."""

from pathlib import Path

FILES = {
    "sglang/__init__.py": "",
    "sglang/srt/__init__.py": "",
    "sglang/srt/plugins/__init__.py": """
import importlib

from sglang.srt.plugins.hook_registry import HookRegistry

_plugins_loaded = False


def load_plugins():
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    mod, _, fn = "exporter.agent.plugins:sglang_plugin".partition(":")
    getattr(importlib.import_module(mod), fn)()
    HookRegistry.apply_hooks()
""",
    "sglang/srt/plugins/hook_registry.py": """
import enum
import functools
import importlib


class HookType(enum.Enum):
    BEFORE = "before"
    AFTER = "after"
    AROUND = "around"
    REPLACE = "replace"


class HookRegistry:
    _hooks = {}

    @classmethod
    def register(cls, target, hook, hook_type=HookType.AFTER):
        cls._hooks.setdefault(target, []).append((hook_type, hook))

    @classmethod
    def apply_hooks(cls):
        for target, hooks in cls._hooks.items():
            mod_name, cls_name, attr = target.rsplit(".", 2)
            owner = getattr(importlib.import_module(mod_name), cls_name)
            for hook_type, hook in hooks:
                setattr(owner, attr, _wrap(getattr(owner, attr), hook, hook_type))


def _wrap(original, hook, hook_type):
    if hook_type == HookType.AFTER:
        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            result = original(*args, **kwargs)
            modified = hook(result, *args, **kwargs)
            return modified if modified is not None else result
        return wrapper

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        return hook(original, *args, **kwargs)
    return wrapper
""",
    "sglang/srt/model_executor/__init__.py": "",
    "sglang/srt/model_executor/model_runner.py": """
class ModelRunnerOutput:
    def __init__(self, logits_output, can_run_graph):
        self.logits_output, self.can_run_graph = logits_output, can_run_graph


class ModelRunner:
    def __init__(self, tp_rank=0):
        self.tp_rank = tp_rank
        self.is_draft_worker = False

    def _forward_raw(self, forward_batch, pp_proxy_tensors, reinit_attn_backend=False, split_forward_count=1):
        return ModelRunnerOutput(None, can_run_graph=forward_batch.forward_mode.is_decode())
""",
    "sglang/srt/managers/__init__.py": "",
    "sglang/srt/managers/scheduler.py": """
import time


class _Parallel:
    tp_rank = 0
    attn_tp_rank = 0
    dp_rank = None


def get_parallel():
    return _Parallel()


class ForwardMode:
    def __init__(self, decode):
        self.decode = decode

    def is_decode(self):
        return self.decode


class ScheduleBatch:
    def __init__(self, reqs, decode, extend_num_tokens=0):
        self.reqs, self.forward_mode, self.extend_num_tokens = reqs, ForwardMode(decode), extend_num_tokens


class Scheduler:
    def __init__(self, model_runner):
        self.model_runner = model_runner
        self.max_running_requests = 32
        self.running_batch = ScheduleBatch([], True)
        self.waiting_queue = []

    def run_batch(self, batch, pp_proxy_tensors=None):
        time.sleep(0.001)
        return self.model_runner._forward_raw(batch, pp_proxy_tensors)


def run_scheduler_process(server_args, port_args, gpu_id, tp_rank, pp_rank, dp_rank, pipe_writer):
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang.srt.model_executor.model_runner import ModelRunner

    s = Scheduler(ModelRunner())
    s.waiting_queue = ["w1", "w2"]
    prefill = ScheduleBatch(["a", "b"], decode=False, extend_num_tokens=900)
    s.run_batch(prefill)                     # eager prefill of 900 tokens, 2 running after it
    s.running_batch = ScheduleBatch(["a", "b"], True)
    s.waiting_queue = []
    for _ in range(3):
        s.run_batch(s.running_batch)         # graph decode steps
    return s
""",
}


def write(root: Path) -> Path:
    """Write the fake sglang package under root; return root."""
    for rel, text in FILES.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root
