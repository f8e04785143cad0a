"""The canonical prompt text the prefix index hashes: order, boundaries, prompt forms."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from narwhal.protocol.requests import parse_request
from narwhal.scheduler.prefix_index import PromptBlocks
from narwhal.scheduler.prefix_text import chat_text, completion_text, prompt_text

MODEL = "m"
SYSTEM = "You are a careful assistant. " * 20
TOOL = {
    "type": "function",
    "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}},
}


def msg(role: str, content: Any, **extra: Any) -> dict[str, Any]:
    return {"role": role, "content": content, **extra}


def test_next_turn_of_a_conversation_shares_every_whole_block_of_the_last() -> None:
    turn1 = [msg("system", SYSTEM), msg("user", "What is the tallest mountain? " * 5)]
    turn2 = [*turn1, msg("assistant", "Everest. " * 9), msg("user", "And the second?")]
    text1, text2 = chat_text(turn1), chat_text(turn2)
    assert text2.startswith(text1)
    blocks1, blocks2 = PromptBlocks.of(text1), PromptBlocks.of(text2)
    assert len(blocks1.hashes) == len(text1) // 64 > 5
    assert blocks2.hashes[: len(blocks1.hashes)] == blocks1.hashes


def test_tools_come_first_and_change_the_prefix() -> None:
    messages = [msg("system", SYSTEM), msg("user", "hi")]
    plain, with_tool = chat_text(messages), chat_text(messages, [TOOL])
    assert PromptBlocks.of(plain).hashes[0] != PromptBlocks.of(with_tool).hashes[0]
    other = {"type": "function", "function": {"name": "time", "parameters": {}}}
    assert chat_text(messages, [other]) != with_tool
    # Compact JSON with sorted keys: the client's key order does not matter.
    reordered = json.loads(json.dumps({"function": TOOL["function"], "type": "function"}))
    assert chat_text(messages, [reordered]) == with_tool
    assert chat_text(messages, []) == plain


def test_a_different_split_or_role_gives_a_different_text() -> None:
    one = chat_text([msg("user", "ab")])
    assert one != chat_text([msg("user", "a"), msg("user", "b")])
    assert one != chat_text([msg("system", "ab")])
    assert chat_text([msg("user", "x")]) != chat_text([msg("use", "rx")])
    # A client's NUL cannot forge a field boundary.
    assert chat_text([msg("user", "a\x00ruser\x00cb")]) != chat_text(
        [msg("user", "a"), msg("user", "b")]
    )


messages_strategy = st.lists(
    st.tuples(st.sampled_from(["user", "system", "u\x00c"]), st.text("ab\x00rc", max_size=6)),
    max_size=4,
)


@given(messages_strategy, messages_strategy)
def test_different_conversations_never_share_a_text(a: Any, b: Any) -> None:
    text_a = chat_text([msg(role, content) for role, content in a])
    text_b = chat_text([msg(role, content) for role, content in b])
    assert (text_a == text_b) == (a == b)


def test_list_of_parts_content() -> None:
    text_part = {"type": "text", "text": "describe this"}
    assert chat_text([msg("user", [text_part])]) == chat_text([msg("user", "describe this")])
    assert chat_text([msg("user", [text_part, text_part])]) != chat_text(
        [msg("user", "describe thisdescribe this")]
    )
    big = "data:image/png;base64," + "A" * 100_000

    def image(url: str) -> dict[str, Any]:
        return msg("user", [text_part, {"type": "image_url", "image_url": {"url": url}}])

    first, second = chat_text([image(big)]), chat_text([image(big[:-1] + "B")])
    assert first != second
    assert first == chat_text([image(big)])
    # An image is a short digest, not its megabytes of base64.
    assert len(first) < 100
    assert chat_text([image(big), msg("user", "q")]).startswith(first)


def test_name_tool_call_id_and_tool_calls_are_part_of_the_text() -> None:
    base = chat_text([msg("user", "hi")])
    assert chat_text([msg("user", "hi", name="ann")]) != base
    assert chat_text([msg("user", "hi", name="ann")]) != chat_text([msg("user", "hi", name="bo")])
    call = {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
    assistant = chat_text([msg("assistant", None, tool_calls=[call])])
    assert assistant != chat_text([msg("assistant", None)])
    assert "weather" in assistant
    assert chat_text([msg("tool", "sunny", tool_call_id="c1")]) != chat_text(
        [msg("tool", "sunny", tool_call_id="c2")]
    )


def ids(*token_ids: int) -> str:
    text = completion_text(list(token_ids))
    assert text is not None
    return text


def test_completion_prompt_forms() -> None:
    assert completion_text("hello") == "hello"
    assert completion_text(["hello"]) == "hello"
    assert completion_text([[1, 2, 3]]) == completion_text([1, 2, 3])
    assert completion_text([7]) == completion_text([[7]])
    # A longer token list begins with the text of a shorter one it begins with, and only
    # then.
    assert ids(1, 2, 3).startswith(ids(1, 2))
    assert not ids(1, 2, 3).startswith(ids(1, 23))
    # Token IDs, text and chat never read alike.
    assert completion_text("\x00I1,2,3,") != ids(1, 2, 3)
    assert completion_text("\x00ruser\x00chi") != chat_text([msg("user", "hi")])
    # Several prompts are several engine requests: not indexed.
    assert completion_text(["a", "b"]) is None
    assert completion_text([[1], [2]]) is None


def test_prompt_text_of_parsed_requests() -> None:
    chat = parse_request(
        json.dumps({"model": MODEL, "messages": [msg("user", "hi")], "tools": [TOOL]}).encode(),
        "chat",
        model=MODEL,
    )
    assert prompt_text(chat) == chat_text([msg("user", "hi")], [TOOL])
    completion = parse_request(
        json.dumps({"model": MODEL, "prompt": "once upon"}).encode(), "completion", model=MODEL
    )
    assert prompt_text(completion) == "once upon"
