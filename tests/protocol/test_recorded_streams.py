"""Whole recorded-style streams through the sans-IO pipeline the relay runs:
SSE decode → JSON decode → engine error check → token-ID count → assemble."""

from __future__ import annotations

from typing import Any

import pytest

from narwhal.protocol.assembly import Assembler
from narwhal.protocol.events import decode_event
from narwhal.protocol.exposure import Exposure
from narwhal.protocol.sse import SSEDecoder, is_done
from narwhal.protocol.tokens import count_event_token_ids, sglext_output_token_count
from tests.protocol.streams import (
    ALL,
    LLAMACPP_CHAT,
    SGLANG_CHAT,
    SGLANG_COMPLETION,
    TRANSFORMERS_CHAT,
    VLLM_CHAT,
    VLLM_CHAT_REASONING_015,
    VLLM_CHAT_RESULT,
    VLLM_CHAT_TOOLS,
    VLLM_COMPLETION,
    VLLM_COMPLETION_RESULT,
    Stream,
    with_line_ends,
)

NO_IDS = Exposure(token_ids=False, usage=True, continuous_usage=False)
IDS = Exposure(token_ids=True, usage=True, continuous_usage=False)


def pipeline(
    stream: Stream, chunks: list[bytes], exposure: Exposure = NO_IDS
) -> tuple[dict[str, Any], int, bool]:
    decoder = SSEDecoder()
    assembler = Assembler(stream.route, exposure)
    count = 0
    done = False
    for chunk in chunks:
        for sse in decoder.feed(chunk):
            if is_done(sse):
                done = True
                continue
            event = decode_event(sse.data)
            if stream.token_ids:
                count += count_event_token_ids(event, stream.route)
            assembler.add(event)
    decoder.close()
    assert not decoder.pending
    return assembler.result(prompt_tokens=99, completion_tokens=count), count, done


@pytest.mark.parametrize("stream", ALL, ids=lambda s: s.name)
def test_counts_and_done(stream: Stream) -> None:
    _, count, done = pipeline(stream, [stream.body])
    assert count == stream.output_ids
    assert done is stream.done


@pytest.mark.parametrize("stream", ALL, ids=lambda s: s.name)
def test_same_result_whatever_the_splits_and_line_ends(stream: Stream) -> None:
    whole = pipeline(stream, [stream.body], IDS)
    body = stream.body
    for offset in range(0, len(body) + 1, 7):
        assert pipeline(stream, [body[:offset], body[offset:]], IDS) == whole
    assert pipeline(stream, [body[i : i + 1] for i in range(len(body))], IDS) == whole
    for end in (b"\r\n", b"\r"):
        assert pipeline(stream, [with_line_ends(body, end)], IDS) == whole


def test_vllm_chat() -> None:
    result, _, _ = pipeline(VLLM_CHAT, [VLLM_CHAT.body])
    assert result == VLLM_CHAT_RESULT
    exposed, _, _ = pipeline(VLLM_CHAT, [VLLM_CHAT.body], IDS)
    assert exposed["prompt_token_ids"] == [151644, 872, 198]
    assert exposed["choices"][0]["token_ids"] == [13048, 11, 1052, 220, 9468, 0]


def test_vllm_chat_tools() -> None:
    result, count, _ = pipeline(VLLM_CHAT_TOOLS, [VLLM_CHAT_TOOLS.body])
    choice = result["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {
        "role": "assistant",
        "content": None,  # the stream's opening "" only: vLLM's own answer says null
        "tool_calls": [
            {
                "id": "chatcmpl-tool-9f",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    }
    assert result["usage"]["completion_tokens"] == count == 10


def test_vllm_chat_reasoning_015() -> None:
    result, _, _ = pipeline(VLLM_CHAT_REASONING_015, [VLLM_CHAT_REASONING_015.body])
    choice = result["choices"][0]
    assert choice["message"] == {
        "role": "assistant",
        "content": "Yes.",
        "reasoning": "Think",
        "reasoning_content": "Think",
    }
    assert [e["token"] for e in choice["logprobs"]["content"]] == ["Think", "Yes", "."]
    assert choice["finish_reason"] == "length"
    # No usage chunk in this stream: computed from the caller's sizing and the IDs.
    assert result["usage"] == {"prompt_tokens": 99, "completion_tokens": 3, "total_tokens": 102}


def test_vllm_completion() -> None:
    result, _, _ = pipeline(VLLM_COMPLETION, [VLLM_COMPLETION.body])
    assert result == VLLM_COMPLETION_RESULT
    exposed, _, _ = pipeline(VLLM_COMPLETION, [VLLM_COMPLETION.body], IDS)
    assert exposed["choices"][0]["prompt_token_ids"] == [791, 6864, 315]
    assert exposed["choices"][0]["token_ids"] == [12366, 13]


def test_sglang_chat() -> None:
    result, _, _ = pipeline(SGLANG_CHAT, [SGLANG_CHAT.body])
    choice = result["choices"][0]
    # SGLang writes tool_calls: null on every delta, and so in its own message.
    assert choice["message"] == {
        "role": "assistant",
        "content": "ok",
        "reasoning_content": "hmm",
        "tool_calls": None,
    }
    assert choice["matched_stop"] == 151645
    assert "sglext" not in result
    exposed, _, _ = pipeline(SGLANG_CHAT, [SGLANG_CHAT.body], IDS)
    # sglext {"input_ids": [1, 2], "output_ids": [[5, 6, 7]]}, in vLLM's places
    assert exposed["prompt_token_ids"] == [1, 2] and "sglext" not in exposed
    assert exposed["choices"][0]["token_ids"] == [5, 6, 7]
    sglext_counts = [
        sglext_output_token_count(decode_event(e.data))
        for e in SSEDecoder().feed(SGLANG_CHAT.body)
        if not is_done(e)
    ]
    assert [c for c in sglext_counts if c is not None] == [3]


def test_sglang_completion() -> None:
    result, count, _ = pipeline(SGLANG_COMPLETION, [SGLANG_COMPLETION.body], IDS)
    choice = result["choices"][0]
    assert (choice["text"], choice["finish_reason"], count) == ("4", "length", 2)
    assert choice["token_ids"] == [19, 198]
    assert choice["prompt_token_ids"] == [17, 10, 17, 28]


def test_llamacpp_chat() -> None:
    result, _, _ = pipeline(LLAMACPP_CHAT, [LLAMACPP_CHAT.body])
    assert result["choices"][0]["message"] == {
        "role": "assistant",
        "content": None,
        "reasoning_content": "Plan",
        "tool_calls": [
            {
                "id": "aBcDeFgHiJkLmNoPqRsTuVwXyZ012345",
                "type": "function",
                "function": {"name": "lookup", "arguments": '{"q":"x"}'},
            }
        ],
    }
    assert result["timings"] == {"predicted_n": 9, "prompt_n": 5}
    assert result["system_fingerprint"] == "b6000-abc"
    assert result["usage"] == {"completion_tokens": 9, "prompt_tokens": 5, "total_tokens": 14}


def test_transformers_chat() -> None:
    result, _, done = pipeline(TRANSFORMERS_CHAT, [TRANSFORMERS_CHAT.body])
    assert not done
    assert result["choices"][0]["message"]["content"] == "Calling"
    assert result["choices"][0]["message"]["tool_calls"][0]["id"] == "req_1_tool_call_0"
    assert result["usage"] == {"completion_tokens": 12, "prompt_tokens": 20, "total_tokens": 32}
