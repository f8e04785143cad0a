"""Reading a request body without ever holding more than the configured limit."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from narwhal.errors import RequestTooLarge


class BodyIncomplete(Exception):
    """The body ended before its declared length: the client went away or sent a truncated body."""


class BodyLate(Exception):
    """The request deadline came before the whole body did."""


async def read_limited_body(request: web.Request, limit: int, deadline: float) -> bytes:
    """The whole body, or RequestTooLarge as soon as it is known to exceed `limit`, or
    BodyLate when it has not all come by `deadline` (time.monotonic()).

    A declared Content-Length over the limit is refused before a byte is read; a chunked
    (or lying) body is refused as soon as the bytes read pass the limit.
    """
    declared = request.content_length
    if declared is not None and declared > limit:
        raise RequestTooLarge(limit)
    if request.content.is_eof():
        return await _read(request, limit, declared)  # all in hand: nothing to wait for
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout_at(loop.time() + (deadline - time.monotonic())):
            return await _read(request, limit, declared)
    except TimeoutError:
        raise BodyLate from None


async def _read(request: web.Request, limit: int, declared: int | None) -> bytes:
    parts: list[bytes] = []
    size = 0
    stream = request.content
    try:
        while True:
            chunk = await stream.readany()
            if not chunk:
                break
            size += len(chunk)
            if size > limit:
                raise RequestTooLarge(limit)
            parts.append(chunk)
    except (ConnectionError, EOFError, HttpProcessingError, web.RequestPayloadError) as e:
        # A framing fault in the body (a bad chunk) is the client's, like a short body.
        raise BodyIncomplete(str(e)) from e
    if declared is not None and size < declared:
        raise BodyIncomplete(f"body ended after {size} of {declared} bytes")
    if not stream.is_eof():
        raise BodyIncomplete("body ended early")
    return b"".join(parts)
