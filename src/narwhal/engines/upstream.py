"""A lean HTTP/1.1 client for engine requests: keep-alive pool, one write, streamed body.

aiohttp's ClientSession cost about a quarter of the router's CPU: a ClientRequest and a
ClientResponse per request and ~2 µs per HTTP chunk in its StreamReader. Here a request
is one `transport.write`, and each socket read is one `ResponseParser.feed`
(`narwhal.protocol.http1`) plus, when a reader waits, one future set. Only
`loop.create_connection` and an `asyncio.Protocol` are used, so it runs on uvloop.

    UpstreamPool.request()  ──>  _Connection (asyncio.Protocol)  ──>  ResponseParser
         returns an UpstreamResponse: read_chunk() / read() / release() / close()

A connection's life, per (scheme, host, port):

    connect ──> busy: one request, one response
    busy ──> idle (LIFO)   on release(), if the body is complete and keep-alive holds
    busy ──> closed        on close(), on release() otherwise, on any error
    idle ──> busy          taken by the next request
    idle ──> closed        after `idle_timeout`, or at once when the server closes it or
                           sends anything

Every failure is an `UpstreamConnectionError` (an OSError) whose message names the
engine's address and what happened: refused, timed out, closed before the response head,
closed mid-body, malformed response (with the parser's reason).

Stale keep-alive connections: servers close idle connections (uvicorn after 5 s), and a
request can cross that close on the wire. A request sent on a *reused* connection that
fails before any response byte arrives is sent again, once, on a new connection. The
server closed without answering, which for an idle connection means it never took the
request (RFC 9112 §9.3.1 lets a client retry then); engine requests have no side effect
but compute either way. Never after a response byte, never from a new connection.

Stale bytes: bytes a server sends after a response ends are never read as the next
response. If they came before the release, the parser saw them (`keep_alive` is False) and
the connection is closed; if they come while it is idle, it is closed on their arrival;
and since they may have reached the socket without the loop having run since, a
connection taken from the pool is first polled (one `poll` system call) and closed if
anything, bytes or a close, is waiting on it.

Timeouts: only connecting has one here; the caller bounds the wait for the head and the
gaps between chunks (`asyncio.timeout`). Cancelling `request()` or a waiting
`read_chunk()` is safe: the first closes the connection, the second leaves the response
ready for `close()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import ssl
from collections.abc import Mapping
from typing import Final, Protocol, cast

from narwhal.engines.request_head import Origin, parse_origin, request_bytes
from narwhal.protocol.http1 import HTTPProtocolError, ResponseParser

# Reading pauses while more than this many received bytes wait for the consumer.
_HIGH_WATER: Final = 1 << 20
# After this many bytes in a row from one connection, it sits out a loop iteration: an
# engine that sends as fast as the socket takes would otherwise have the loop read it
# up to 8 MB at a time (uvloop reads a readable socket until it is empty, 32 times),
# and everything else (health checks, other streams) wait behind it.
_BURST_BYTES: Final = 256 << 10


class BodyConsumer(Protocol):
    """Push mode (`UpstreamResponse.stream_to`): the body as it arrives, from the
    connection's own callback, without a task switch per read."""

    def body_received(self, data: bytes) -> None:
        """Body bytes (never empty). Must not raise: a consumer keeps its own errors."""

    def body_ended(self, error: str | None) -> None:
        """The body is complete (None), or the connection failed (why)."""


class UpstreamConnectionError(OSError):
    """Connecting to, sending to or receiving from an engine failed."""


class _StaleConnection(Exception):
    """A reused connection closed before any response byte: send the request again."""


