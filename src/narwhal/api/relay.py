"""Relaying an engine stream to a streaming client: the client side of a `StreamLease`.

Headers sent means status fixed. The relay is handed a stream whose first events are
already in hand and validated (the dispatcher reads them before anything goes to the
client), so every failure up to that point is still a proper HTTP status, and may still be
retried on another engine. From the first byte on, the status is 200: a failure after it
ends the stream with one OpenAI-shaped error event and no `data: [DONE]`, so no client
mistakes a broken stream for a complete one.

Exposure: the engine was asked for token IDs and usage whatever the client asked; the
stream's `StreamForwarder` (narwhal.protocol.forward) turns the engine's bytes into the
client's, applying the exposure rules, so the relay only moves bytes.

The request's deadline ends the stream the same way (a `terminal_expiry` error event),
and so does a shutdown's drain deadline (`narwhal.ops.drain`), which brings every running
stream's deadline forward to its instant: events are written whole, so the timeout falls
between two of them, and the error event says the router is shutting down. An engine
silent for longer than `fleet.idle_timeout_s` ends it too (`engines/timeouts.py`), with an
`upstream_error` event.

Framing is the `StreamBody`'s (narwhal.api.stream_body, the one place that relies on
aiohttp's internals): chunked for HTTP/1.1, raw bytes ended by closing the connection for
HTTP/1.0.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import AbstractAsyncContextManager
from typing import Any, Final, Protocol

from aiohttp import web

from narwhal.api.request_id import HEADER as REQUEST_ID_HEADER
from narwhal.api.stream_body import StreamBody
from narwhal.errors import NarwhalError, Outcome, Redact, TerminalExpiry, TruncatedStream
from narwhal.ops.drain import Drain

log = logging.getLogger(__name__)
_DONE_EVENT = b"data: [DONE]\n\n"
SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # proxies in front must not buffer tokens
}


class EngineStream(Protocol):
    """The engine's stream as the relay writes it out (`narwhal.engines.stream`): read by
    `read`, or pushed to the relay's consumer from the connection's callback, each read
    turned into the client's bytes; its silence bounded by `idle_gap`."""

    engine_name: str
    paused: bool  # reading held for the client (no idle gap runs meanwhile)

    @property
    def done(self) -> bool: ...

    async def read(self) -> bytes | None: ...

    def feed(self, data: bytes) -> bytes: ...

    def flush(self) -> bytes: ...

    def check_ended(self) -> None: ...

    def push(self, consumer: Any) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def gap_restarts(self) -> None: ...

    def idle_gap(self) -> AbstractAsyncContextManager[Any]: ...


async def relay_stream(
    http: web.Request,
    stream: EngineStream,
    first: bytes,
    request_id: str,
    deadline: float,
    drain: Drain,
    redact: Redact,
) -> tuple[web.StreamResponse, Outcome]:
    """Stream to the client until the end or `deadline` (loop time), or the shutdown's
    `drain` deadline; return the response and the terminal outcome. An error event's
    message passes `redact` (engine addresses); the log's keeps them.

    The first bytes go out with the headers (through aiohttp); from then on the stream
    is pushed (`_Pump`): each engine read is forwarded from the connection's callback,
    one write per read, with no task switch in between. Only the end goes through
    aiohttp again: Narwhal's own `[DONE]` and the end of the body in one write, or one
    error event.
    """
    body = StreamBody(http, {**SSE_HEADERS, REQUEST_ID_HEADER: request_id})
    try:
        await body.start()
        try:
            # A short answer is often whole in hand already: headers, events and the end
            # then leave in one write, with no deadline timer to arm.
            payload = (
                first if stream.done else await _until_end(body, stream, first, deadline, drain)
            )
        except NarwhalError as error:
            log.warning(
                "request %s: the stream from engine %s failed after the response started: %s",
                request_id,
                stream.engine_name,
                error.message,
            )
            await _write_last(
                body, stream.flush() + error.sse_event(redact), drain.last_write_by(deadline)
            )
            return body.response, error.outcome
        except TimeoutError:
            expiry = TerminalExpiry(
                "The router is shutting down: its drain deadline ended the stream."
                if drain.cut_short(deadline)
                else "The request deadline expired while streaming."
            )
            await _write_last(
                body, stream.flush() + expiry.sse_event(redact), drain.last_write_by(deadline)
            )
            return body.response, expiry.outcome
        except ConnectionError:
            raise  # the client is gone (below)
        except Exception:
            # A bug, not an engine condition (the pushed reads have the same net, `_Pump`).
            # The status is fixed: nothing above may answer a 500 over the stream.
            log.exception(
                "request %s: relaying engine %s's stream failed", request_id, stream.engine_name
            )
            bug = NarwhalError("Internal router error while relaying the stream.")
            ending = stream.flush() + bug.sse_event(redact)
            await _write_last(body, ending, drain.last_write_by(deadline))
            return body.response, bug.outcome
        last = payload + stream.flush() + _DONE_EVENT
        if not await _write_last(body, last, drain.last_write_by(deadline)):
            return body.response, "expired"  # the client took nothing more until its deadline
    except ConnectionError:
        # The client went away while its stream was written (before the disconnect
        # cancelled this handler, or where nothing cancels it). Nobody is left to
        # answer: aiohttp finishes the response quietly, the outcome says why.
        return body.response, "client_gone"
    return body.response, "completed"


