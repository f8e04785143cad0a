"""Workload sizing: exact prompt counts, and long prompts sized in pieces with the same result."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from narwhal.protocol.requests import parse_request
from narwhal.protocol.tokenizer import SimTokenizer, split_at_spaces
from narwhal.sizing import PromptSizer

TOKENIZER = SimTokenizer()


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet=st.sampled_from("ab Z1 ,.\n\t é"), max_size=400), size=st.integers(1, 50)
)
def test_pieces_cut_before_spaces_count_the_same(text: str, size: int) -> None:
    pieces = split_at_spaces(text, size)
    assert "".join(pieces) == text
    assert sum(TOKENIZER.count(p) for p in pieces) == TOKENIZER.count(text)


def _request(route: str, **body: Any) -> Any:
    return parse_request(json.dumps({"model": "m", **body}).encode(), route, model="m")  # type: ignore[arg-type]


async def test_long_sizing_equals_the_plain_count() -> None:
    sizer = PromptSizer()
    text = "The quick brown fox, 123 jumps! " * 3000
    chat = _request(
        "chat",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}],
    )
    assert (
        await sizer.size_long(chat)
        == sizer(chat)
        == TOKENIZER.chat_prompt_count(chat.body["messages"])
    )
    completion = _request("completion", prompt=text)
    assert await sizer.size_long(completion) == sizer(completion)
    assert sizer(completion) == len(TOKENIZER.completion_prompt_ids(text))
    batch = _request("completion", prompt=[text, [1, 2, 3]])
    assert (
        sizer(batch)
        == await sizer.size_long(batch)
        == len(TOKENIZER.completion_prompt_ids(text)) + 3
    )
