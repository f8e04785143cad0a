"""The engine HTTP client against real sockets on 127.0.0.1.

Most servers are `asyncio.start_server` handlers writing raw bytes, so each test controls
the framing, the timing and the moment a connection closes; one is an aiohttp.web
server streaming SSE the way an engine does.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import select
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import cast

import pytest
import uvloop
from aiohttp import web

from narwhal.engines.upstream import UpstreamConnectionError, UpstreamPool, UpstreamResponse

Handler = Callable[["Server", asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
MiB = 1 << 20


class Server:
    """A raw-bytes server: every connection runs `handler`; connections are counted."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self.eofs = 0  # connections on which the server saw the client close
        self.eof = asyncio.Event()
        self.url = ""
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        """The next request, head and body; b"" when the client closed instead."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return b""
        match = re.search(rb"(?i)\r\ncontent-length: *([0-9]+)", head)
        request = head + await reader.readexactly(int(match.group(1)) if match else 0)
        self.requests.append(request)
        return request

    async def until_eof(self, reader: asyncio.StreamReader) -> None:
        """Read until the client closes (FIN or reset); count it."""
        with contextlib.suppress(ConnectionError):
            while await reader.read(65536):
                pass
        self.eofs += 1
        self.eof.set()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self.handler(self, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            self._tasks.discard(task)


def response(body: bytes = b"ok", status: str = "200 OK", headers: bytes = b"") -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Length: %d\r\n%s\r\n%s" % (
        status.encode(),
        len(body),
        headers,
        body,
    )


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


CHUNKED_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)


async def keep_alive(server: Server, reader: asyncio.StreamReader, writer: Writer) -> None:
    """Answer every request on the connection with a small body, until the client closes."""
    while request := await server.read_request(reader):
        writer.write(response(b"answer to " + request.split(b" ")[1]))
    server.eofs += 1
    server.eof.set()


Writer = asyncio.StreamWriter
Start = Callable[[Handler], Awaitable[Server]]


@pytest.fixture
async def serve() -> AsyncIterator[Start]:
    servers: list[Server] = []

    async def start(handler: Handler) -> Server:
        server = Server(handler)
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()


@pytest.fixture
async def pool() -> AsyncIterator[UpstreamPool]:
    upstream = UpstreamPool(connect_timeout=2.0)
    yield upstream
    await upstream.close()


async def post(pool: UpstreamPool, url: str, path: str = "/v1/completions") -> UpstreamResponse:
    return await pool.request(url, "POST", path, {"Content-Type": "application/json"}, b"{}")


async def read_all(response: UpstreamResponse) -> bytes:
    parts = []
    while chunk := await response.read_chunk():
        parts.append(chunk)
    return b"".join(parts)


def idle_connections(pool: UpstreamPool) -> int:
    return sum(len(idle) for idle in pool._idle.values())


async def eventually(condition: Callable[[], bool], timeout: float = 2.0) -> None:
    """Poll: the pool's bookkeeping has no event a test could wait on."""
    async with asyncio.timeout(timeout):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


# -- Requests and bodies -----------------------------------------------------------------


async def test_the_request_is_one_plain_http11_message(serve: Start, pool: UpstreamPool) -> None:
    server = await serve(keep_alive)
    port = server.url.rsplit(":", 1)[1]
    headers = {"Content-Type": "application/json", "X-Request-Id": "r-1"}
    resp = await pool.request(server.url + "/engine/", "POST", "/v1/chat", headers, b'{"a":1}')
    assert await read_all(resp) == b"answer to /engine/v1/chat"
    resp.release()
    assert server.requests == [
        b"POST /engine/v1/chat HTTP/1.1\r\n"
        b"Host: 127.0.0.1:" + port.encode() + b"\r\n"
        b"Content-Type: application/json\r\n"
        b"X-Request-Id: r-1\r\n"
        b"Content-Length: 7\r\n"
        b"\r\n"
        b'{"a":1}'
    ]


@pytest.mark.parametrize(
    ("headers", "error"),
    [
        ({"X-A": "a\r\nX-Injected: 1"}, "CR, LF or NUL"),
        ({"X-A": "a\nb"}, "CR, LF or NUL"),
        ({"Bad Name": "a"}, "invalid header name"),
        ({"Host": "elsewhere"}, "set by the client"),
        ({"content-length": "3"}, "set by the client"),
        ({"Transfer-Encoding": "chunked"}, "set by the client"),
    ],
)
async def test_invalid_request_headers(
    pool: UpstreamPool, headers: dict[str, str], error: str
) -> None:
    with pytest.raises(ValueError, match=error):
        await pool.request("http://127.0.0.1:1", "POST", "/", headers, b"")


