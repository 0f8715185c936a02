"""A small vLLM page (engine 0, model m) with the values a test gives, as bytes an engine serves."""

from __future__ import annotations


def page(running: str = "10", waiting: str = "2", prompt: str = "100", extra: str = "") -> bytes:
    return (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{engine="0",model_name="m"}} {running}\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}\n'
        "# TYPE vllm:prompt_tokens_total counter\n"
        f'vllm:prompt_tokens_total{{engine="0",model_name="m"}} {prompt}\n'
        f"{extra}"
        "process_cpu_seconds_total 1.0\n"
    ).encode()
