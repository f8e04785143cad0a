"""The body of a streaming response, written around aiohttp: the one place in Narwhal that
relies on aiohttp's internals.

The relay forwards each engine read from the engine connection's callback straight to
the client's transport, one write per read and no task switch, which aiohttp's public
writes (coroutines) cannot do. Only the first bytes and the end go through aiohttp
(`StreamResponse.write()`, `write_eof()`). Writing around aiohttp's payload writer means
framing the bytes as the response does, and the framing is chosen here, with aiohttp's
public API, from the request's HTTP version:

- HTTP/1.1: chunked (`enable_chunked_encoding()`). Each write is one chunk, aiohttp's
  `write_eof()` writes the last one, and the connection serves the next request unless
  the client asked for `Connection: close`.
- HTTP/1.0 (nginx's default towards upstreams, among others): no chunked encoding exists
  (RFC 9112 section 6.1: no Transfer-Encoding in a response to an HTTP/1.0 request), and a
  stream has no Content-Length, so the body is the raw bytes and ends when the connection
  does (RFC 9112 section 6.3, rule 8): `Connection: close` (`force_close()`) whatever the
  client's `Connection: keep-alive` asked. An aborted connection then reads as a clean
  end of the body; the missing `data: [DONE]` is what tells it from a complete stream.

aiohttp internals used, checked against aiohttp 3.14.5 only (the version the tests run
on; pyproject.toml allows 3.9 on, untested here) and pinned by
tests/api/test_stream_body.py, whose failures name what changed:

1. `StreamResponse._send_headers_immediately`, a class attribute (added in the 3.12 series
   by aio-libs/aiohttp#10991, May 2025), set False: the headers leave with the first body
   bytes in one write instead of on a write of their own at `prepare()`. Where it is
   absent, or if it goes or changes meaning, streams stay correct and each costs one more
   write.
2. The payload writer's contract (`BaseRequest.writer`, an `http_writer.StreamWriter`): it
   frames the body as the response's headers say (its `chunked` attribute), it has handed
   the headers and all it was given to the transport when a non-empty `write()` returns,
   it writes nothing of its own between writes, and its `write_eof()` adds only the last
   chunk (`0\\r\\n\\r\\n`) when chunked. Bytes written to the transport directly then land
   in the body, in order. If that changes, clients get corrupted bodies; the test reads
   the bytes a raw socket receives, for both versions.
3. `BaseRequest.protocol.writing_paused` (aiohttp's `BaseProtocol`): whether the writer's
   `drain()` would wait (it tests the same flag, `_paused`). If it goes, ending a stream
   raises AttributeError (an internal error, not a corrupted stream).

Bytes written around the writer are not in aiohttp's own counts (`body_length`, the
access log's `%b`); Narwhal reads neither.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Final, cast

from aiohttp import HttpVersion11, hdrs, web

# Room for what `end()` writes besides its data: the chunk's framing and, when nothing was
# written before, the headers (Narwhal's own few, well under this).
_END_SLACK: Final = 2048


class _HeadersWithFirstBytes(web.StreamResponse):
    """A stream response whose headers leave with the first body bytes, in one write.

    aiohttp writes a StreamResponse's headers at prepare() by default (one more syscall per
    request); the relay always writes right after prepare(), so holding the headers back
    delays nothing. (Internal 1 in the module's docstring.)
    """

    _send_headers_immediately = False


class StreamBody:
    """One streaming response's body: `start()` it, `write()` the first bytes through
    aiohttp, `write_now()` the rest from callbacks, `end()` it through aiohttp."""

    __slots__ = ("_http", "_transport", "chunked", "response")

    _transport: asyncio.WriteTransport

    def __init__(self, http: web.Request, headers: Mapping[str, str]) -> None:
        self._http = http
        self.response: web.StreamResponse = _HeadersWithFirstBytes(headers=headers)
        # aiohttp allows chunked encoding for HTTP/1.1 only (RFC 9112 section 6.1).
        self.chunked = http.version == HttpVersion11
        if self.chunked:
            self.response.enable_chunked_encoding()
        else:
            self.response.force_close()
            self.response.headers[hdrs.CONNECTION] = "close"

    async def start(self) -> None:
        """Prepare the response (its headers leave with the first write). Raises
        ConnectionResetError when the client is gone already."""
        await self.response.prepare(self._http)
        transport = self._http.transport
        if transport is None:
            raise ConnectionResetError("the client closed the connection")
        self._transport = cast("asyncio.WriteTransport", transport)

    async def write(self, data: bytes) -> None:
        """Write through aiohttp (the headers leave with the first non-empty write)."""
        await self.response.write(data)

    def write_now(self, data: bytes) -> int:
        """Write body bytes at once, framed as the response is, after at least one
        non-empty `write()`; return the bytes now waiting in the client's socket buffer.
        Raises ConnectionResetError when the client is gone."""
        transport = self._transport
        if transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        if self.chunked:
            transport.write(b"%x\r\n%b\r\n" % (len(data), data))
        else:
            transport.write(data)
        return transport.get_write_buffer_size()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def can_end_now(self, size: int) -> bool:
        """Whether `end()` with `size` bytes cannot wait: writing is on and stays on.
        Raises ConnectionResetError when the client is gone."""
        transport = self._transport
        if transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        _, high = transport.get_write_buffer_limits()
        buffered = transport.get_write_buffer_size()
        return not self._http.protocol.writing_paused and buffered + size + _END_SLACK <= high

    async def drain(self) -> None:
        """Wait until the client has taken enough of what was written (aiohttp's flow
        control: its low-water mark)."""
        await self._http.writer.drain()

    async def end(self, data: bytes) -> None:
        """End the body with `data`, through aiohttp: the last chunk for HTTP/1.1; for
        HTTP/1.0 aiohttp closes the connection once the handler returns."""
        await self.response.write_eof(data)

    def abort(self) -> None:
        """Cut the client off at once."""
        self._transport.abort()