async def test_invalid_requests(pool: UpstreamPool) -> None:
    with pytest.raises(ValueError, match="not supported"):
        await pool.request("http://127.0.0.1:1", "HEAD", "/", {}, b"")
    with pytest.raises(ValueError, match="invalid request path"):
        await pool.request("http://127.0.0.1:1", "POST", "/a b", {}, b"")
    with pytest.raises(ValueError, match="http:// or https://"):
        await pool.request("ftp://127.0.0.1:1", "POST", "/", {}, b"")


async def test_a_chunked_stream_arrives_as_it_is_sent(serve: Start, pool: UpstreamPool) -> None:
    go = asyncio.Event()

    async def stream(server: Server, reader: asyncio.StreamReader, writer: Writer) -> None:
        await server.read_request(reader)
        writer.write(CHUNKED_HEAD + chunk(b"data: 1\n\n"))
        for i in range(2, 5):
            await go.wait()
            go.clear()
            writer.write(chunk(b"data: %d\n\n" % i) + (b"0\r\n\r\n" if i == 4 else b""))
        await server.until_eof(reader)

    server = await serve(stream)
    resp = await post(pool, server.url)
    assert (resp.status, resp.reason) == (200, "OK")
    assert resp.headers["content-type"] == "text/event-stream"
    assert await resp.read_chunk() == b"data: 1\n\n"  # came with the head
    for i in range(2, 5):
        reading = asyncio.create_task(resp.read_chunk())
        await asyncio.sleep(0.02)
        assert not reading.done()  # it waits for the engine
        go.set()
        assert await reading == b"data: %d\n\n" % i
    assert await resp.read_chunk() == b""
    assert resp.at_eof()
    resp.release()
    assert idle_connections(pool) == 1


async def test_a_content_length_body(serve: Start, pool: UpstreamPool) -> None:
    async def answer(server: Server, reader: asyncio.StreamReader, writer: Writer) -> None:
        await server.read_request(reader)
        writer.write(response(b"x" * 100_000, headers=b"X-A: 1\r\nX-A: 2\r\n")[:-50_000])
        await asyncio.sleep(0.02)
        writer.write(b"x" * 50_000)
        await server.until_eof(reader)

    server = await serve(answer)
    resp = await post(pool, server.url)
    assert resp.headers == {"content-length": "100000", "x-a": "1, 2"}
    assert not resp.at_eof()
    assert await read_all(resp) == b"x" * 100_000
    assert resp.at_eof()
    resp.release()


async def test_a_body_read_until_close(serve: Start, pool: UpstreamPool) -> None:
    async def answer(server: Server, reader: asyncio.StreamReader, writer: Writer) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n\r\nall of ")
        await asyncio.sleep(0.02)
        writer.write(b"it")
        await writer.drain()

    server = await serve(answer)
    resp = await post(pool, server.url)
    assert await read_all(resp) == b"all of it"
    assert resp.at_eof()
    resp.release()
    assert idle_connections(pool) == 0


async def test_a_disconnect_mid_body_is_an_error(serve: Start, pool: UpstreamPool) -> None:
    async def answer(server: Server, reader: asyncio.StreamReader, writer: Writer) -> None:
        await server.read_request(reader)
        writer.write(CHUNKED_HEAD + chunk(b"data: 1\n\n"))
        await writer.drain()

    server = await serve(answer)
    resp = await post(pool, server.url)
    assert await resp.read_chunk() == b"data: 1\n\n"
    with pytest.raises(UpstreamConnectionError, match=r"closed the connection mid-body"):
        await resp.read_chunk()
    assert not resp.at_eof()
    resp.release()  # closes it: the body is incomplete
    assert idle_connections(pool) == 0


async def test_a_malformed_response_is_an_error(serve: Start, pool: UpstreamPool) -> None:
    async def answer(server: Server, reader: asyncio.StreamReader, writer: Writer) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: nope\r\n\r\n")
        await server.until_eof(reader)

    server = await serve(answer)
    with pytest.raises(UpstreamConnectionError) as raised:
        await post(pool, server.url)
    port = server.url.rsplit(":", 1)[1]
    assert str(raised.value) == (
        f"127.0.0.1:{port} sent a malformed response: invalid Content-Length 'nope'"
    )
    await asyncio.wait_for(server.eof.wait(), 2)


