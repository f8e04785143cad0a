"""Switchable engines on 127.0.0.1 for the fleet monitor's tests.

`FakeEngine` serves /health and /metrics on an ephemeral port, in the test's own
event loop. Each endpoint's behaviour can be switched while it runs:

- "ok": 200 (an empty body for /health, as vLLM does, or `health_body`; the page in
  `metrics_text` for /metrics)
- "503", "404", "500": that status
- "hang": accept the request and never answer (until the engine stops)

`stop()` closes the listening socket (connections are then refused); `start()` binds the
same port again. `hits` counts requests per path.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable

import pytest
from aiohttp import web

from tests.fleet.exposition import VLLM_PAGE

_STATUS = {"503": 503, "404": 404, "500": 500}


class FakeEngine:
    def __init__(self) -> None:
        self.health = "ok"
        self.metrics = "ok"
        self.health_body = ""
        self.metrics_text = VLLM_PAGE
        self.version: str | None = None  # GET /version: {"version": ...}, or 404 when None
        self.version_delay_s = 0.0
        self.hits: collections.Counter[str] = collections.Counter()
        self.authorization: str | None = None  # of the last /health request
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._release = asyncio.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/version", self._version)
        # A short shutdown_timeout: hanging handlers are released on stop anyway.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        self._release = asyncio.Event()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        self._release.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _health(self, request: web.Request) -> web.Response:
        self.hits["/health"] += 1
        self.authorization = request.headers.get("Authorization")
        return await self._answer(self.health, self.health_body, "application/json")

    async def _metrics(self, request: web.Request) -> web.Response:
        self.hits["/metrics"] += 1
        return await self._answer(self.metrics, self.metrics_text, "text/plain")

    async def _version(self, request: web.Request) -> web.Response:
        self.hits["/version"] += 1
        await asyncio.sleep(self.version_delay_s)
        if self.version is None:
            return web.Response(status=404, text="no")
        return web.json_response({"version": self.version})

    async def _answer(self, behaviour: str, body: str, content_type: str) -> web.Response:
        if behaviour == "hang":
            await self._release.wait()
            raise web.HTTPServiceUnavailable()
        if behaviour in _STATUS:
            return web.Response(status=_STATUS[behaviour], text="no")
        assert behaviour == "ok", behaviour
        return web.Response(text=body, content_type=content_type, charset="utf-8")


async def wait_for(predicate: Callable[[], bool], within: float, step: float = 0.005) -> float:
    """Seconds until `predicate()` held; fails the test after `within` seconds."""
    start = time.monotonic()
    while not predicate():
        elapsed = time.monotonic() - start
        if elapsed > within:
            pytest.fail(f"condition not met within {within:.2f} s")
        await asyncio.sleep(step)
    return time.monotonic() - start
