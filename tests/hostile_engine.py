"""An engine that answers what a test scripts, in the test's own event loop.

`HostileEngine` serves `/health` and both completion routes of an OpenAI-compatible
server (the router's `openai` dialect: no /metrics, no /tokenize needed) on one or more
loopback ports. Every completion request gets the body `script(request_body)` returns:
with `status` other than 200, the pieces joined as one `application/json` error body
(what an engine's 4xx or 5xx answer looks like); else an event stream whose pieces are
written one by one (each one write, so the router may read them apart;
`pause_after` makes sure), then the response ends, or with `abort=True` the connection
is dropped without ending the chunked body (the router sees a broken stream). A script
with a `flood` then writes it over and over, as fast as the router reads, for `flood_s`
seconds (or until the router hangs up), and then its `after` pieces.

The pieces are the test's own objects: a test that measures the router's memory builds
them before its baseline, so the engine allocates nothing it has to tell apart.

`probes` scripts the GET answers the router's monitor reads (`/health`, `/metrics`,
`/v1/models`, `/version`): each a `ProbeAnswer`, which may claim a `Content-Length` it
never delivers, send a body far longer than any real one, and stall instead of ending.
`probed` counts the GETs of each scripted path.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from narwhal.config import Config, config_from_mapping


@dataclass(frozen=True, slots=True)
class Script:
    pieces: Sequence[bytes]
    abort: bool = False  # drop the connection instead of ending the body
    # After this many pieces, a pause: the router has the first events in hand and starts
    # the response before the rest comes (a failure after it is one after the headers).
    pause_after: int | None = None
    pause_s: float = 0.1
    status: int = 200  # not 200: an error answer, the pieces its JSON body
    flood: bytes = b""  # written again and again after the pieces, for `flood_s` seconds
    flood_s: float = 0.0
    after: Sequence[bytes] = ()  # written after the flood


@dataclass(frozen=True, slots=True)
class ProbeAnswer:
    """A 200 answer to a GET: `piece` written `repeat` times (each one write), with the
    `Content-Length` `claimed` (None: a chunked body), then its end, or with `stall` no
    end: the answer stays open, silent, until the router hangs up."""

    piece: bytes
    repeat: int = 1
    claimed: int | None = None
    stall: bool = False
    content_type: str = "application/json"


def sse(event: Any) -> bytes:
    """One SSE event of `event`'s JSON, or `[DONE]` for the string "[DONE]"."""
    data = event if event == "[DONE]" else json.dumps(event, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


class HostileEngine:
    def __init__(
        self,
        script: Callable[[dict[str, Any]], Script],
        *,
        ports: int = 1,
        probes: Mapping[str, ProbeAnswer] | None = None,
    ) -> None:
        self._script = script
        self._ports = ports
        self._probes = dict(probes or {})
        self.probed: collections.Counter[str] = collections.Counter()
        self._asked = asyncio.Condition()
        self._closing = asyncio.Event()  # stalled answers end when the engine stops
        self._runner: web.AppRunner | None = None
        self.urls: list[str] = []
        self.requests = 0
        self.flooded = 0  # bytes the last flood wrote

    async def __aenter__(self) -> HostileEngine:
        app = web.Application()
        for path in self._probes:
            app.router.add_get(path, self._probe)
        if "/health" not in self._probes:
            app.router.add_get("/health", self._health)
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_post("/v1/completions", self._complete)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        for _ in range(self._ports):
            await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        ports = [a[1] for a in self._runner.addresses if isinstance(a, tuple)]
        self.urls = [f"http://127.0.0.1:{port}" for port in ports]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()

    def settings(self, model: str) -> dict[str, Any]:
        """A router configuration (as YAML would give it) with one `openai` engine per
        port, open admission and one attempt per engine."""
        return {
            "model": model,
            "engines": [
                {"name": f"h{i}", "url": url, "dialect": "openai"}
                for i, url in enumerate(self.urls)
            ],
            "admission": {"mode": "open"},
            "fleet": {"max_attempts": len(self.urls)},
        }

    def config(self, model: str) -> Config:
        """`settings` as the router's typed configuration, for a router in this process."""
        return config_from_mapping(self.settings(model))

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def asked(self, path: str, times: int, within: float) -> int:
        """Wait until GET `path` has been asked `times` times, at most `within` seconds;
        how many times it was."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within), self._asked:
                await self._asked.wait_for(lambda: self.probed[path] >= times)
        return self.probed[path]

    async def _probe(self, request: web.Request) -> web.StreamResponse:
        self.probed[request.path] += 1
        async with self._asked:
            self._asked.notify_all()
        answer = self._probes[request.path]
        response = web.StreamResponse(headers={"Content-Type": answer.content_type})
        if answer.claimed is None:
            response.enable_chunked_encoding()
        else:
            response.content_length = answer.claimed
        await response.prepare(request)
        try:
            for _ in range(answer.repeat):
                await response.write(answer.piece)
            if not answer.stall:
                await response.write_eof()
                return response
            await self._closing.wait()
        except ConnectionError:
            pass  # the router hung up on it, as it should
        return response

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        script = self._script(await request.json())
        if script.status != 200:
            body = b"".join(script.pieces)
            return web.Response(status=script.status, body=body, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            for i, piece in enumerate(script.pieces):
                if i == script.pause_after:
                    await asyncio.sleep(script.pause_s)
                await response.write(piece)
            if script.flood:
                await self._flood(response, script.flood, script.flood_s)
            for piece in script.after:
                await response.write(piece)
        except ConnectionError:
            return response  # the router hung up (it refused what it read): no error here
        if script.abort:
            assert request.transport is not None
            request.transport.abort()
            return response
        await response.write_eof()
        return response

    async def _flood(self, response: web.StreamResponse, flood: bytes, seconds: float) -> None:
        self.flooded = 0
        end = asyncio.get_running_loop().time() + seconds
        while asyncio.get_running_loop().time() < end:
            await response.write(flood)  # waits only while the router's socket is full
            self.flooded += len(flood)
            await asyncio.sleep(0)  # the write may not wait: the test's own tasks run too
