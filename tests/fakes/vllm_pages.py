"""A small vLLM page (engine 0, model m) with the values a test gives, a server of such pages."""

from __future__ import annotations

import asyncio

from aiohttp import web

from exporter.config import Config, EngineConfig, HostConfig


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


class Pages:
    """Serve the bytes a test puts under a path, after an optional delay, as an engine serves /metrics."""

    def __init__(self) -> None:
        self.body: dict[str, bytes] = {}
        self.delay = 0.0

    async def handle(self, request: web.Request) -> web.Response:
        body = self.body[request.match_info["name"]]
        if self.delay:
            await asyncio.sleep(self.delay)
        return web.Response(body=body, content_type="text/plain", charset="utf-8")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/{name}/metrics", self.handle)
        return app


def engine_config(urls: tuple[str, ...], tick: float = 0.5, **engine: object) -> Config:
    """Return a Config that reads the given engine URLs only (no discovery), at `tick` second ticks."""
    return Config(
        tick_seconds=tick,
        engine=EngineConfig(urls=urls, discover=False, **engine),  # type: ignore[arg-type]
        host=HostConfig(proc_root="/proc", cgroup_root="/sys/fs/cgroup"),
    )
