"""`StreamBody` against the aiohttp installed: the internals it relies on are still there
and still behave, byte for byte, for each HTTP version.

A failure here names the aiohttp detail that changed (see the docstring of
narwhal/api/stream_body.py for what each one is for): fix `StreamBody` before shipping on
that aiohttp, or streams to clients come out corrupted or cost more.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import aiohttp
import pytest
from aiohttp import web
from aiohttp.base_protocol import BaseProtocol
from aiohttp.http_writer import StreamWriter

from narwhal.api.stream_body import StreamBody
from tests.in_process import serve_app
from tests.raw_http import RawResponse, is_closed, read_response, request

CHECKED = "3.14.5"  # the aiohttp StreamBody was last checked against
FIRST, NEXT, LAST = b"data: 1\n\n", b"data: 22\n\n", b"data: [DONE]\n\n"


def _changed(what: str) -> str:
    return (
        f"aiohttp {aiohttp.__version__} changed {what} (StreamBody was checked against "
        f"aiohttp {CHECKED}; see narwhal/api/stream_body.py)"
    )


def test_the_attributes_stream_body_uses_are_there() -> None:
    immediately = inspect.getattr_static(web.StreamResponse, "_send_headers_immediately", None)
    assert immediately is True, _changed(
        "StreamResponse._send_headers_immediately (expected a class attribute, True): "
        "holding the headers back for the first write may no longer work"
    )
    assert isinstance(inspect.getattr_static(BaseProtocol, "writing_paused", None), property), (
        _changed("BaseProtocol.writing_paused (expected a property)")
    )
    assert "chunked" in vars(StreamWriter), _changed("StreamWriter.chunked (expected)")


@dataclass
class _Server:
    port: int
    release: asyncio.Event = field(default_factory=asyncio.Event)
    framing: list[tuple[bool, bool]] = field(default_factory=list)
    ends: list[tuple[bool, bool]] = field(default_factory=list)


@pytest.fixture
async def server() -> AsyncIterator[_Server]:
    """A handler writing FIRST through aiohttp, NEXT around it, LAST as the end. It holds
    after start() until `release` is set (then cleared for the next request). For each
    request it notes the framing (StreamBody's chunked, the writer's) and `can_end_now`
    for LAST and for data that fills the buffer to its high-water mark before its framing
    (an end that could pause writing, so not one that cannot wait)."""
    state = _Server(port=0)

    async def handler(http: web.Request) -> web.StreamResponse:
        body = StreamBody(http, {"Content-Type": "text/event-stream"})
        await body.start()
        await state.release.wait()
        state.release.clear()
        writer_chunked = getattr(http.writer, "chunked", None)
        await body.write(FIRST)
        body.write_now(NEXT)
        transport = http.transport
        assert transport is not None
        fills = transport.get_write_buffer_limits()[1] - transport.get_write_buffer_size()
        state.framing.append((body.chunked, writer_chunked is True))
        state.ends.append((body.can_end_now(len(LAST)), body.can_end_now(fills)))
        await body.end(LAST)
        return body.response

    app = web.Application()
    app.router.add_post("/", handler)
    runner, base = await serve_app(app)
    state.port = urlsplit(base).port or 0
    try:
        yield state
    finally:
        await runner.cleanup()


async def _exchange(
    server: _Server,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    version: str,
    connection: str | None,
) -> RawResponse:
    """One request and its response once the handler is released, after checking that
    nothing came before it wrote (the headers waited for the first bytes)."""
    writer.write(request("/", {}, version=version, connection=connection))
    await writer.drain()
    try:
        early = await asyncio.wait_for(reader.read(1), 0.3)
    except TimeoutError:
        early = b""
    assert early == b"", _changed(
        "when headers are sent: they left at prepare(), before the first write "
        "(StreamResponse._send_headers_immediately no longer holds them back)"
    )
    server.release.set()
    return await read_response(reader)


@pytest.mark.parametrize("connection", [None, "keep-alive"])
async def test_http10_gets_the_raw_bytes_and_the_end_by_close(
    server: _Server, connection: str | None
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(request("/", {}, version="1.0", connection=connection))
        await writer.drain()
        server.release.set()
        response = await read_response(reader)
    finally:
        writer.close()
    assert response.version == "HTTP/1.0" and response.status == 200
    assert response.framing == "close", response.headers
    assert response.headers["connection"] == "close"
    assert "content-length" not in response.headers
    assert response.body == FIRST + NEXT + LAST, _changed(
        "the payload writer's framing for HTTP/1.0 (bytes around it no longer land in order)"
    )
    assert server.framing == [(False, False)], _changed("StreamWriter.chunked for HTTP/1.0")
    assert server.ends == [(True, False)]


async def test_http11_gets_chunks_and_keeps_the_connection(server: _Server) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        for _ in range(2):  # the second response on the same connection
            writer.write(request("/", {}, version="1.1"))
            await writer.drain()
            server.release.set()
            raw = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 10)
            head, _, chunks = raw.partition(b"\r\n\r\n")
            assert b"\r\nTransfer-Encoding: chunked" in head and b"Connection:" not in head
            assert chunks == (
                b"9\r\ndata: 1\n\n\r\na\r\ndata: 22\n\n\r\ne\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"
            ), _changed("the payload writer's chunked framing (a chunk boundary moved)")
        assert not await is_closed(reader, timeout=0.3)
    finally:
        writer.close()
    assert server.framing == [(True, True)] * 2, _changed("StreamWriter.chunked for HTTP/1.1")
    assert server.ends == [(True, False)] * 2


async def test_http11_connection_close_gets_chunks_then_the_close(server: _Server) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(request("/", {}, version="1.1", connection="close"))
        await writer.drain()
        server.release.set()
        response = await read_response(reader)
        assert await is_closed(reader)
    finally:
        writer.close()
    assert response.framing == "chunked" and response.headers["connection"] == "close"
    assert response.body == FIRST + NEXT + LAST


@pytest.mark.parametrize("version", ["1.0", "1.1"])
async def test_the_headers_wait_for_the_first_bytes(server: _Server, version: str) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        response = await _exchange(server, reader, writer, version, "close")
    finally:
        writer.close()
    assert response.body == FIRST + NEXT + LAST
