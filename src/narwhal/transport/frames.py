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
from typing import Any, Final

# An offer carries its prompt's blocks for cache-aware placement: 16 bytes a block of 64
# characters, so a 1 MiB prompt's offer is about 256 KiB. Far past any offer's size.
MAX_FRAME_BYTES: Final = 16 * 1024 * 1024
_LENGTH: Final = struct.Struct("!I")


class FrameError(ConnectionError):
    """The other end sent what no Narwhal process sends: the connection ends."""


def encode(frame: tuple[Any, ...]) -> bytes:
    payload = pickle.dumps(frame, protocol=pickle.HIGHEST_PROTOCOL)
    if len(payload) > MAX_FRAME_BYTES:
        raise FrameError(f"a {frame[0]} frame of {len(payload)} bytes is over the bound")
    return _LENGTH.pack(len(payload)) + payload


async def read_frame(reader: asyncio.StreamReader) -> tuple[Any, ...] | None:
    """The next frame, or None at a clean end of the stream (between two frames).
    FrameError when the stream breaks inside a frame or brings what is no frame."""
    try:
        head = await reader.readexactly(_LENGTH.size)
    except asyncio.IncompleteReadError as e:
        if not e.partial:
            return None
        raise FrameError("the stream ended inside a frame's length") from None
    (size,) = _LENGTH.unpack(head)
    if size > MAX_FRAME_BYTES:
        raise FrameError(f"a frame of {size} bytes is over the bound of {MAX_FRAME_BYTES}")
    try:
        payload = await reader.readexactly(size)
    except asyncio.IncompleteReadError:
        raise FrameError("the stream ended inside a frame") from None
    try:
        frame = pickle.loads(payload)
    except Exception as e:  # a pickle that does not load is a broken peer, whatever it raised
        raise FrameError(f"a frame that does not decode: {e}") from None
    if not isinstance(frame, tuple) or not frame or not isinstance(frame[0], str):
        raise FrameError("a frame that is not a named tuple")
    return frame
