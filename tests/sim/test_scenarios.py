"""`#sim:` scenarios in the vllm dialect: shapes, ids, and the faults they inject."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from typing import Any

import aiohttp
import pytest

from narwhal.sim import RunningSim

from .conftest import DONE, Streamed, chat_body, parse_sse, post_json, post_stream

IDS_AND_USAGE = {"return_token_ids": True, "stream_options": {"include_usage": True}}
CARRIERS = ("content", "reasoning", "tool_calls", "refusal", "function_call", "audio")


def _deltas(result: Streamed) -> list[dict[str, Any]]:
    return [c["choices"][0]["delta"] for c in result.chunks if c["choices"]]


def _check_ids_cover_usage(result: Streamed) -> None:
    """Every event that says something has its ids; the ids add up to usage."""
    for chunk in result.chunks[1:]:
        if not chunk["choices"]:
            continue
        choice = chunk["choices"][0]
        if any(choice["delta"].get(key) for key in CARRIERS):
            assert isinstance(choice["token_ids"], list) and choice["token_ids"], chunk
    usage = result.chunks[-1]["usage"]
    assert len(result.token_ids()) == usage["completion_tokens"]


async def _stream(
    sim: RunningSim, http: aiohttp.ClientSession, prompt: str, **extra: Any
) -> Streamed:
    body = chat_body(prompt, stream=True, **IDS_AND_USAGE, **extra)
    result = await post_stream(http, f"{sim.url}/v1/chat/completions", body)
    assert result.status == 200, result.raw
    return result


async def test_tool_calls_stream(sim: RunningSim, http: aiohttp.ClientSession) -> None:
    tools = [{"type": "function", "function": {"name": n}} for n in ("lookup", "convert")]
    result = await _stream(sim, http, "go #sim:tool_calls", tools=tools)
    _check_ids_cover_usage(result)
    fragments = [f for d in _deltas(result) for f in d.get("tool_calls", [])]
    calls: dict[int, dict[str, Any]] = {}
    for fragment in fragments:
        index = fragment["index"]
        if index not in calls:
            assert set(fragment) == {"id", "type", "index", "function"}
            assert fragment["type"] == "function"
            assert set(fragment["function"]) == {"name"}  # no arguments key at first
            calls[index] = {"id": fragment["id"], "name": fragment["function"]["name"], "args": ""}
        else:
            assert set(fragment) == {"index", "function"}
            assert set(fragment["function"]) == {"arguments"}
            calls[index]["args"] += fragment["function"]["arguments"]
    assert sorted(calls) == [0, 1]
    assert [calls[i]["name"] for i in (0, 1)] == ["lookup", "convert"]
    assert all(calls[i]["id"].startswith("chatcmpl-tool-") for i in (0, 1))
    for call in calls.values():
        assert set(json.loads(call["args"])) == {"city", "unit"}
    finishing = result.chunks[-2]["choices"][0]
    assert finishing["finish_reason"] == "tool_calls"
    assert finishing["delta"]["tool_calls"][0]["function"]["arguments"]  # the last fragment
    assert all(not d.get("content") for d in _deltas(result))


async def test_tool_calls_whole_response(sim: RunningSim, http: aiohttp.ClientSession) -> None:
    _status, body = await post_json(
        http, f"{sim.url}/v1/chat/completions", chat_body("#sim:tool_calls", return_token_ids=True)
    )
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] is None
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather", "get_time"]
    assert all(set(c) == {"id", "type", "function"} for c in message["tool_calls"])
    assert len(choice["token_ids"]) == body["usage"]["completion_tokens"]


async def test_function_call(sim: RunningSim, http: aiohttp.ClientSession) -> None:
    result = await _stream(sim, http, "#sim:function_call")
    _check_ids_cover_usage(result)
    calls = [d["function_call"] for d in _deltas(result) if "function_call" in d]
    assert calls[0] == {"name": "get_weather"}
    assert json.loads("".join(c["arguments"] for c in calls[1:]))
    assert result.chunks[-2]["choices"][0]["finish_reason"] == "function_call"
    _status, body = await post_json(
        http, f"{sim.url}/v1/chat/completions", chat_body("#sim:function_call")
    )
    assert body["choices"][0]["message"]["function_call"]["name"] == "get_weather"


async def test_reasoning_comes_before_content(sim: RunningSim, http: aiohttp.ClientSession) -> None:
    result = await _stream(sim, http, "#sim:reasoning #sim:len=12")
    _check_ids_cover_usage(result)
    kinds = [k for d in _deltas(result)[1:] for k in ("reasoning", "content") if d.get(k)]
    assert kinds[0] == "reasoning" and "content" in kinds
    assert kinds == sorted(kinds, key=lambda k: k == "content")
    assert any(d == {} for d in _deltas(result))  # the held </think> token: ids, empty delta
    _status, body = await post_json(
        http, f"{sim.url}/v1/chat/completions", chat_body("#sim:reasoning")
    )
    assert body["choices"][0]["message"]["reasoning"]


async def test_refusal(sim: RunningSim, http: aiohttp.ClientSession) -> None:
    result = await _stream(sim, http, "#sim:refusal")
    _check_ids_cover_usage(result)
    refusal = "".join(d.get("refusal", "") for d in _deltas(result))
    assert "sorry" in refusal
    _status, body = await post_json(
        http, f"{sim.url}/v1/chat/completions", chat_body("#sim:refusal")
    )
    assert body["choices"][0]["message"]["refusal"] == refusal


async def test_logprobs_forced_and_long(sim: RunningSim, http: aiohttp.ClientSession) -> None:
    result = await _stream(sim, http, "#sim:logprobs #sim:long", max_tokens=9)
    assert all(c["choices"][0]["logprobs"]["content"] for c in result.chunks[1:-1])
    assert result.chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert result.chunks[-1]["usage"]["completion_tokens"] == 9


@pytest.mark.parametrize(
    ("scenario", "check"),
    [
        ("no_token_ids", lambda choice: "token_ids" not in choice),
        ("bool_token_id", lambda choice: True in choice["token_ids"]),
        ("negative_token_id", lambda choice: -1 in choice["token_ids"]),
        ("malformed_token_ids", lambda choice: isinstance(choice["token_ids"], str)),
    ],
)
async def test_token_id_faults_break_exactly_one_event(
    sim: RunningSim, http: aiohttp.ClientSession, scenario: str, check: Any
) -> None:
    result = await _stream(sim, http, f"#sim:{scenario} #sim:len=6")
    choices = [c["choices"][0] for c in result.chunks[1:-1]]
    broken = [choice for choice in choices if check(choice)]
    assert len(broken) == 1
    assert broken[0]["delta"].get("content")
    healthy = [c for c in choices if c is not broken[0]]
    assert all(isinstance(c["token_ids"], list) and c["token_ids"] for c in healthy)
    assert all(type(i) is int and i >= 0 for c in healthy for i in c["token_ids"])
    _status, body = await post_json(
        http,
        f"{sim.url}/v1/chat/completions",
        chat_body(f"#sim:{scenario} #sim:len=6", return_token_ids=True),
    )
    token_ids = body["choices"][0]["token_ids"]
    assert not (isinstance(token_ids, list) and all(type(i) is int and i >= 0 for i in token_ids))


async def test_audio_and_annotations(sim: RunningSim, http: aiohttp.ClientSession) -> None:
    result = await _stream(sim, http, "#sim:audio_delta #sim:annotations #sim:len=6")
    audio = [d["audio"] for d in _deltas(result) if "audio" in d]
    assert len(audio) == 1 and audio[0]["data"] and audio[0]["transcript"]
    annotations = [d["annotations"] for d in _deltas(result) if "annotations" in d]
    assert len(annotations) == 1 and annotations[0][0]["type"] == "url_citation"
    _status, body = await post_json(
        http, f"{sim.url}/v1/completions", {"prompt": "#sim:annotations #sim:len=4"}
    )
    assert body["choices"][0]["annotations"]


async def test_error_midstream(sim: RunningSim, http: aiohttp.ClientSession) -> None:
    result = await _stream(sim, http, "#sim:error_midstream=3 #sim:len=20")
    *chunks, error, done = result.events
    assert done == DONE
    assert error == {"error": {"message": error["error"]["message"], "type": "InternalServerError",
                               "param": None, "code": 500}}  # fmt: skip
    assert len(result.token_ids()) == 3
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks)
    status, body = await post_json(
        http, f"{sim.url}/v1/chat/completions", chat_body("#sim:error_midstream")
    )
    assert status == 500 and body["error"]["code"] == 500


async def test_disconnect_midstream(sim: RunningSim, http: aiohttp.ClientSession) -> None:
    body = chat_body("#sim:disconnect_midstream=2 #sim:len=20", stream=True, **IDS_AND_USAGE)
    received = b""
    with pytest.raises(aiohttp.ClientPayloadError):
        async with http.post(f"{sim.url}/v1/chat/completions", json=body) as response:
            assert response.status == 200
            async for chunk in response.content.iter_any():
                received += chunk
    events = parse_sse(received)
    assert DONE not in events
    assert sum(len(e["choices"][0]["token_ids"] or []) for e in events[1:]) <= 2
    with pytest.raises(aiohttp.ClientError):
        await post_json(
            http, f"{sim.url}/v1/chat/completions", chat_body("#sim:disconnect_midstream")
        )


async def test_stall_is_wall_clock_even_at_time_scale_zero(
    sim: RunningSim, http: aiohttp.ClientSession
) -> None:
    body = chat_body("#sim:stall=0.4 #sim:len=8", stream=True)
    arrivals: list[tuple[float, bytes]] = []
    async with http.post(f"{sim.url}/v1/chat/completions", json=body) as response:
        async for chunk in response.content.iter_any():
            arrivals.append((time.monotonic(), chunk))
    gaps = [later[0] - earlier[0] for earlier, later in itertools.pairwise(arrivals)]
    assert max(gaps) >= 0.35
    assert parse_sse(b"".join(c for _, c in arrivals))[-1] == DONE


async def test_slow_prefill_waits_in_queue(sim: RunningSim, http: aiohttp.ClientSession) -> None:
    started = time.monotonic()
    status, _body = await post_json(
        http, f"{sim.url}/v1/chat/completions", chat_body("#sim:slow_prefill=0.3 #sim:len=2")
    )
    assert status == 200 and time.monotonic() - started >= 0.28


async def test_http_500(sim: RunningSim, http: aiohttp.ClientSession) -> None:
    for stream in (False, True):
        status, body = await post_json(
            http, f"{sim.url}/v1/chat/completions", chat_body("#sim:http_500", stream=stream)
        )
        assert status == 500
        assert body["error"]["type"] == "InternalServerError" and body["error"]["code"] == 500


async def test_directive_in_completions_prompt(
    sim: RunningSim, http: aiohttp.ClientSession
) -> None:
    status, body = await post_json(http, f"{sim.url}/v1/completions", {"prompt": "#sim:len=3"})
    assert body["usage"]["completion_tokens"] == 3
    status, body = await post_json(
        http, f"{sim.url}/v1/completions", {"prompt": "x #sim:stall=abc"}
    )
    assert status == 400


async def test_client_going_away_frees_the_engine(
    sim_factory: Any, http: aiohttp.ClientSession
) -> None:
    sim = await sim_factory(time_scale=1.0)
    body = chat_body("go", stream=True, max_tokens=2000, ignore_eos=True)
    async with http.post(f"{sim.url}/v1/chat/completions", json=body) as response:
        await response.content.readany()
    state: dict[str, Any] = {}
    for _ in range(50):
        await asyncio.sleep(0.02)
        async with http.get(f"{sim.url}/sim/state") as reply:
            state = await reply.json()
        if state["running"] == 0:
            break
    assert state["running"] == 0 and state["kv_used_tokens"] == 0
