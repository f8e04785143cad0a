"""Fixtures for the sizing tests: a switchable tokenize server and a client session."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from tests.sizing.tokenize_server import TokenizeServer


@pytest.fixture
async def tokenize_server() -> AsyncIterator[TokenizeServer]:
    server = TokenizeServer()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s
