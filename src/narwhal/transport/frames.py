"""Frames between a relay worker and the decision process: a length, then a pickle.

Both ends are Narwhal processes of one installation on one host, over a Unix socket only
their user can open (the socket's directory is the decision process's own, mode 0700),
so a frame is trusted as much as the process that wrote it; it is still bounded
(`MAX_FRAME_BYTES`), and a frame past the bound ends the connection, as any other
framing fault does.

A frame is a tuple whose first item names it (`kind`); what follows depends on it. The
kinds and their items are the transport's (`server.py`, `client.py`).
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from collections.abc import AsyncIterator
from typing import Any, Final

# An offer carries its prompt's blocks for cache-aware placement: 16 bytes a block of 64
# characters, so a 1 MiB prompt's offer is about 256 KiB. Far past any offer's size.
MAX_FRAME_BYTES: Final = 16 * 1024 * 1024
_LENGTH: Final = struct.Struct("!I")
_READ_BYTES: Final = 256 * 1024


class FrameError(ConnectionError):
    """The other end sent what no Narwhal process sends: the connection ends."""


def encode(frame: tuple[Any, ...]) -> bytes:
    payload = pickle.dumps(frame, protocol=pickle.HIGHEST_PROTOCOL)
    if len(payload) > MAX_FRAME_BYTES:
        raise FrameError(f"a {frame[0]} frame of {len(payload)} bytes is over the bound")
    return _LENGTH.pack(len(payload)) + payload


class FrameBuffer:
    """Frames out of a byte stream as it arrives, however it was cut: the decision
    process and a worker send many small frames, and a read brings several at once."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[Any, ...]]:
        """The frames `data` completes (FrameError for what is no frame)."""
        buffer = self._buffer
        buffer += data
        frames: list[tuple[Any, ...]] = []
        at = 0
        size = len(buffer)
        while size - at >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(buffer, at)
            if length > MAX_FRAME_BYTES:
                raise FrameError(
                    f"a frame of {length} bytes is over the bound of {MAX_FRAME_BYTES}"
                )
            end = at + _LENGTH.size + length
            if end > size:
                break
            frames.append(_decoded(bytes(buffer[at + _LENGTH.size : end])))
            at = end
        if at:
            del buffer[:at]
        return frames

    @property
    def pending(self) -> bool:
        """Bytes of an unfinished frame are held."""
        return bool(self._buffer)


async def frames_from(reader: asyncio.StreamReader) -> AsyncIterator[tuple[Any, ...]]:
    """Every frame the stream brings, until its clean end (FrameError when it ends
    inside a frame)."""
    buffer = FrameBuffer()
    while True:
        data = await reader.read(_READ_BYTES)
        if not data:
            if buffer.pending:
                raise FrameError("the stream ended inside a frame")
            return
        for frame in buffer.feed(data):
            yield frame


class FrameWriter:
    """Frames to one peer, written together once per turn of the event loop: a request's
    offer, another's end and a progress batch leave in one write."""

    __slots__ = ("_loop", "_pending", "_scheduled", "_writer")

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._loop = asyncio.get_running_loop()
        self._pending: list[bytes] = []
        self._scheduled = False

    def send(self, frame: tuple[Any, ...]) -> None:
        self._pending.append(encode(frame))
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, []
        writer = self._writer
        if pending and not writer.is_closing():
            writer.write(b"".join(pending))

    @property
    def closing(self) -> bool:
        return self._writer.is_closing()

    def unsent_bytes(self) -> int:
        return self._writer.transport.get_write_buffer_size() + sum(map(len, self._pending))


def _decoded(payload: bytes) -> tuple[Any, ...]:
    try:
        frame = pickle.loads(payload)
    except Exception as e:  # a pickle that does not load is a broken peer, whatever it raised
        raise FrameError(f"a frame that does not decode: {e}") from None
    if not isinstance(frame, tuple) or not frame or not isinstance(frame[0], str):
        raise FrameError("a frame that is not a named tuple")
    return frame
