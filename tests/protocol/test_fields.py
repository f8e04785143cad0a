"""The chat output fields are listed once (`fields.DELTA_OUTPUT`); the token-ID check, the
fast path's typed delta and the assembler all go by that list."""

from __future__ import annotations

import json
from typing import Any

import pytest

from narwhal.protocol.assembly import Assembler
from narwhal.protocol.exposure import Exposure
from narwhal.protocol.fields import DELTA_CALLS, DELTA_OUTPUT, DELTA_TEXT
from narwhal.protocol.plain import PlainDelta, decode_plain
from narwhal.protocol.tokens import carries_output

SAMPLE: dict[str, Any] = {
    **{key: "x" for key in DELTA_TEXT},
    "tool_calls": [{"index": 0, "id": "c", "type": "function", "function": {"name": "f"}}],
    "function_call": {"name": "f", "arguments": "{}"},
}


def test_the_sample_covers_the_table() -> None:
    assert tuple(SAMPLE) == DELTA_OUTPUT == DELTA_TEXT + DELTA_CALLS


def test_the_fast_paths_delta_declares_the_table() -> None:
    assert PlainDelta.__struct_fields__ == (*DELTA_OUTPUT, "role")


@pytest.mark.parametrize("key", DELTA_OUTPUT)
def test_both_paths_see_output_in_every_field(key: str) -> None:
    choice = {"index": 0, "delta": {key: SAMPLE[key]}}
    assert carries_output(choice, "chat")
    assert not carries_output({"index": 0, "delta": {key: None}}, "chat")
    plain = decode_plain(b'{"choices":[%b]}' % json.dumps(choice).encode())
    if key == "function_call":  # the legacy call takes the general path
        assert plain is None
        return
    assert plain is not None and plain.choices
    delta = plain.choices[0].delta
    assert delta is not None and delta.carries_output()
    assert not PlainDelta().carries_output()


@pytest.mark.parametrize("key", DELTA_OUTPUT)
def test_a_null_output_field_stays_in_the_assembled_message(key: str) -> None:
    assembler = Assembler("chat", Exposure(token_ids=False, usage=True, continuous_usage=False))
    assembler.add({"choices": [{"index": 0, "delta": {"content": "", key: None}}]})
    assembler.add({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    message = assembler.result(prompt_tokens=1, completion_tokens=0)["choices"][0]["message"]
    assert key in message
