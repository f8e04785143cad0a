"""The non-streaming sink: an answer ends at the engine's `[DONE]` (what follows is not
assembled)."""

from __future__ import annotations

import json

import pytest

from narwhal.protocol.assembly import Assembler
from narwhal.protocol.exposure import Exposure
from narwhal.protocol.forward import StreamCollector
from narwhal.protocol.tracker import OutputTracker

NO_IDS = Exposure(token_ids=False, usage=True, continuous_usage=False)


def event(text: str, finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
    return b"data: " + json.dumps({"id": "c", "choices": [choice]}).encode() + b"\n\n"


def collector() -> tuple[StreamCollector, Assembler]:
    assembler = Assembler("chat", NO_IDS, choices=1)
    tracker = OutputTracker("chat", token_ids=False, choices=1)
    return StreamCollector(tracker, assembler), assembler


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
