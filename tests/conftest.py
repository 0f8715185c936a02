"""Shared fixtures."""

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer


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