async def _write_last(body: StreamBody, data: bytes, deadline: float) -> bool:
    """End the response with `data`; False when the client was cut off instead.

    A client that has stopped reading would keep this write waiting, and its slots held,
    for ever: it gets until its deadline, and once that has passed it is cut off at once
    (the connection aborted: no HTTP/1.1 client can take it for a complete stream, and an
    HTTP/1.0 one sees no `data: [DONE]`). A client that takes its bytes as they come, the
    usual case, is written to without a timer.

    A deadline that interrupted aiohttp's drain (the request's, or the shutdown's cut
    with its grace still to run) leaves aiohttp's cancelled drain waiter in place, and
    the next drain raises CancelledError at once: that client, which was not reading, is
    cut off then too, and counted as expired, not gone (`cancelling()` tells that error
    from a cancellation of the request's task).
    """
    if body.can_end_now(len(data)):
        await body.end(data)  # cannot wait: writing is on and stays on
        return True
    try:
        if asyncio.get_running_loop().time() >= deadline:
            raise TimeoutError
        async with asyncio.timeout_at(deadline):
            await body.end(data)
    except TimeoutError:
        body.abort()
        return False
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # this request's own cancellation (a disconnect, the server's cleanup)
        body.abort()  # aiohttp's spent drain waiter, above
        return False
    return True


async def _until_end(
    body: StreamBody, stream: EngineStream, payload: bytes, deadline: float, drain: Drain
) -> bytes:
    """Relay until the engine's `[DONE]` or a clean end of its body; return the bytes
    still to write with the end. Raises what failed the stream, or TimeoutError (its
    deadline, or the drain's)."""
    async with drain.timeout_at(deadline), stream.idle_gap():
        ended = False  # the body ended without [DONE] (generic servers), finished
        while not stream.done and not ended:
            if payload:
                # The client's write may wait (a slow reader); the engine is not silent
                # while nobody reads it, so the idle gap holds until the write is done.
                stream.paused = True
                try:
                    await body.write(payload)  # the headers leave with it
                finally:
                    stream.gap_restarts()
                payload = b""
                ended = await _push(body, stream)
            else:
                read = await stream.read()
                if read is None:
                    ended = True
                else:
                    payload = read
    return payload


async def _push(body: StreamBody, stream: EngineStream) -> bool:
    """Push the stream until its `[DONE]` (False), a clean end without one (True), or
    the client's backpressure (False, with the stream still running). Raises what failed
    the stream (NarwhalError) or ConnectionResetError when the client is gone."""
    if body.is_closing():
        raise ConnectionResetError("the client closed the connection")
    pump = _Pump(stream, body, asyncio.get_running_loop().create_future())
    stream.push(pump)
    try:
        result = await pump.finished
    finally:
        stream.push(None)
    if result is _BACKPRESSURE:
        await body.drain()
        stream.resume()
        return False
    if isinstance(result, BaseException):
        try:
            raise result
        finally:
            # The error's traceback holds this frame: the frame must not hold the error
            # (nor the pump whose future holds it), or the cycle keeps the engine's
            # buffers alive until the next full collection.
            del result, pump
    return bool(result)


_BACKPRESSURE: Final = "backpressure"
# Past this many bytes waiting in the client's socket buffer, reading from the engine
# pauses until the client catches up (aiohttp's own writes drain past 64 KiB).
_CLIENT_HIGH_WATER: Final = 256 * 1024


class _Pump:
    """The push-mode consumer of one engine stream: engine bytes in, client bytes out,
    in the engine connection's callback. Errors become the `finished` result (never
    raised into the callback), `_detached` from the frames that raised them; the relay
    task waits on `finished`."""

    __slots__ = ("_body", "_stream", "finished")

    def __init__(
        self, stream: EngineStream, body: StreamBody, finished: asyncio.Future[object]
    ) -> None:
        self._stream = stream
        self._body = body
        self.finished = finished

    def body_received(self, data: bytes) -> None:
        if self.finished.done():
            return
        stream = self._stream
        try:
            out = stream.feed(data)
        except NarwhalError as error:
            self._finish(error)
            return
        except Exception:
            # A bug, not an engine condition. Raised into the connection's callback it
            # would leave the relay waiting until the deadline: end the stream instead.
            log.exception("relaying engine %s's stream failed", stream.engine_name)
            self._finish(NarwhalError("Internal router error while relaying the stream."))
            return
        buffered = 0
        if out:
            try:
                buffered = self._body.write_now(out)
            except ConnectionResetError as gone:
                self._finish(gone)
                return
        if stream.done:
            self._finish(False)
        elif buffered > _CLIENT_HIGH_WATER:
            stream.pause()
            self._finish(_BACKPRESSURE)

    def body_ended(self, error: str | None) -> None:
        if self.finished.done():
            return
        stream = self._stream
        if error is not None:
            self._finish(TruncatedStream(f"engine {stream.engine_name} stream broke: {error}"))
            return
        try:
            stream.check_ended()
        except TruncatedStream as truncated:
            self._finish(truncated)
        else:
            self._finish(True)

    def _finish(self, result: object) -> None:
        self._stream.push(None)
        self.finished.set_result(_detached(result) if isinstance(result, BaseException) else result)


def _detached(error: BaseException) -> BaseException:
    """`error` as the value the pump hands over: without the traceback it was raised with
    and the exceptions it chained. Their frames are the failed read's (`body_received`'s,
    the sink's, the tracker's), holding what it read: the engine's bytes, the decoded
    event (an 8 MB event of empty objects decodes to 200 MB of them). Kept, they would
    outlive the request: the callback's frame holds this pump, whose future holds the
    error, a cycle that only a full collection frees, and what it holds need not prompt
    one (the collector does not track empty dicts). Nobody reads them: an engine fault is
    told by its message, and a bug was logged with its traceback where it was caught."""
    error.__traceback__ = None
    error.__context__ = None
    error.__cause__ = None
    return error
