"""Reading an engine's answer to a probe (/health, /metrics, /v1/models, /version,
/tokenize) within a byte bound.

These answers are read whole, so an engine must not choose how much the router holds: a
`Content-Length` over the bound is refused before a byte of the body is read, and a body
without one (chunked, or ended by closing) is read a socket read at a time and given up
as soon as it passes the bound. Either way the connection is closed, not drained for
reuse: what is left of it could be gigabytes, or never come. While reading, aiohttp's
stream buffer pauses the socket past its high-water mark (a few hundred KiB), so the
router holds at most the bound plus one read. Time is the caller's: the request's own
total timeout covers the body, so a stall mid-body is a timeout.
"""

from __future__ import annotations

import aiohttp


class AnswerTooLarge(Exception):
    """The answer is (or says it is) over `limit` bytes; the connection is closed."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"answer over {limit} bytes")
        self.limit = limit


async def read_bounded(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The whole body of `response`, at most `limit` bytes; else AnswerTooLarge."""
    length = response.content_length
    if length is not None and length > limit:
        response.close()
        raise AnswerTooLarge(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        if size > limit:
            chunks.clear()
            response.close()
            raise AnswerTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)
