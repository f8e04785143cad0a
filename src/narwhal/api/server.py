"""The HTTP/1.1 server under the application: aiohttp's, with two changes a router on a
network needs.

- A message aiohttp's parser refuses (two Content-Length headers, Content-Length with
  Transfer-Encoding, a header line past 8190 bytes, a bad request line) gets the OpenAI
  envelope with its 400, not a text/plain body, and is logged as what it is, the client's
  fault: one INFO line, where aiohttp logs an ERROR with a traceback for each.
- A request head must arrive within `head_timeout_s` of its first byte (or of the
  connection's opening): a client trickling header bytes has its connection closed then,
  where aiohttp waits until its keep-alive timeout (an hour in 3.14). The request deadline
  covers the body (api/body.py); this covers what comes before it. The connection is
  closed without a response, as nginx does for client_header_timeout: no request has been
  read to answer.

aiohttp builds its protocol inside `web.Server.__call__` from an `AppRunner`'s private
`_make_server`, with no hook for the class; `ClientRunner` and `_Server` stand in for them
(tests/e2e/test_bad_input.py pins the behaviour on the aiohttp in use).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMethod, HttpProcessingError, InvalidURLError
from aiohttp.typedefs import Handler
from aiohttp.web_request import BaseRequest

from narwhal.api.request_id import choose_request_id
from narwhal.api.responses import error_response
from narwhal.config import ServingConfig
from narwhal.errors import InvalidRequest

log = logging.getLogger(__name__)

_HEAD_TIMEOUT_MAX_S = 60.0  # nginx's client_header_timeout
_DETAIL_CHARS = 120
_QUOTED_BYTES = re.compile(r":\s*(?:b|bytearray\(b)['\"].*$")


def head_timeout_s(serving: ServingConfig) -> float:
    """How long a request head may take: no longer than the request itself may
    (serving.request_timeout_s), and at most a minute."""
    return min(_HEAD_TIMEOUT_MAX_S, serving.request_timeout_s)


class ClientProtocol(web.RequestHandler):
    __slots__ = ("_head_timeout", "_head_timer", "_in_request")

    def __init__(self, manager: web.Server, *, head_timeout: float, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._head_timeout = head_timeout
        self._head_timer: asyncio.TimerHandle | None = None
        self._in_request = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if not self._in_request:
            self._arm()  # bytes of a request head (or of a refused body aiohttp drains)
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    @contextmanager
    def handling(self) -> Iterator[None]:
        """While a request's handler runs: its head is in, the head timer has no say."""
        self._disarm()
        self._in_request = True
        try:
            yield
        finally:
            self._in_request = False

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        client_fault = isinstance(exc, HttpProcessingError) and 400 <= status < 500
        if not client_fault or request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)
        detail = _first_line(message or str(exc))
        if isinstance(exc, InvalidURLError):  # its message is the target alone
            detail = f"invalid request target {detail}"
        # aiohttp's own choice: a first request that is not HTTP at all (TLS to a plain
        # port, a scanner) is noise at DEBUG.
        level = logging.DEBUG if isinstance(exc, BadHttpMethod) else logging.INFO
        log.log(level, "refused a malformed HTTP request from %s: %s", request.remote, detail)
        error = InvalidRequest(f"Malformed HTTP request: {detail}")
        response = error_response(error, choose_request_id(None))
        response.set_status(status)
        response.force_close()  # where the next message would start is unknown
        return response

    def _arm(self) -> None:
        if self._head_timer is None:
            loop = asyncio.get_running_loop()
            self._head_timer = loop.call_later(self._head_timeout, self._head_late)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self._in_request:
            return
        transport = self.transport
        peer = None if transport is None else transport.get_extra_info("peername")
        log.info(
            "closed a connection from %s: no whole request head within %g s",
            peer[0] if isinstance(peer, tuple) else peer,
            self._head_timeout,
        )
        self.force_close()


@web.middleware
async def request_in_progress(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Tell the connection's protocol that a request is being handled (see `handling`)."""
    protocol = request.protocol
    if not isinstance(protocol, ClientProtocol):  # an application served by a plain runner
        return await handler(request)
    with protocol.handling():
        return await handler(request)


class _Server(web.Server):
    """web.Server making a ClientProtocol per connection (as its own __call__ does)."""

    def __init__(self, handler: Any, *, head_timeout: float, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self._head_timeout = head_timeout

    def __call__(self) -> web.RequestHandler:
        return ClientProtocol(
            self, loop=self._loop, head_timeout=self._head_timeout, **self._kwargs
        )


class ClientRunner(web.AppRunner):
    """web.AppRunner whose connections are served by ClientProtocol."""

    __slots__ = ("_head_timeout",)

    def __init__(self, app: web.Application, *, head_timeout: float, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._head_timeout = head_timeout

    def set_head_timeout(self, seconds: float) -> None:
        """For connections opened from now on (a reload changed serving.request_timeout_s)."""
        self._head_timeout = seconds
        server = self.server
        if isinstance(server, _Server):
            server._head_timeout = seconds

    def set_shutdown_timeout(self, seconds: float) -> None:
        """How long `cleanup()` waits for requests in progress before it cancels them
        (aiohttp's own setting, read when the shutdown starts)."""
        self._shutdown_timeout = seconds

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()  # starts the application, as before
        return _Server(
            server.request_handler,
            request_factory=server.request_factory,
            handler_cancellation=server.handler_cancellation,
            loop=server._loop,
            head_timeout=self._head_timeout,
            **server._kwargs,
        )


def _first_line(text: str) -> str:
    """The parser's message without the bytes it quotes (a header line past 8190 bytes is
    not echoed back), and no longer than a line."""
    line = text.strip().splitlines()[0] if text.strip() else "unreadable"
    line = _QUOTED_BYTES.sub("", line).rstrip(": ")
    return line if len(line) <= _DETAIL_CHARS else f"{line[: _DETAIL_CHARS - 1]}…"
