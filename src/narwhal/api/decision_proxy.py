"""A relay worker's `/ready`, `/metrics` and `/admin/*`: passed on to the decision process.

With relay workers (`serving.workers` above 1) the client port is the workers', and any
of them may take a probe or an operator's call; the answers are the whole router's, so
each is passed to the decision process over its Unix socket, with the method, path,
query, body and the headers that matter (the admin token), and its answer relayed as it
came. Without the decision process a worker answers 503 `router_unavailable`, the same
as its completion routes.
"""

from __future__ import annotations

from typing import Final

import aiohttp
from aiohttp import web

from narwhal.api.request_id import current_request_id
from narwhal.api.responses import error_response
from narwhal.errors import RouterUnavailable

# The decision process answers from memory (a reload reads its file in a thread): past
# this, it is stuck, and the caller gets a 503 rather than a hung probe.
PROXY_TIMEOUT_S: Final = 10.0
# What an answer may hold: a /metrics page of many engines, an /admin listing.
MAX_ANSWER_BYTES: Final = 64 * 1024 * 1024
_FORWARDED: Final = ("Authorization", "Content-Type", "Accept", "X-Request-Id")
_RELAYED: Final = ("Content-Type", "Retry-After", "WWW-Authenticate")


class DecisionProxy:
    def __init__(self, socket_path: str) -> None:
        self._path = socket_path
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=self._path),
                timeout=aiohttp.ClientTimeout(total=PROXY_TIMEOUT_S),
                auto_decompress=False,
            )
        return self._session

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read() if request.can_read_body else None
        headers = {k: request.headers[k] for k in _FORWARDED if k in request.headers}
        try:
            async with self._open().request(
                request.method, f"http://decision{request.rel_url}", data=body, headers=headers
            ) as answer:
                payload = await answer.content.read(MAX_ANSWER_BYTES + 1)
                if len(payload) > MAX_ANSWER_BYTES:
                    raise aiohttp.ClientPayloadError("the answer is over the bound")
                relayed = {k: answer.headers[k] for k in _RELAYED if k in answer.headers}
                return web.Response(status=answer.status, body=payload, headers=relayed)
        except (TimeoutError, aiohttp.ClientError, OSError):
            error = RouterUnavailable.not_admitting("decision_unreachable")
            return error_response(error, current_request_id.get())
