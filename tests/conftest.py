"""Shared fixtures; the shared fakes live in tests/fakes/."""

import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

# The engine stand-ins (engine_fixtures, vllm_sim, make_fixtures) are imported by name, also by the
# processes the multiprocess simulations spawn.
ENGINE_FAKES = str(Path(__file__).resolve().parent / "fakes" / "engine")
if ENGINE_FAKES not in sys.path:
    sys.path.insert(0, ENGINE_FAKES)


@pytest.fixture
async def aiohttp_client() -> AsyncIterator[Callable[[web.Application], Awaitable[TestClient]]]:
    """Start aiohttp apps on loopback test servers and close them afterwards."""
    clients: list[TestClient] = []

    async def start(app: web.Application) -> TestClient:
        client = TestClient(TestServer(app, host="127.0.0.1"))
        await client.start_server()
        clients.append(client)
        return client

    yield start
    for client in clients:
        await client.close()
