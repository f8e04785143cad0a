"""Reading one engine stream: bytes from the socket, decoded and validated events out.

`EngineStream.read_batch()` returns the events of one socket read together, so the
relay can write them to the client in one write (coalescing without delaying a token:
nothing waits for more bytes than the engine already sent).
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import aiohttp

from narwhal.errors import UpstreamError
from narwhal.protocol.events import decode_event
from narwhal.protocol.sse import SSEDecoder, SSEEvent
from narwhal.protocol.tracker import OutputTracker

_DONE = b"[DONE]"


class StreamItem(NamedTuple):
    """One engine event: as received, and decoded."""

    sse: SSEEvent
    decoded: dict[str, Any] | None  # None for [DONE]


class TruncatedStream(UpstreamError):
    """The engine's stream ended before every choice finished (retryable before headers)."""


class EngineStream:
    def __init__(
        self,
        engine_name: str,
        response: aiohttp.ClientResponse,
        tracker: OutputTracker,
    ) -> None:
        self.engine_name = engine_name
        self.tracker = tracker
        self.done = False  # `data: [DONE]` seen
        self._response = response
        self._content = response.content
        self._decoder = SSEDecoder()
        self._eof = False

    async def read_batch(self) -> list[StreamItem] | None:
        """The next events (maybe none), or None at the end of the stream.

        Raises UpstreamError when an event fails the attempt and TruncatedStream when the
        stream ends before output finished (or the connection drops).
        """
        if self._eof:
            return None
        try:
            chunk = await self._content.readany()
        except (aiohttp.ClientError, OSError) as e:
            raise TruncatedStream(f"engine {self.engine_name} stream broke: {e}") from e
        if not chunk:
            self._eof = True
            self._decoder.close()
            if not self.done and not self.tracker.finished:
                raise TruncatedStream(f"engine {self.engine_name} stream ended before output did")
            return None
        now = time.monotonic()
        tracker = self.tracker
        items: list[StreamItem] = []
        for event in self._decoder.feed(chunk):
            data = event.data
            if data == _DONE:
                self.done = True
                items.append(StreamItem(event, None))
                continue
            decoded = decode_event(data)
            tracker.observe(decoded, now)
            items.append(StreamItem(event, decoded))
        return items

    async def drain(self) -> None:
        """After `[DONE]`: read the end of the body, so the connection can be reused."""
        while not self._eof and not self._content.at_eof():
            if not await self._content.readany():
                break
        self._eof = True

    def close(self) -> None:
        """Release the upstream connection; an unfinished stream closes it, so the engine
        sees the disconnect and stops generating."""
        if (self._eof or self._content.at_eof()) and self.done:
            self._response.release()
        else:
            self._response.close()
