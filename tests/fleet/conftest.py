"""Fixtures for the fleet tests: fake engines, a client session, unusable endpoints."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable, Sequence

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from narwhal.config import EngineConfig, FleetConfig
from narwhal.fleet.monitor import FleetMonitor
from tests.fleet.fake_engine import FakeEngine


@pytest.fixture
async def fake_engine() -> AsyncIterator[FakeEngine]:
    engine = FakeEngine()
    await engine.start()
    try:
        yield engine
    finally:
        await engine.stop()


@pytest.fixture
async def make_engine() -> AsyncIterator[Callable[[], FakeEngine]]:
    """For tests that need several engines: call it, then `await engine.start()`."""
    engines: list[FakeEngine] = []

    def make() -> FakeEngine:
        engines.append(FakeEngine())
        return engines[-1]

    yield make
    for engine in engines:
        await engine.stop()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture
async def dropping_server() -> AsyncIterator[str]:
    """A server that accepts a connection, reads the request and closes without answering."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


MonitorFactory = Callable[..., FleetMonitor]


@pytest.fixture
async def make_monitor(session: aiohttp.ClientSession) -> AsyncIterator[MonitorFactory]:
    """Build monitors on fresh registries (or the one given); every one is closed after."""
    made: list[FleetMonitor] = []

    def make(
        engines: Sequence[EngineConfig],
        fleet: FleetConfig,
        *,
        registry: CollectorRegistry | None = None,
        seed: int = 0,
    ) -> FleetMonitor:
        monitor = FleetMonitor(
            engines,
            fleet,
            session,
            registry if registry is not None else CollectorRegistry(auto_describe=True),
            rng=random.Random(seed),
        )
        made.append(monitor)
        return monitor

    yield make
    for monitor in made:
        await monitor.close()
