"""The text a server answered, read from the response's bytes once it has ended (sans-IO).

A conversation's next turn sends this text back as the assistant message, so the
history is what the engine itself generated and, with a prefix cache, holds.
The whole response is decoded here, after its timing was taken, and only for
conversations: the hot path (the `StreamScanner`) never decodes JSON.

What counts as the reply: choice 0's `content` (chat) or `text` (completions),
concatenated over the stream's events (or the whole body's `message.content` /
`text` without streaming). Reasoning, refusals and tool calls are not part of it:
chat templates leave reasoning out of the history, and the bench's conversations
are plain text. An event or body that is not JSON (or an event past the SSE decoder's
limit) makes the reply unreadable: None.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from narwhal.protocol.sse import EventTooLarge, SSEDecoder, is_done


def _decode(data: bytes) -> Any:
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError:
        return None


def _choice_zero(doc: Any) -> dict[str, Any] | None:
    choices = doc.get("choices") if isinstance(doc, dict) else None
    if not isinstance(choices, list):
        return None
    for choice in choices:
        if isinstance(choice, dict) and choice.get("index", 0) == 0:
            return choice
    return None


def _piece(choice: dict[str, Any] | None, field: str, text_key: str) -> str:
    if choice is None:
        return ""
    holder = choice.get(field) if field else choice
    text = holder.get(text_key) if isinstance(holder, dict) else None
    return text if isinstance(text, str) else ""


def reply_text(body_parts: Sequence[bytes], *, chat: bool, stream: bool) -> str | None:
    """Choice 0's text from a successful response's reads; None when they are not JSON."""
    if not stream:
        doc = _decode(b"".join(body_parts))
        if not isinstance(doc, dict):
            return None
        return _piece(_choice_zero(doc), "message" if chat else "", "content" if chat else "text")
    try:
        events = _event_data(body_parts)
    except EventTooLarge:
        return None
    pieces: list[str] = []
    for data in events:
        doc = _decode(data)
        if not isinstance(doc, dict):
            return None
        choice = _choice_zero(doc)
        pieces.append(_piece(choice, "delta" if chat else "", "content" if chat else "text"))
    return "".join(pieces)


def _event_data(body_parts: Iterable[bytes]) -> list[bytes]:
    decoder = SSEDecoder()
    events = [event for part in body_parts for event in decoder.feed(part)]
    events.extend(decoder.close())
    return [event.data for event in events if not is_done(event)]