async def test_read_with_a_limit_on_an_error_body(serve: Start, pool: UpstreamPool) -> None:
    body = b'{"error": "' + b"e" * 200_000 + b'"}'

    async def answer(server: Server, reader: asyncio.StreamReader, writer: Writer) -> None:
        await server.read_request(reader)
        writer.write(response(body, status="500 Internal Server Error"))
        await server.read_request(reader)
        writer.write(response(b'{"error": "short"}', status="422 Unprocessable Entity"))
        await server.until_eof(reader)

    server = await serve(answer)
    resp = await post(pool, server.url)
    assert (resp.status, resp.reason) == (500, "Internal Server Error")
    assert await resp.read(1000) == body[:1000]
    assert await resp.read(10) == body[1000:1010]  # what the limit held back comes next
    assert await resp.read(len(body)) == body[1010:]
    assert await resp.read(10) == b""
    assert resp.at_eof()
    resp.release()
    assert idle_connections(pool) == 1

    resp = await post(pool, server.url)
    assert resp.status == 422
    assert await resp.read(64 * 1024) == b'{"error": "short"}'
    assert resp.at_eof()
    resp.release()
    assert server.connections == 1


# -- The pool ------------------------------------------------------------------------------


async def test_sequential_requests_share_one_connection(serve: Start, pool: UpstreamPool) -> None:
    server = await serve(keep_alive)
    for path in ("/a", "/b", "/c"):
        resp = await post(pool, server.url, path)
        assert await read_all(resp) == b"answer to " + path.encode()
        resp.release()
    assert server.connections == 1
    assert idle_connections(pool) == 1


async def test_concurrent_requests_use_separate_connections(
    serve: Start, pool: UpstreamPool
) -> None:
    server = await serve(keep_alive)
    first = await post(pool, server.url, "/1")
    second = await post(pool, server.url, "/2")
    assert await read_all(second) == b"answer to /2"
    assert await read_all(first) == b"answer to /1"
    first.release()
    second.release()
    assert server.connections == 2
    assert idle_connections(pool) == 2
    resp = await post(pool, server.url, "/3")  # LIFO: the connection of /1
    resp.release()
    assert server.connections == 2


async def test_no_reuse_after_connection_close(serve: Start, pool: UpstreamPool) -> None:
    async def answer(server: Server, reader: asyncio.StreamReader, writer: Writer) -> None:
        await server.read_request(reader)
        writer.write(response(b"bye", headers=b"Connection: close\r\n"))
        await server.until_eof(reader)

    server = await serve(answer)
    for _ in range(2):
        resp = await post(pool, server.url)
        assert await read_all(resp) == b"bye"
        resp.release()
        await asyncio.wait_for(server.eof.wait(), 2)  # the client closed it
        server.eof.clear()
    assert server.connections == 2
    assert idle_connections(pool) == 0


async def test_close_before_the_body_ends_is_seen_by_the_server_at_once(
    serve: Start, pool: UpstreamPool
) -> None:
    async def stream(server: Server, reader: asyncio.StreamReader, writer: Writer) -> None:
        await server.read_request(reader)
        writer.write(CHUNKED_HEAD)
        eof = asyncio.create_task(server.until_eof(reader))
        with contextlib.suppress(ConnectionError):
            while not eof.done():
                writer.write(chunk(b"data: token\n\n"))
                await writer.drain()
                await asyncio.sleep(0.005)
        await eof

    server = await serve(stream)
    resp = await post(pool, server.url)
    assert (await resp.read_chunk()).startswith(b"data: token")
    resp.close()
    await asyncio.wait_for(server.eof.wait(), 1)
    resp.close()
    resp.release()  # no-ops after close
    with pytest.raises(UpstreamConnectionError, match="closed before its body was complete"):
        while await resp.read_chunk():
            pass
    second = await post(pool, server.url)  # a new connection, not the closed one
    second.close()
    assert server.connections == 2


async def test_release_of_an_unfinished_body_closes_the_connection(
    serve: Start, pool: UpstreamPool
) -> None:
    async def answer(server: Server, reader: asyncio.StreamReader, writer: Writer) -> None:
        await server.read_request(reader)
        writer.write(response(b"x" * 1000)[:-500])
        await server.until_eof(reader)

    server = await serve(answer)
    resp = await post(pool, server.url)
    resp.release()
    await asyncio.wait_for(server.eof.wait(), 1)
    assert idle_connections(pool) == 0


