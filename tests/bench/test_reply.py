"""The reply text a conversation sends back: read from the response's bytes, however split."""

from __future__ import annotations

import json
from typing import Any

import pytest

from narwhal.bench.reply import reply_text


def event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def chunk(delta: dict[str, Any], index: int = 0) -> bytes:
    return event({"object": "chat.completion.chunk", "choices": [{"index": index, "delta": delta}]})


CHAT_STREAM = (
    chunk({"role": "assistant", "content": ""})
    + chunk({"reasoning": "hmm"})  # reasoning is not part of the history
    + chunk({"content": "Hello"})
    + chunk({"content": ", wörld"}, index=1)  # another choice
    + chunk({"content": ", world"})
    + b": keep-alive\n\n"
    + chunk({"content": '\n"quoted"'})
    + event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}})
    + b"data: [DONE]\n\n"
)
CHAT_TEXT = 'Hello, world\n"quoted"'


def test_chat_stream_whole_and_split_at_every_offset() -> None:
    assert reply_text([CHAT_STREAM], chat=True, stream=True) == CHAT_TEXT
    for cut in range(1, len(CHAT_STREAM)):
        parts = [CHAT_STREAM[:cut], CHAT_STREAM[cut:]]
        assert reply_text(parts, chat=True, stream=True) == CHAT_TEXT, cut
    bytewise = [CHAT_STREAM[i : i + 1] for i in range(len(CHAT_STREAM))]
    assert reply_text(bytewise, chat=True, stream=True) == CHAT_TEXT


def test_completions_stream_and_crlf() -> None:
    stream = b"".join(
        event({"choices": [{"index": 0, "text": t}]}) for t in ("one", " two", "")
    ).replace(b"\n", b"\r\n")
    assert reply_text([stream, b"data: [DONE]\r\n\r\n"], chat=False, stream=True) == "one two"


def test_whole_bodies() -> None:
    chat = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi there"}}]}
    assert reply_text([json.dumps(chat).encode()], chat=True, stream=False) == "hi there"
    tool_only = {"choices": [{"index": 0, "message": {"content": None, "tool_calls": []}}]}
    assert reply_text([json.dumps(tool_only).encode()], chat=True, stream=False) == ""
    text = json.dumps({"choices": [{"index": 0, "text": "abc"}]}).encode()
    assert reply_text([text[:5], text[5:]], chat=False, stream=False) == "abc"


@pytest.mark.parametrize(
    ("parts", "stream"),
    [
        ([b"data: {not json\n\n"], True),
        ([b"data: [1, 2]\n\n"], True),
        ([b"<html>"], False),
        ([b"[]"], False),
    ],
)
def test_unreadable_replies_are_none(parts: list[bytes], stream: bool) -> None:
    assert reply_text(parts, chat=True, stream=stream) is None
