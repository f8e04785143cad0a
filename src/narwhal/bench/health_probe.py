"""`--health-probe S`: GET /health every S seconds while a stage runs, from the bench's own
event loop, on a connection of its own.

A refusal's latency at the client is the server's work plus everything between: the
network, the machine's scheduling and this client's own loop, busy with the stage's
streams. The cheapest answer the server has, sent from the same loop at the same time,
shows what everything but the server's work adds: the floor to read refusal and TTFT
latencies against. A probe from another process would miss this client's share, so the
two would not compare.

Probes are not requests of the stage: they are not counted, not in the records, and
their failures only leave a gap (the count says how many answered).
"""

from __future__ import annotations

import asyncio
import contextlib
from time import perf_counter

import aiohttp


class HealthProbe:
    """`async with HealthProbe(...) as probe:` probes until the block ends; then
    `probe.latencies_s` holds each answered probe's seconds, send to body end."""

    def __init__(self, base_url: str, every_s: float, timeout_s: float = 5.0) -> None:
        self._url = base_url.rstrip("/") + "/health"
        self._every = every_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.latencies_s: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> HealthProbe:
        self._task = asyncio.create_task(self._run(), name="bench-health-probe")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        # One connection, kept alive: a probe pays no connect, as the stage's requests
        # (on their pooled connections) do not.
        connector = aiohttp.TCPConnector(limit=1)
        async with aiohttp.ClientSession(connector=connector, timeout=self._timeout) as session:
            next_at = perf_counter()
            while True:
                started = perf_counter()
                try:
                    async with session.get(self._url) as response:
                        await response.read()
                    self.latencies_s.append(perf_counter() - started)
                except (aiohttp.ClientError, TimeoutError):
                    pass
                next_at = max(next_at + self._every, perf_counter())
                await asyncio.sleep(next_at - perf_counter())