class UpstreamPool:
    """Keep-alive HTTP/1.1 connections to engines; `request()` sends on one of them."""

    def __init__(self, *, connect_timeout: float = 5.0, idle_timeout: float = 30.0) -> None:
        self._connect_timeout = connect_timeout
        self._idle_timeout = idle_timeout
        self._origins: dict[str, Origin] = {}
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._connections: set[_Connection] = set()
        self._tls: ssl.SSLContext | None = None  # one context for all: costly to build
        self._closed = False

    async def request(
        self, url_base: str, method: str, path: str, headers: Mapping[str, str], body: bytes
    ) -> UpstreamResponse:
        """Send the request; the response once its head has arrived.

        `url_base` is `http://host:port` or `https://host:port`, maybe with a path
        prefix; `headers` must not set Host, Content-Length or Transfer-Encoding, which
        the client writes itself (ValueError, like a CR or LF in a value).
        """
        if self._closed:
            raise UpstreamConnectionError("the upstream connection pool is closed")
        origin = self._origins.get(url_base)
        if origin is None:
            origin = self._origins[url_base] = parse_origin(url_base)
        message = request_bytes(origin, method, path, headers, body)
        connection = self._take_idle(origin)
        if connection is not None:
            try:
                return await self._exchange(connection, message)
            except _StaleConnection:
                pass  # the server closed it while idle: once more, on a new connection
        return await self._exchange(await self._connect(origin), message)

    async def close(self) -> None:
        """Close every connection, idle or busy; later requests raise."""
        self._closed = True
        connections = list(self._connections)
        for connection in connections:
            connection.abort("the upstream connection pool was closed")
        self._idle.clear()
        await asyncio.gather(*(c.lost for c in connections))

    async def _exchange(self, connection: _Connection, message: bytes) -> UpstreamResponse:
        parser = ResponseParser()
        connection.start(parser, message)
        try:
            while not parser.head_done:
                error = connection.error
                if error is not None:
                    if connection.reused and not connection.received and not connection.ours:
                        raise _StaleConnection(error)
                    raise UpstreamConnectionError(error)
                await connection.wait()
        except BaseException:
            connection.abort("the request was abandoned")  # cancelled, or failed above
            raise
        return UpstreamResponse(connection, parser)

    async def _connect(self, origin: Origin) -> _Connection:
        loop = asyncio.get_running_loop()
        tls = None
        if origin.tls:
            if self._tls is None:
                self._tls = ssl.create_default_context()
            tls = self._tls
        label = origin.label
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, connection = await loop.create_connection(
                    lambda: _Connection(self, origin),
                    origin.host,
                    origin.port,
                    ssl=tls,
                    server_hostname=origin.host if tls else None,
                )
        # (TimeoutError and the SSL errors are OSErrors too: the order matters.)
        except TimeoutError as e:
            raise UpstreamConnectionError(
                f"connection to {label} timed out after {self._connect_timeout:g} s"
            ) from e
        except ConnectionRefusedError as e:
            raise UpstreamConnectionError(f"connection to {label} refused") from e
        except ssl.SSLError as e:
            raise UpstreamConnectionError(f"TLS handshake with {label} failed: {e}") from e
        except socket.gaierror as e:
            raise UpstreamConnectionError(f"cannot resolve {origin.host}: {e.strerror}") from e
        except OSError as e:
            raise UpstreamConnectionError(f"connection to {label} failed: {e.strerror or e}") from e
        if self._closed:
            connection.abort("the upstream connection pool was closed")
            raise UpstreamConnectionError("the upstream connection pool is closed")
        self._connections.add(connection)
        return connection

    def _take_idle(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin.key)
        while idle:
            connection = idle.pop()  # the most recent: the least likely to be stale
            connection.leave_idle()
            if connection.closed or connection.error is not None:  # (aborted: closing)
                continue
            if connection.has_unread_input():
                # Bytes or a close the loop has not delivered yet: the server's, from
                # before this request was sent, so not its answer (see the module doc).
                connection.abort("bytes or a close arrived on the idle connection")
                continue
            return connection
        return None

    def _put_back(self, connection: _Connection) -> None:
        if self._closed:
            connection.abort("the upstream connection pool was closed")
            return
        self._idle.setdefault(connection.origin.key, []).append(connection)
        loop = asyncio.get_running_loop()
        connection.enter_idle(loop.call_later(self._idle_timeout, self._expire, connection))

    def _expire(self, connection: _Connection) -> None:
        self._forget_idle(connection)
        connection.shut()

    def _forget(self, connection: _Connection) -> None:
        """The connection is closed: it leaves the pool."""
        self._connections.discard(connection)
        if connection.idle:
            self._forget_idle(connection)

    def _forget_idle(self, connection: _Connection) -> None:
        idle = self._idle.get(connection.origin.key)
        if idle is not None and connection in idle:
            idle.remove(connection)
        connection.leave_idle()


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection; at most one request on it at a time."""

    def __init__(self, pool: UpstreamPool, origin: Origin) -> None:
        self.origin = origin
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.parser: ResponseParser | None = None  # None while idle
        self.error: str | None = None  # why the current exchange failed
        self.ours = False  # this side closed it (no retry then)
        self.received = False  # a byte of the current response arrived
        self.reused = False  # the current request is not the connection's first
        self.closed = False
        self.idle = False
        self._pool = pool
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._unread = 0  # bytes received since the consumer last took the body
        self._paused = False
        self._burst = 0  # bytes received since reading last yielded to the loop
        self._yielding = False  # reading paused until the loop has gone round once
        self.consumer: BodyConsumer | None = None  # push mode, see UpstreamResponse

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # Like aiohttp: a request must not wait for Nagle's algorithm.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        parser = self.parser
        if parser is None:
            # A server has nothing to say between responses: it is confused; drop it.
            self.abort("unsolicited bytes on an idle connection")
            return
        self.received = True
        self._burst += len(data)
        if self._burst > _BURST_BYTES:
            self._yield()
        try:
            parser.feed(data)
        except HTTPProtocolError as e:
            self.abort(f"{self.origin.label} sent a malformed response: {e}")
            return
        consumer = self.consumer
        if consumer is not None:
            body = parser.take_body()
            if body:
                consumer.body_received(body)
            if parser.body_done and self.consumer is consumer:
                self.consumer = None
                consumer.body_ended(None)
            return
        self._unread += len(data)
        if self._unread > _HIGH_WATER and not self._paused:
            self._paused = True
            if not self._yielding:
                cast(asyncio.Transport, self._transport).pause_reading()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        # EOF from the server lands here too: `eof_received` returning None makes the
        # transport close itself, at once.
        self.closed = True
        self._pool._forget(self)
        parser = self.parser
        if parser is not None and self.error is None:
            label = self.origin.label
            detail = f" ({exc})" if exc else ""
            if not parser.head_done:
                self.error = f"{label} closed the connection before the response head{detail}"
            elif not parser.body_done:
                try:
                    parser.feed_eof()  # completes a body that runs until the close
                except HTTPProtocolError:
                    self.error = f"{label} closed the connection mid-body{detail}"
        self._wake()
        consumer = self.consumer
        if consumer is not None:
            self.consumer = None
            done = parser is not None and parser.body_done and self.error is None
            consumer.body_ended(None if done else self.error or "the connection closed")
        if not self.lost.done():
            self.lost.set_result(None)

    # -- For the pool and the response ---------------------------------------------------

    def start(self, parser: ResponseParser, message: bytes) -> None:
        """Begin an exchange: the response goes to `parser`."""
        self.parser = parser
        self.received = False
        if self.closed:
            self.error = f"{self.origin.label} closed the connection before the response head"
            return
        cast(asyncio.Transport, self._transport).write(message)

    async def wait(self) -> None:
        """Until bytes arrive or the connection closes (maybe spuriously: re-check)."""
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def pause(self) -> None:
        """Stop reading until `body_taken` (the consumer's own backpressure)."""
        if not self._paused:
            self._paused = True
            if not self.closed and not self._yielding:
                cast(asyncio.Transport, self._transport).pause_reading()

    def _yield(self) -> None:
        """Stop reading for one turn of the loop (see `_BURST_BYTES`)."""
        self._burst = 0
        if not self._paused and not self._yielding and not self.closed:
            self._yielding = True
            cast(asyncio.Transport, self._transport).pause_reading()
            asyncio.get_running_loop().call_soon(self._yielded)

    def _yielded(self) -> None:
        self._yielding = False
        if not self._paused and not self.closed:
            cast(asyncio.Transport, self._transport).resume_reading()

    def body_taken(self) -> None:
        self._unread = 0
        if self._paused:
            self._paused = False
            if not self.closed and not self._yielding:
                cast(asyncio.Transport, self._transport).resume_reading()

    def release(self) -> None:
        """The response is done with: back to the pool if reusable, else closed."""
        self.consumer = None  # a push consumer never outlives its response
        parser = self.parser
        if parser is None or not parser.body_done or self.error is not None or self.closed:
            self.abort("the response was released before its body was complete")
        elif parser.keep_alive:
            self.parser = None
            self.body_taken()
            self._pool._put_back(self)
        else:
            self.shut()  # complete, but `Connection: close` or a suspect framing

    def abort(self, reason: str) -> None:
        """Close now, without flushing: the engine sees the disconnect at once."""
        if self.error is None:
            self.error = reason
        self.ours = True
        if self._transport is not None and not self.closed:
            self._transport.abort()
        self._wake()

    def shut(self) -> None:
        """Close politely (a FIN, not a reset): nothing more is expected on it."""
        self.ours = True
        if self._transport is not None and not self.closed:
            self._transport.close()

    def has_unread_input(self) -> bool:
        """Whether the socket holds bytes, an EOF or an error that the loop has not
        delivered to `data_received` or `connection_lost` yet."""
        sock = self._transport.get_extra_info("socket") if self._transport else None
        if sock is None:
            return False
        return _readable(sock.fileno())

    def enter_idle(self, timer: asyncio.TimerHandle) -> None:
        self.idle = True
        self.reused = True
        self._idle_timer = timer

    def leave_idle(self) -> None:
        self.idle = False
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class UpstreamResponse:
    """An engine's response: status and headers now, the body as it arrives.

    One task reads it at a time. The caller must end it with `release()` (done
    reading) or `close()` (abandon it, which the engine sees as a disconnect), for
    example in a `finally`; both are idempotent.
    """

    __slots__ = ("_connection", "_label", "_parser", "_rest", "headers", "reason", "status")

    def __init__(self, connection: _Connection, parser: ResponseParser) -> None:
        self.status = parser.status
        self.reason = parser.reason
        self.headers = parser.headers
        """Lower-cased names; a repeated header's values joined with ", "."""
        self._connection: _Connection | None = connection
        self._parser = parser
        self._label = connection.origin.label
        self._rest = b""  # bytes `read` or `at_eof` took from the parser but did not return

    async def read_chunk(self) -> bytes:
        """Every body byte buffered now, in one object, waiting only if there is none;
        b"" at the end of the body."""
        parser = self._parser
        while True:
            body = parser.take_body()
            connection = self._connection
            if body or self._rest:
                if self._rest:
                    body = self._rest + body
                    self._rest = b""
                if connection is not None:
                    connection.body_taken()
                return body
            if parser.body_done:
                return b""
            if connection is None:
                raise UpstreamConnectionError(
                    f"the response from {self._label} was closed before its body was complete"
                )
            if connection.error is not None:
                raise UpstreamConnectionError(connection.error)
            await connection.wait()

    async def read(self, limit: int) -> bytes:
        """Up to `limit` body bytes, reading until the body ends or the limit is met."""
        parts = []
        size = 0
        while size < limit:
            chunk = await self.read_chunk()
            if not chunk:
                break
            parts.append(chunk)
            size += len(chunk)
        data = b"".join(parts)
        if len(data) > limit:
            self._rest = data[limit:]
            data = data[:limit]
        return data

    def at_eof(self) -> bool:
        """The body is complete and all of it was read."""
        if not self._parser.body_done:
            return False
        self._rest += self._parser.take_body()
        return not self._rest

    def stream_to(self, consumer: BodyConsumer | None) -> None:
        """Push mode: from now on every body byte goes to `consumer.body_received` from
        the connection's callback as it arrives, then `consumer.body_ended` once; bytes
        already buffered go first, now. None returns to pulling with `read_chunk`.

        A consumer that cannot keep up calls `pause()`; the next `read_chunk` (or
        `resume()`) reads on."""
        connection = self._connection
        if consumer is None:
            if connection is not None:
                connection.consumer = None
            return
        if connection is None:
            consumer.body_ended("the response was closed")
            return
        connection.consumer = consumer
        pending = self._rest + self._parser.take_body()
        self._rest = b""
        if pending:
            connection.body_taken()
            consumer.body_received(pending)
        if connection.consumer is not consumer:
            return  # it detached itself
        if self._parser.body_done:
            connection.consumer = None
            consumer.body_ended(None)
        elif connection.error is not None or connection.closed:
            connection.consumer = None
            consumer.body_ended(connection.error or "the connection closed")

    def pause(self) -> None:
        """Stop reading from the engine (backpressure) until `resume` or `read_chunk`."""
        if self._connection is not None:
            self._connection.pause()

    def resume(self) -> None:
        if self._connection is not None:
            self._connection.body_taken()

    def release(self) -> None:
        """Done with the response: its connection returns to the pool if the body is
        complete and keep-alive holds, else it is closed."""
        connection = self._connection
        if connection is not None:
            self._connection = None
            connection.release()

    def close(self) -> None:
        """Close the connection now: the engine sees the disconnect (and stops)."""
        connection = self._connection
        if connection is not None:
            self._connection = None
            connection.abort("the response was closed")


def _readable(fd: int) -> bool:
    """A zero-timeout poll of one socket: readable, at EOF, or in error."""
    if not hasattr(select, "poll"):  # Windows
        readable, _, failed = select.select([fd], [], [fd], 0)
        return bool(readable or failed)
    poller = select.poll()  # (not `select.select`: it refuses descriptors past 1023)
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))
