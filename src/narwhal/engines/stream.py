"""Reading one engine stream: bytes from the socket into the attempt's event sink.

`EngineStream.read()` hands everything one socket read brought to the sink (a
`StreamForwarder` for streaming clients, a `StreamCollector` for non-streaming ones) and
returns what the client gets for it, so the relay writes the events of one read in one
write (coalescing without delaying a token: nothing waits for more bytes than the engine
already sent).

Every read stamps `last_read_at`, which the idle gap (`narwhal.engines.timeouts`) watches:
`idle_gap()` bounds the silence between reads by the stream's `idle_timeout_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from narwhal.engines.timeouts import IdleGap, TimeoutPhase
from narwhal.engines.upstream import BodyConsumer, UpstreamResponse
from narwhal.errors import TruncatedStream
from narwhal.protocol.forward import StreamCollector, StreamForwarder


class EngineStream:
    def __init__(
        self,
        engine_name: str,
        response: UpstreamResponse,
        sink: StreamForwarder | StreamCollector,
        *,
        idle_timeout_s: float | None = None,
    ) -> None:
        """`idle_timeout_s`: the longest silence `idle_gap()` allows (None: no limit)."""
        self.engine_name = engine_name
        self.sink = sink
        self.tracker = sink.tracker
        self.idle_timeout_s = idle_timeout_s
        self.last_read_at = time.monotonic()  # the last bytes from the engine (or now)
        self.paused = False  # reading held for the client: no idle gap runs
        self.timed_out: TimeoutPhase | None = None  # the phase timeout that ended it
        self._response = response
        self._eof = False

    @property
    def done(self) -> bool:
        """The engine's `data: [DONE]` came."""
        return self.sink.done

    @property
    def events(self) -> int:
        """Events seen so far ([DONE] included)."""
        return self.sink.events

    async def read(self) -> bytes | None:
        """The client's bytes for the engine's next read (maybe b""), or None at the end.

        Raises UpstreamError when an event fails the attempt and TruncatedStream when the
        stream ends before output finished (or the connection drops).
        """
        if self._eof:
            return None
        try:
            chunk = await self._response.read_chunk()
        except OSError as e:  # UpstreamConnectionError: reset, closed mid-body, malformed
            raise TruncatedStream(f"engine {self.engine_name} stream broke: {e}") from e
        if not chunk:
            self._eof = True
            self.check_ended()
            return None
        now = self.last_read_at = time.monotonic()
        return self.sink.feed(chunk, now)

    def check_ended(self) -> None:
        """The engine's body ended: raise TruncatedStream unless output finished (its
        `[DONE]` came, or every choice has its finish_reason: generic servers)."""
        if not self.sink.done and not self.tracker.finished:
            raise TruncatedStream(f"engine {self.engine_name} stream ended before output did")

    def flush(self) -> bytes:
        """The client's bytes the sink still holds, once the stream has ended."""
        return self.sink.flush()

    def feed(self, data: bytes) -> bytes:
        """Push mode (`push`): the client's bytes for body bytes the consumer was given."""
        now = self.last_read_at = time.monotonic()
        return self.sink.feed(data, now)

    def push(self, consumer: BodyConsumer | None) -> None:
        """Hand the body to `consumer` as it arrives (see `UpstreamResponse.stream_to`);
        None: back to `read`."""
        self._response.stream_to(consumer)

    def pause(self) -> None:
        self.paused = True
        self._response.pause()

    def resume(self) -> None:
        self.gap_restarts()
        self._response.resume()

    def gap_restarts(self) -> None:
        """Reading was held (`paused`, for the client): the engine could not send, so
        its silence counts from now."""
        self.paused = False
        self.last_read_at = time.monotonic()

    def idle_gap(self) -> IdleGap | contextlib.nullcontext[None]:
        """`async with`: reading under the idle-gap limit (UpstreamTimeout past it)."""
        limit = self.idle_timeout_s
        return contextlib.nullcontext() if limit is None else IdleGap(self, limit)

    def at_eof(self) -> bool:
        """The engine's body is complete and all of it was read."""
        return self._eof or self._response.at_eof()

    async def settle(self, grace: float) -> None:
        """After `[DONE]`: wait up to `grace` seconds for the end of the body (engines
        write it right after `[DONE]`, often in a packet of its own), so the connection
        can be reused; an engine that keeps the body open is closed on (`close`)."""
        if self.at_eof():
            return
        try:
            async with asyncio.timeout(grace):
                if not await self._response.read_chunk():
                    self._eof = True
        except (TimeoutError, OSError):
            pass

    async def drain(self) -> None:
        """After `[DONE]`: read the end of the body, so the connection can be reused."""
        while not self._eof and not self._response.at_eof():
            if not await self._response.read_chunk():
                break
        self._eof = True

    def close(self) -> None:
        """Release the upstream connection; an unfinished stream closes it, so the engine
        sees the disconnect and stops generating. The sink's buffers go too: a failure
        that is still referenced (a traceback, a log record) must not keep them."""
        if self.at_eof() and self.sink.done:
            self._response.release()
        else:
            self._response.close()
        self.sink.release()
