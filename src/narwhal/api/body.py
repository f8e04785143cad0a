"""Reading a request body without ever holding more than the configured limit."""

from __future__ import annotations

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from narwhal.errors import RequestTooLarge


class BodyIncomplete(Exception):
    """The body ended before its declared length: the client went away or sent a truncated body."""


async def read_limited_body(request: web.Request, limit: int) -> bytes:
    """The whole body, or RequestTooLarge as soon as it is known to exceed `limit`.

    A declared Content-Length over the limit is refused before a byte is read; a chunked
    (or lying) body is refused as soon as the bytes read pass the limit.
    """
    declared = request.content_length
    if declared is not None and declared > limit:
        raise RequestTooLarge(limit)
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
    except (ConnectionError, EOFError, HttpProcessingError) as e:
        raise BodyIncomplete(str(e)) from e
    if declared is not None and size < declared:
        raise BodyIncomplete(f"body ended after {size} of {declared} bytes")
    if not stream.is_eof():
        raise BodyIncomplete("body ended early")
    return b"".join(parts)
