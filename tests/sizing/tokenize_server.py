"""A switchable tokenize endpoint on 127.0.0.1 for the engine tokenizer's tests.

`behaviour` says how POST /tokenize answers: "ok" (`{"count": count}`), "hold" (wait until
`release` is set, then as "ok"), "stall" (never, until the server stops), "404", "405",
"500", "garbage" (not JSON), "negative", "bool", "string" and "digits" (bad counts; the
last an integer of 400 digits), "huge" (a body over 1 MiB, with its Content-Length),
"huge_chunked" (the same without one). `bodies` keeps every request body it was sent;
`wait_for_requests(n)` returns once there are n.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web


class TokenizeServer:
    def __init__(self, count: int = 42) -> None:
        self.behaviour = "ok"
        self.count = count
        self.bodies: list[dict[str, Any]] = []
        self.release = asyncio.Event()
        self._arrived = asyncio.Condition()
        self._stopping = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/tokenize", self._tokenize)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.2)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def stop(self) -> None:
        self._stopping.set()
        self.release.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def wait_for_requests(self, n: int) -> None:
        async with self._arrived:
            await self._arrived.wait_for(lambda: len(self.bodies) >= n)

    async def _tokenize(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(json.loads(await request.read()))
        async with self._arrived:
            self._arrived.notify_all()
        behaviour = self.behaviour
        if behaviour == "hold":
            await self.release.wait()
        elif behaviour == "stall":
            await self._stopping.wait()
        if behaviour in ("404", "405", "500"):
            return web.Response(status=int(behaviour), text="no")
        if behaviour == "garbage":
            return web.Response(text="<html>nope</html>", content_type="text/html")
        if behaviour == "huge":
            return web.json_response({"count": 3, "tokens": [1] * 600_000})
        if behaviour == "huge_chunked":
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            response.enable_chunked_encoding()
            await response.prepare(request)
            await response.write(b'{"count": 3, "tokens": [')
            for _ in range(40):
                await response.write(b"1," * 16_384)
            await response.write(b"1]}")
            return response
        bad = {"negative": -1, "bool": True, "string": "42", "digits": 10**400 - 1}
        count: object = bad.get(behaviour, self.count)
        return web.json_response({"count": count, "max_model_len": 32768, "tokens": []})
