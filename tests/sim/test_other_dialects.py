"""The sglang and openai dialects against PROTOCOL.md §6.1, §6.3 and §3.3."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from narwhal.protocol.tokenizer import EOS_ID
from narwhal.sim import RunningSim

from .conftest import DONE, chat_body, post_json, post_stream

SGLANG_DELTA_KEYS = {"role", "content", "reasoning_content", "tool_calls"}


@pytest.fixture
async def sglang(sim_factory: Any) -> RunningSim:
    sim: RunningSim = await sim_factory(dialect="sglang")
    return sim


@pytest.fixture
async def openai(sim_factory: Any) -> RunningSim:
    sim: RunningSim = await sim_factory(dialect="openai")
    return sim


async def test_sglang_chat_stream(sglang: RunningSim, http: aiohttp.ClientSession) -> None:
    body = chat_body(
        "#sim:reasoning #sim:len=9",
        stream=True,
        stream_options={"include_usage": True},
        return_output_ids_in_sglext=True,
    )
    result = await post_stream(http, f"{sglang.url}/v1/chat/completions", body)
    assert result.events[-1] == DONE
    *choice_chunks, ext, usage = result.chunks
    for chunk in choice_chunks:
        assert set(chunk) == {"id", "object", "created", "model", "choices", "usage"}
        assert chunk["usage"] is None
        choice = chunk["choices"][0]
        assert set(choice) == {"index", "delta", "logprobs", "finish_reason", "matched_stop"}
        assert set(choice["delta"]) == SGLANG_DELTA_KEYS
        assert "token_ids" not in choice and "stop_reason" not in choice
    assert choice_chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    reasoning = [c["choices"][0]["delta"]["reasoning_content"] for c in choice_chunks]
    assert any(reasoning)
    finish = choice_chunks[-1]["choices"][0]
    assert finish["delta"] == dict.fromkeys(SGLANG_DELTA_KEYS)  # its own all-null chunk
    assert finish["finish_reason"] == "stop" and finish["matched_stop"] == EOS_ID
    assert ext["choices"] == [] and len(ext["sglext"]["output_ids"][0]) == 9
    assert ext["sglext"]["input_ids"] is None
    assert usage["usage"]["completion_tokens"] == 9


async def test_sglang_sglext_by_header_and_framed(
    sglang: RunningSim, http: aiohttp.ClientSession
) -> None:
    headers = {"x-sglext-return-input-ids": "1", "x-sglext-ids-framed": "1"}
    async with http.post(
        f"{sglang.url}/v1/chat/completions",
        json=chat_body("#sim:len=3", stream=True),
        headers=headers,
    ) as response:
        raw = await response.read()
    assert b"event: sglext_ids\ndata: " in raw
    assert b'"input_ids":[' in raw


async def test_sglang_rejects_streamed_chat_ids(
    sglang: RunningSim, http: aiohttp.ClientSession
) -> None:
    status, body = await post_json(
        http,
        f"{sglang.url}/v1/chat/completions",
        chat_body("x", stream=True, return_token_ids=True),
    )
    assert status == 400
    assert body["object"] == "error" and body["code"] == 400 and "error" not in body


async def test_sglang_completions_ids_and_whole_chat(
    sglang: RunningSim, http: aiohttp.ClientSession
) -> None:
    body = {"prompt": "hi #sim:len=4", "stream": True, "return_token_ids": True}
    result = await post_stream(http, f"{sglang.url}/v1/completions", body)
    chunks = result.chunks
    assert "prompt_token_ids" in chunks[0]["choices"][0]
    assert all("prompt_token_ids" not in c["choices"][0] for c in chunks[1:])
    assert len(result.token_ids()) == 4
    plain = await post_stream(
        http, f"{sglang.url}/v1/completions", {"prompt": "hi #sim:len=4", "stream": True}
    )
    assert all("token_ids" not in c["choices"][0] for c in plain.chunks)  # left out, not null

    _status, whole = await post_json(
        http, f"{sglang.url}/v1/chat/completions", chat_body("#sim:len=4", return_token_ids=True)
    )
    choice = whole["choices"][0]
    assert len(choice["response_token_ids"]) == whole["usage"]["completion_tokens"] == 4
    assert choice["matched_stop"] == EOS_ID and "stop_reason" not in choice
    assert set(choice["message"]) == {"role", "content", "reasoning_content", "tool_calls"}


async def test_sglang_completion_ids_are_all_streamed(
    sglang: RunningSim, http: aiohttp.ClientSession
) -> None:
    # A token without text (the reasoning marker) still has its ID on a chunk: SGLang
    # slices each chunk's IDs from the last one it sent, so a stream holds every ID.
    body = {"prompt": "hi #sim:reasoning", "max_tokens": 8, "stream": True}
    streamed = await post_stream(
        http, f"{sglang.url}/v1/completions", {**body, "return_token_ids": True}
    )
    _status, whole = await post_json(
        http, f"{sglang.url}/v1/completions", {**body, "stream": False, "return_token_ids": True}
    )
    assert streamed.token_ids() == whole["choices"][0]["token_ids"]
    assert len(streamed.token_ids()) == whole["usage"]["completion_tokens"] == 8


async def test_sglang_metrics_and_errors(sglang: RunningSim, http: aiohttp.ClientSession) -> None:
    await post_json(http, f"{sglang.url}/v1/completions", {"prompt": "#sim:len=2"})
    async with http.get(f"{sglang.url}/metrics") as response:
        text = await response.text()
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
                 "sglang:time_to_first_token_seconds_bucket",
                 "sglang:e2e_request_latency_seconds_count"):  # fmt: skip
        assert f"{name}{{" in text
    assert "vllm:" not in text
    status, body = await post_json(
        http, f"{sglang.url}/v1/chat/completions", chat_body("x", model="other")
    )
    assert status == 404 and body["object"] == "error" and body["code"] == 404
    result = await post_stream(
        http, f"{sglang.url}/v1/chat/completions", chat_body("#sim:error_midstream", stream=True)
    )
    error = result.events[-2]
    assert error["error"]["object"] == "error" and error["error"]["code"] == 500
    assert result.events[-1] == DONE


async def test_openai_stream_has_no_done_and_usage_on_finish(
    openai: RunningSim, http: aiohttp.ClientSession
) -> None:
    body = chat_body(
        "#sim:reasoning #sim:len=8", stream=True, stream_options={"include_usage": True}
    )
    result = await post_stream(http, f"{openai.url}/v1/chat/completions", body)
    assert DONE not in result.events
    chunks = result.chunks
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    for chunk in chunks:
        assert set(chunk) <= {"id", "object", "created", "model", "choices", "usage"}
        choice = chunk["choices"][0]
        assert "token_ids" not in choice and "logprobs" not in choice
        assert all(v is not None for v in choice["delta"].values())
    assert any("reasoning_content" in c["choices"][0]["delta"] for c in chunks)
    last = chunks[-1]
    assert last["choices"] and last["choices"][0]["finish_reason"] == "stop"
    assert last["usage"]["completion_tokens"] == 8
    assert all("usage" not in c for c in chunks[:-1])


async def test_openai_rejects_vllm_fields_and_ignores_ids(
    openai: RunningSim, http: aiohttp.ClientSession
) -> None:
    for field, value in (("return_token_ids", True), ("stream_interval", 1),
                         ("kv_transfer_params", {"do_remote_decode": True})):  # fmt: skip
        status, body = await post_json(
            http, f"{openai.url}/v1/chat/completions", chat_body("x", **{field: value})
        )
        assert status == 422 and set(body) == {"detail"} and field in body["detail"]
    status, body = await post_json(
        http, f"{openai.url}/v1/chat/completions", chat_body("#sim:len=3")
    )
    assert status == 200
    assert "token_ids" not in body["choices"][0] and "prompt_token_ids" not in body
    assert body["choices"][0]["message"] == {
        "role": "assistant",
        "content": body["choices"][0]["message"]["content"],
    }


async def test_openai_whole_tool_calls_and_aux_routes(
    openai: RunningSim, http: aiohttp.ClientSession
) -> None:
    result = await post_stream(
        http, f"{openai.url}/v1/chat/completions", chat_body("#sim:tool_calls", stream=True)
    )
    calls = [t for c in result.chunks for t in c["choices"][0]["delta"].get("tool_calls", [])]
    assert [c["index"] for c in calls] == [0, 1]
    assert all(c["function"]["name"] and c["function"]["arguments"] for c in calls)
    assert all("_tool_call_" in c["id"] for c in calls)
    assert result.chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    async with http.get(f"{openai.url}/health") as response:
        assert await response.json() == {"status": "ok"}
    for path in ("/metrics", "/tokenize"):
        method = http.get if path == "/metrics" else http.post
        async with method(f"{openai.url}{path}") as response:
            assert response.status == 404
    result = await post_stream(
        http, f"{openai.url}/v1/chat/completions", chat_body("#sim:error_midstream", stream=True)
    )
    assert result.events[-1] == {"error": result.events[-1]["error"]}
    assert isinstance(result.events[-1]["error"], str)