async def test_a_cancelled_read_leaves_the_response_closable(
    serve: Start, pool: UpstreamPool
) -> None:
    async def answer(server: Server, reader: asyncio.StreamReader, writer: Writer) -> None:
        await server.read_request(reader)
        writer.write(CHUNKED_HEAD)
        await server.until_eof(reader)

    server = await serve(answer)
    resp = await post(pool, server.url)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(resp.read_chunk(), 0.05)
    resp.close()
    await asyncio.wait_for(server.eof.wait(), 1)


async def test_a_cancelled_request_closes_its_connection(serve: Start, pool: UpstreamPool) -> None:
    async def silent(server: Server, reader: asyncio.StreamReader, writer: Writer) -> None:
        await server.read_request(reader)
        await server.until_eof(reader)

    server = await serve(silent)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(post(pool, server.url), 0.05)
    await asyncio.wait_for(server.eof.wait(), 1)


@pytest.mark.parametrize("how", ["fin", "reset"])
async def test_a_stale_keep_alive_connection_is_retried_once(
    serve: Start, pool: UpstreamPool, how: str
) -> None:
    """The server drops the idle connection just as the next request goes out on it: the
    request comes again on a new connection."""

    async def answer(server: Server, reader: asyncio.StreamReader, writer: Writer) -> None:
        first_connection = server.connections == 1
        await server.read_request(reader)
        writer.write(response(b"first" if first_connection else b"fresh"))
        if first_connection:
            await server.read_request(reader)  # crossed on the wire: never answered
            if how == "reset":
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return
        await server.until_eof(reader)

    server = await serve(answer)
    resp = await post(pool, server.url, "/one")
    assert await read_all(resp) == b"first"
    resp.release()
    resp = await post(pool, server.url, "/two")
    assert await read_all(resp) == b"fresh"
    resp.release()
    assert server.connections == 2
    assert [r.split(b" ")[1] for r in server.requests] == [b"/one", b"/two", b"/two"]


async def test_an_idle_connection_closed_by_the_server_leaves_the_pool(
    serve: Start, pool: UpstreamPool
) -> None:
    async def answer(server: Server, reader: asyncio.StreamReader, writer: Writer) -> None:
        await server.read_request(reader)
        writer.write(response())  # keep-alive, then closed once idle (uvicorn's timeout)

    server = await serve(answer)
    resp = await post(pool, server.url)
    await read_all(resp)
    resp.release()
    await eventually(lambda: idle_connections(pool) == 0)
    resp = await post(pool, server.url)
    assert await read_all(resp) == b"ok"
    resp.release()
    assert server.connections == 2
    assert len(server.requests) == 2  # no retry was needed


async def test_no_retry_once_the_head_has_begun(serve: Start, pool: UpstreamPool) -> None:
    async def answer(server: Server, reader: asyncio.StreamReader, writer: Writer) -> None:
        await server.read_request(reader)
        writer.write(response())
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-")
        await writer.drain()

    server = await serve(answer)
    resp = await post(pool, server.url)
    resp.release()
    port = server.url.rsplit(":", 1)[1]
    with pytest.raises(UpstreamConnectionError) as raised:
        await post(pool, server.url)
    assert str(raised.value) == f"127.0.0.1:{port} closed the connection before the response head"
    assert server.connections == 1


async def test_no_retry_on_a_new_connection(serve: Start, pool: UpstreamPool) -> None:
    async def drop(server: Server, reader: asyncio.StreamReader, writer: Writer) -> None:
        await server.read_request(reader)

    server = await serve(drop)
    with pytest.raises(UpstreamConnectionError, match="before the response head"):
        await post(pool, server.url)
    assert server.connections == 1


async def test_idle_connections_close_after_the_idle_timeout(serve: Start) -> None:
    server = await serve(keep_alive)
    pool = UpstreamPool(idle_timeout=0.1)
    try:
        resp = await post(pool, server.url)
        await read_all(resp)
        resp.release()
        assert idle_connections(pool) == 1
        await asyncio.wait_for(server.eof.wait(), 2)
        assert idle_connections(pool) == 0
    finally:
        await pool.close()


