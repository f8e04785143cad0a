"""Relaying an engine stream to a streaming client, or assembling it for a non-streaming one.

Headers sent means status fixed. The relay is handed a stream whose first events are
already in hand and validated (the dispatcher reads them before anything goes to the
client), so every failure up to that point is still a proper HTTP status, and may still be
retried on another engine. From the first byte on, the status is 200: a failure after it
ends the stream with one OpenAI-shaped error event and no `data: [DONE]`, so no client
mistakes a broken stream for a complete one.

Exposure: the engine was asked for token IDs and usage whatever the client asked; events
the exposure rules leave unchanged go out as the engine's own bytes, the others are
re-encoded without the fields the client did not ask for (nothing added or renamed).
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from narwhal.api.request_id import HEADER as REQUEST_ID_HEADER
from narwhal.api.service import ClientGone
from narwhal.engines.stream import EngineStream, StreamItem
from narwhal.errors import NarwhalError, TerminalExpiry
from narwhal.protocol.assembly import Assembler
from narwhal.protocol.events import encode_sse_event
from narwhal.protocol.exposure import Exposed, Exposure, apply_exposure, needs_rewrite

_DONE_EVENT = b"data: [DONE]\n\n"
SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # proxies in front must not buffer tokens
}


def render(items: list[StreamItem], exposure: Exposure, rewrite: bool) -> bytes:
    """The bytes the client gets for these events; `[DONE]` is written by the relay."""
    out: list[bytes] = []
    for event, decoded in items:
        if decoded is None:
            continue
        if not rewrite:
            out.append(event.raw)
        else:
            verdict = apply_exposure(decoded, exposure)
            if verdict is Exposed.UNCHANGED:
                out.append(event.raw)
            elif verdict is Exposed.CHANGED:
                out.append(encode_sse_event(decoded, event.event))
    return b"".join(out)


class _SSEResponse(web.StreamResponse):
    """A stream response whose headers leave with the first body bytes, in one write.

    aiohttp writes a StreamResponse's headers at prepare() by default (one more syscall per
    request); the relay always writes the first events right after prepare(), so holding
    the headers back delays nothing.
    """

    _send_headers_immediately = False


async def relay_stream(
    http: web.Request,
    stream: EngineStream,
    first: list[StreamItem],
    exposure: Exposure,
    request_id: str,
    deadline: float,
) -> tuple[web.StreamResponse, str]:
    """Stream to the client until the end or `deadline` (loop time); return the response
    and the terminal outcome.

    Every batch of events is written as soon as it is read; only the batch that holds the
    engine's `[DONE]` goes out together with Narwhal's own `[DONE]` and the end of the
    chunked body, in one write.
    """
    rewrite = needs_rewrite(exposure)
    response = _SSEResponse(headers={**SSE_HEADERS, REQUEST_ID_HEADER: request_id})
    try:
        await response.prepare(http)
        payload = render(first, exposure, rewrite)
        try:
            async with asyncio.timeout_at(deadline):
                while not stream.done:
                    if payload:
                        await response.write(payload)
                    items = await stream.read_batch()
                    if items is None:  # ended without [DONE] (generic servers), finished
                        payload = b""
                        break
                    payload = render(items, exposure, rewrite)
        except NarwhalError as error:
            await response.write_eof(error.sse_event())
            return response, error.outcome
        except TimeoutError:
            expiry = TerminalExpiry("The request deadline expired while streaming.")
            await response.write_eof(expiry.sse_event())
            return response, expiry.outcome
        await response.write_eof(payload + _DONE_EVENT)
    except ConnectionError as e:
        raise ClientGone(str(e)) from e
    return response, "completed"


async def collect(stream: EngineStream, first: list[StreamItem], assembler: Assembler) -> None:
    """Feed the whole engine stream to the assembler (non-streaming clients)."""
    for item in first:
        if item.decoded is not None:
            assembler.add(item.decoded)
    while (items := await stream.read_batch()) is not None:
        for item in items:
            if item.decoded is not None:
                assembler.add(item.decoded)
