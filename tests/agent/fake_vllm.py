"""A small vLLM-shaped package (an outside party) written to a temp dir: the names and signatures the
plugin patches, as read from the vLLM 0.33.0 wheel (EngineCore.step / step_with_batch_queue, the
scheduler's get_request_counts, WorkerWrapperBase.init_device in both layouts, the V2 runner's
module-global dispatch_cg_and_sync_dp and the V1 runner's _determine_batch_execution_and_padding).
"""

from pathlib import Path

FILES = {
    "vllm/__init__.py": "",
    "vllm/plugins/__init__.py": '''
import importlib

plugins_loaded = False
loads = []


def load_general_plugins():
    """Once per process, like vLLM's: a forked child inherits plugins_loaded=True."""
    global plugins_loaded
    if plugins_loaded:
        return
    plugins_loaded = True
    mod, _, fn = "exporter.agent.plugins:vllm_plugin".partition(":")  # the entry point's value
    loads.append(fn)
    getattr(importlib.import_module(mod), fn)()
''',
    "vllm/config.py": """
class SchedulerConfig:
    def __init__(self, max_num_seqs=4, max_num_active_seqs=None):
        self.max_num_seqs, self.max_num_active_seqs = max_num_seqs, max_num_active_seqs


class ParallelConfig:
    def __init__(self, data_parallel_rank=0):
        self.data_parallel_rank = data_parallel_rank


class VllmConfig:
    def __init__(self, max_num_seqs=4, dp_rank=0, max_num_active_seqs=None):
        self.scheduler_config = SchedulerConfig(max_num_seqs, max_num_active_seqs)
        self.parallel_config = ParallelConfig(dp_rank)
""",
    "vllm/v1/__init__.py": "",
    "vllm/v1/core/__init__.py": "",
    "vllm/v1/core/sched/__init__.py": "",
    "vllm/v1/core/sched/scheduler.py": '''
class SchedulerOutput:
    def __init__(self, num_scheduled_tokens):
        self.num_scheduled_tokens = num_scheduled_tokens
        self.total_num_scheduled_tokens = sum(num_scheduled_tokens.values())


class Scheduler:
    def __init__(self, vllm_config):
        self.scheduler_config = vllm_config.scheduler_config
        self.running, self.waiting, self.left = [], [], {}

    def add_request(self, req_id, decode_steps):
        self.waiting.append(req_id)
        self.left[req_id] = decode_steps

    def has_requests(self):
        return bool(self.running or self.waiting)

    def schedule(self, throttle_prefills=False):
        while self.waiting and len(self.running) < self.scheduler_config.max_num_seqs:
            self.running.append(self.waiting.pop(0))
        return SchedulerOutput({r: 1 for r in self.running})

    def update_from_output(self, scheduler_output, model_output=None):
        for r in list(scheduler_output.num_scheduled_tokens):
            self.left[r] -= 1
            if self.left[r] == 0:
                self.running.remove(r)
        return {}

    def get_request_counts(self):
        """Returns (num_running_reqs, num_waiting_reqs)."""
        return len(self.running), len(self.waiting)


class AsyncScheduler(Scheduler):
    pass
''',
    "vllm/v1/engine/__init__.py": "",
    "vllm/v1/engine/core.py": """
import time

from vllm.v1.core.sched.scheduler import AsyncScheduler


class EngineCore:
    def __init__(self, vllm_config):
        from vllm.plugins import load_general_plugins

        load_general_plugins()
        self.vllm_config = vllm_config
        self.scheduler = AsyncScheduler(vllm_config)
        self.batch_queue = None
        self.step_fn = self.step if self.batch_queue is None else self.step_with_batch_queue  # as vLLM binds it

    def step(self):
        if not self.scheduler.has_requests():
            return {}, False
        scheduler_output = self.scheduler.schedule(False)
        time.sleep(0.002)  # the model
        outputs = self.scheduler.update_from_output(scheduler_output)
        return outputs, scheduler_output.total_num_scheduled_tokens > 0

    def step_with_batch_queue(self):
        return self.step()


class EngineCoreProc(EngineCore):
    pass
""",
    "vllm/v1/worker/__init__.py": "",
    "vllm/v1/worker/worker_base.py": """
class WorkerWrapperBase:
    def __init__(self):
        self.initialised = 0

    def init_device(self):
        self.initialised += 1
""",
    "vllm/worker/__init__.py": "",
    "vllm/worker/worker_base.py": """
class WorkerWrapperBase:
    def init_device(self):
        self.initialised = True
""",
    "vllm/v1/worker/gpu/__init__.py": "",
    "vllm/v1/worker/gpu/dp_utils.py": """
import enum
from dataclasses import dataclass


class CUDAGraphMode(enum.Enum):
    NONE = 0
    PIECEWISE = 1
    FULL = 2


@dataclass(frozen=True)
class BatchExecutionDescriptor:
    cg_mode: CUDAGraphMode
    num_tokens: int
    num_reqs: int | None


def dispatch_cg_and_sync_dp(cudagraph_manager, num_reqs, num_tokens, uniform_token_count, dp_size, dp_rank,
                            max_query_len=None, need_eager=False, **kwargs):
    mode = CUDAGraphMode.NONE if need_eager or num_tokens > 8 else CUDAGraphMode.FULL
    return BatchExecutionDescriptor(mode, num_tokens, num_reqs), None
""",
    "vllm/v1/worker/gpu/model_runner.py": """
from vllm.v1.worker.gpu.dp_utils import dispatch_cg_and_sync_dp


class GPUModelRunner:
    def __init__(self, vllm_config):
        self.vllm_config = vllm_config
        self.dp_rank = vllm_config.parallel_config.data_parallel_rank

    def execute_model(self, scheduler_output, intermediate_tensors=None, dummy_run=False,
                      skip_attn_for_dummy_run=False, is_profile=False):
        n = scheduler_output.total_num_scheduled_tokens
        desc, _ = dispatch_cg_and_sync_dp(None, len(scheduler_output.num_scheduled_tokens), n, None, 1,
                                          self.dp_rank, need_eager=is_profile)
        return desc
""",
    "vllm/v1/worker/gpu_model_runner.py": """
from vllm.v1.worker.gpu.dp_utils import CUDAGraphMode


class GPUModelRunner:
    def __init__(self, vllm_config):
        self.vllm_config = vllm_config

    def _determine_batch_execution_and_padding(self, num_tokens, num_reqs, num_scheduled_tokens_np,
                                               max_num_scheduled_tokens, use_cascade_attn=False):
        mode = CUDAGraphMode.PIECEWISE if num_tokens > 8 else CUDAGraphMode.FULL
        return mode, None, False, None, None

    def execute_model(self, scheduler_output, intermediate_tensors=None):
        n = scheduler_output.total_num_scheduled_tokens
        mode = self._determine_batch_execution_and_padding(n, 1, None, n)[0]
        return mode

    def _dummy_run(self, num_tokens):
        return self._determine_batch_execution_and_padding(num_tokens, 1, None, num_tokens)[0]
""",
}


def write(root: Path) -> Path:
    """Write the fake vllm package under root; return root (put it on sys.path)."""
    for rel, text in FILES.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root