async def test_reading_pauses_while_the_consumer_does_not_read(
    serve: Start, pool: UpstreamPool
) -> None:
    total = 64 * MiB
    written = 0

    async def flood(server: Server, reader: asyncio.StreamReader, writer: Writer) -> None:
        nonlocal written
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % total)
        block = b"x" * (256 * 1024)
        while written < total:
            writer.write(block)
            await writer.drain()
            written += len(block)
        await server.until_eof(reader)

    server = await serve(flood)
    resp = await post(pool, server.url)
    last = -1
    async with asyncio.timeout(10):
        while written != last:  # until the server's writes block
            last = written
            await asyncio.sleep(0.3)
    # What stalled it is the kernel's socket buffers (a few MiB on loopback) on top of
    # the client's 1 MiB: far from all 64.
    assert written < 32 * MiB
    buffered = await resp.read_chunk()
    assert MiB < len(buffered) <= MiB + 256 * 1024  # one socket read past the mark at most
    received = len(buffered) + len(await read_all(resp))  # reading resumes
    assert received == total == written
    assert resp.at_eof()
    resp.release()


async def test_pool_close_closes_idle_and_busy_connections(
    serve: Start, pool: UpstreamPool
) -> None:
    async def answer(server: Server, reader: asyncio.StreamReader, writer: Writer) -> None:
        request = await server.read_request(reader)
        if b" /idle " in request:
            writer.write(response())
        else:
            writer.write(CHUNKED_HEAD + chunk(b"data: 1\n\n"))
        await server.until_eof(reader)

    server = await serve(answer)
    busy = await post(pool, server.url, "/busy")
    assert await busy.read_chunk() == b"data: 1\n\n"
    idle = await post(pool, server.url, "/idle")
    await read_all(idle)
    idle.release()
    assert idle_connections(pool) == 1
    waiting = asyncio.create_task(busy.read_chunk())
    await asyncio.sleep(0.01)
    await pool.close()
    with pytest.raises(UpstreamConnectionError, match="pool was closed"):
        await waiting
    await eventually(lambda: server.eofs == 2)
    with pytest.raises(UpstreamConnectionError, match="pool is closed"):
        await post(pool, server.url)
    busy.release()


# -- Bytes after a response -----------------------------------------------------------
#
# Whatever a server sends after a response ends (a whole fake response, garbage) must never
# be read as the answer to the next request on that connection: the pool closes it instead.

STALE = {
    "a fake response": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale",
    "garbage": b"garbage\r\n",
}


class Numbered:
    """A keep-alive handler answering each request with `<connection>/<request>` (1/1
    first); `after_first` goes out in the same write as the first answer. Each
    connection's writer is kept, for a test to write stale bytes on it later."""

    def __init__(self, after_first: bytes = b"") -> None:
        self.after_first = after_first
        self.writers: list[Writer] = []

    async def __call__(self, server: Server, reader: asyncio.StreamReader, writer: Writer) -> None:
        self.writers.append(writer)
        connection = server.connections
        count = 0
        while await server.read_request(reader):
            count += 1
            body = b"%d/%d" % (connection, count)
            extra = self.after_first if (connection, count) == (1, 1) else b""
            writer.write(response(body) + extra)
        server.eofs += 1
        server.eof.set()


def client_socket(pool: UpstreamPool) -> socket.socket:
    """The socket of the pool's only idle connection."""
    ((connection,),) = (idle for idle in pool._idle.values() if idle)
    transport = connection._transport
    assert transport is not None
    return cast(socket.socket, transport.get_extra_info("socket"))


async def first_then_second(server: Server, pool: UpstreamPool) -> None:
    """Request 2 is answered on a new connection, by the server, not by stale bytes."""
    resp = await post(pool, server.url)
    assert await read_all(resp) == b"2/1"
    resp.release()
    assert server.connections == 2
    assert [r.split(b" ")[1] for r in server.requests] == [b"/v1/completions"] * 2


@pytest.mark.parametrize("extra", STALE.values(), ids=STALE.keys())
async def test_bytes_read_with_the_end_of_a_response(
    serve: Start, pool: UpstreamPool, extra: bytes
) -> None:
    """They came in the same write, so in the read that completes response 1."""
    handler = Numbered(after_first=extra)
    server = await serve(handler)
    resp = await post(pool, server.url)
    assert await read_all(resp) == b"1/1"
    resp.release()
    assert idle_connections(pool) == 0  # the parser saw them: not kept
    await asyncio.wait_for(server.eof.wait(), 2)  # but closed
    await first_then_second(server, pool)


