"""The non-streaming sink: an answer ends at the engine's `[DONE]` (what follows is not
assembled) and is assembled from at most `max_response_bytes` of event data, since the
whole of it is held until the end."""

from __future__ import annotations

import json

import pytest

from narwhal.protocol.assembly import DEFAULT_MAX_RESPONSE_BYTES, Assembler, ResponseTooLarge
from narwhal.protocol.exposure import Exposure
from narwhal.protocol.forward import StreamCollector
from narwhal.protocol.tracker import OutputTracker

NO_IDS = Exposure(token_ids=False, usage=True, continuous_usage=False)


def event(text: str, finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
    return b"data: " + json.dumps({"id": "c", "choices": [choice]}).encode() + b"\n\n"


def collector(**limits: int) -> tuple[StreamCollector, Assembler]:
    assembler = Assembler("chat", NO_IDS, choices=1)
    tracker = OutputTracker("chat", token_ids=False, choices=1)
    return StreamCollector(tracker, assembler, **limits), assembler


def content(assembler: Assembler) -> str:
    answer = assembler.result(prompt_tokens=1, completion_tokens=1)
    text: str = answer["choices"][0]["message"]["content"]
    return text


@pytest.mark.parametrize("split", [False, True])
def test_events_after_done_are_not_the_answer(split: bool) -> None:
    body = event("Hello") + event("", "stop") + b"data: [DONE]\n\n" + event(" AFTER")
    sink, assembler = collector()
    chunks = [body[i : i + 7] for i in range(0, len(body), 7)] if split else [body]
    for chunk in chunks:
        sink.feed(chunk, 1.0)
    sink.feed(event(" LATER") + b"data: not json\n\n", 2.0)  # not even decoded
    assert sink.done
    assert sink.events == 3
    assert content(assembler) == "Hello"
    assert sink.tracker.tokens == 1  # (no IDs: one output event)


def test_an_answer_is_assembled_from_at_most_max_response_bytes() -> None:
    piece = event("x" * 100)
    size = len(piece) - 8  # the event's data, less `data: ` and the blank line
    sink, _ = collector(max_response_bytes=3 * size)
    sink.feed(piece * 3, 1.0)  # exactly the limit
    with pytest.raises(ResponseTooLarge, match=rf"fleet.max_response_bytes \({3 * size} bytes"):
        sink.feed(piece, 2.0)
    assert sink.tracker.tokens == 3  # the event past it was not even decoded


def test_the_limit_counts_event_data_only() -> None:
    """Comments, keep-alives and `[DONE]` are not part of the answer."""
    sink, _ = collector(max_response_bytes=len(event("a")) - 8)
    sink.feed(b": keep-alive\n\n" * 1000 + event("a") + b"data: [DONE]\n\n", 1.0)
    assert sink.done


def test_the_default_limit() -> None:
    sink, _ = collector()
    big = event("y" * (1 << 20))
    for _ in range(DEFAULT_MAX_RESPONSE_BYTES // len(big)):
        sink.feed(big, 1.0)
    with pytest.raises(ResponseTooLarge):
        sink.feed(big, 1.0)