@pytest.mark.parametrize("extra", STALE.values(), ids=STALE.keys())
async def test_bytes_arriving_on_an_idle_connection(
    serve: Start, pool: UpstreamPool, extra: bytes
) -> None:
    """They come a little later, while the connection sits in the pool."""
    handler = Numbered()
    server = await serve(handler)
    resp = await post(pool, server.url)
    assert await read_all(resp) == b"1/1"
    resp.release()
    assert idle_connections(pool) == 1
    handler.writers[0].write(extra)
    await asyncio.wait_for(server.eof.wait(), 2)  # the pool closed it on their arrival
    assert idle_connections(pool) == 0
    await first_then_second(server, pool)


@pytest.mark.parametrize("extra", [*STALE.values(), None], ids=[*STALE.keys(), "a close"])
async def test_bytes_not_yet_read_when_the_idle_connection_is_taken(
    serve: Start, pool: UpstreamPool, extra: bytes | None
) -> None:
    """The race: the bytes (or the server's FIN) are in the client's socket, but the loop
    has not run since, so the pool has not read them when request 2 takes the connection.
    Its next read would hand them to request 2 as its response."""
    handler = Numbered()
    server = await serve(handler)
    resp = await post(pool, server.url)
    assert await read_all(resp) == b"1/1"
    resp.release()
    sock = client_socket(pool)
    writer = handler.writers[0]
    if extra is None:
        # The FIN of a server closing an idle connection, sent at once (`close()` would
        # wait for the loop).
        writer.get_extra_info("socket").shutdown(socket.SHUT_WR)
    else:
        writer.write(extra)  # sent at once: nothing else waits in the server's buffer
    # Wait for them in the client's socket without yielding to the loop: a blocking wait,
    # bounded, and short on loopback.
    readable, _, _ = select.select([sock.fileno()], [], [], 5)
    assert readable
    await first_then_second(server, pool)


# -- Connecting ----------------------------------------------------------------------------


async def test_connection_refused(pool: UpstreamPool, closed_port: int) -> None:
    with pytest.raises(UpstreamConnectionError) as raised:
        await post(pool, f"http://127.0.0.1:{closed_port}")
    assert str(raised.value) == f"connection to 127.0.0.1:{closed_port} refused"
    assert isinstance(raised.value, OSError)


async def test_connect_timeout() -> None:
    """A listener that never accepts, its backlog full: Linux drops further SYNs, so a
    connection attempt hangs until the client gives up."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(3):
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(("127.0.0.1", port))
        fillers.append(filler)
    pool = UpstreamPool(connect_timeout=0.2)
    try:
        await asyncio.sleep(0.05)
        with pytest.raises(UpstreamConnectionError) as raised:
            await post(pool, f"http://127.0.0.1:{port}")
        assert str(raised.value) == f"connection to 127.0.0.1:{port} timed out after 0.2 s"
    finally:
        await pool.close()
        for filler in fillers:
            filler.close()
        listener.close()


# -- A real server -------------------------------------------------------------------------


async def test_an_aiohttp_sse_stream(pool: UpstreamPool) -> None:
    peers: set[object] = set()
    events = [b'data: {"i": %d, "text": "%s"}\n\n' % (i, b"x" * i) for i in range(200)]

    async def completions(request: web.Request) -> web.StreamResponse:
        peers.add(request.transport.get_extra_info("peername") if request.transport else None)
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for event in events[: body["n"]]:
            await resp.write(event)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = next(a[1] for a in runner.addresses if isinstance(a, tuple))
    try:
        for n in (200, 3):
            resp = await pool.request(
                f"http://127.0.0.1:{port}",
                "POST",
                "/v1/completions",
                {"Content-Type": "application/json"},
                b'{"n": %d}' % n,
            )
            assert resp.status == 200
            assert resp.headers["transfer-encoding"] == "chunked"
            assert await read_all(resp) == b"".join(events[:n]) + b"data: [DONE]\n\n"
            resp.release()
        assert len(peers) == 1  # kept alive
    finally:
        await pool.close()
        await runner.cleanup()


def test_it_runs_on_uvloop() -> None:
    """The same client on uvloop: streaming, reuse, close mid-stream."""

    async def main() -> None:
        server = Server(keep_alive)
        await server.start()
        pool = UpstreamPool()
        try:
            for path in ("/a", "/b"):
                resp = await post(pool, server.url, path)
                assert await read_all(resp) == b"answer to " + path.encode()
                resp.release()
            assert server.connections == 1
            resp = await post(pool, server.url, "/c")
            resp.close()
            await asyncio.wait_for(server.eof.wait(), 1)
        finally:
            await pool.close()
            await server.stop()

    uvloop.run(main())
