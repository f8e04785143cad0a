"""End to end: client -> Narwhal -> `narwhal sim` -> client, streaming and not.

The seed's "Streaming and response assembly" and "Token identity and output accounting"
sections, against real processes over loopback.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import (
    Reply,
    chat,
    completion,
    fleet_config,
    metrics_of,
    send,
    settle,
    sim_process,
)
from tests.processes import NarwhalProcess, router_process


@pytest.fixture(scope="module")
def vllm_sim() -> Iterator[NarwhalProcess]:
    with sim_process("--time-scale", "0", "--seed", "7") as sim:
        yield sim


@pytest.fixture(scope="module")
def router(vllm_sim: NarwhalProcess) -> Iterator[NarwhalProcess]:
    config = fleet_config([("v0", vllm_sim, "vllm")], fleet={"max_attempts": 1})
    with router_process(config) as process:
        yield process


def content_of(events: list[Any]) -> str:
    return "".join(
        (e["choices"][0].get("delta", {}).get("content") or "")
        if "delta" in e["choices"][0]
        else (e["choices"][0].get("text") or "")
        for e in events
        if isinstance(e, dict) and e.get("choices")
    )


def data_events(reply: Reply) -> list[dict[str, Any]]:
    return [e for e in reply.events() if isinstance(e, dict)]


def without_identity(event: dict[str, Any]) -> dict[str, Any]:
    """The event less what differs between any two requests: its id and time."""
    return {k: v for k, v in event.items() if k not in ("id", "created")}


@pytest.mark.parametrize("scenario", ["", "#sim:reasoning", "#sim:tool_calls", "#sim:logprobs"])
@pytest.mark.parametrize("make", [chat, completion])
async def test_stream_is_the_engines_stream(
    router: NarwhalProcess, vllm_sim: NarwhalProcess, make: Any, scenario: str
) -> None:
    """What the client would get from the engine directly, event for event: the events
    Narwhal's forced IDs add (empty deltas while a parser holds text back) are gone too."""
    body = make(f"Tell me a story {scenario}", stream=True, max_tokens=12)
    direct = await send(vllm_sim.url, body)
    relayed = await send(router.url, body)
    assert relayed.status == 200
    assert relayed.headers["Content-Type"].startswith("text/event-stream")
    assert relayed.headers["X-Request-Id"]
    assert relayed.events()[-1] == "[DONE]"
    assert [without_identity(e) for e in data_events(relayed)] == [
        without_identity(e) for e in data_events(direct)
    ]
    # Narwhal asked for the usage chunk the sim (as vLLM 0.33) then puts the fingerprint
    # on; this client did not, so it is where the engine would have put it: the last chunk.
    assert data_events(relayed)[-1]["system_fingerprint"] == "vllm-0.33.0-narwhal-sim"
    for event in data_events(relayed):
        # vLLM writes the ID lists this client did not ask for as null, and so does Narwhal.
        assert event.get("prompt_token_ids") is None
        for choice in event["choices"]:
            assert choice.get("token_ids") is None and choice.get("prompt_token_ids") is None
        assert "usage" not in event


@pytest.mark.parametrize("make", [chat, completion])
async def test_ids_and_usage_reach_clients_that_ask(router: NarwhalProcess, make: Any) -> None:
    body = make(
        "Count to ten",
        stream=True,
        max_tokens=10,
        return_token_ids=True,
        stream_options={"include_usage": True},
    )
    reply = await send(router.url, body)
    events = data_events(reply)
    usage_events = [e for e in events if e.get("usage")]
    assert len(usage_events) == 1 and usage_events[0]["choices"] == []
    ids = [i for e in events for c in e["choices"] for i in (c.get("token_ids") or [])]
    assert len(ids) == usage_events[0]["usage"]["completion_tokens"]
    prompt_ids = [
        e.get("prompt_token_ids") or e["choices"][0].get("prompt_token_ids")
        for e in events
        if e["choices"]
    ]
    assert any(prompt_ids)
    assert reply.events()[-1] == "[DONE]"


async def test_usage_without_ids(router: NarwhalProcess) -> None:
    reply = await send(
        router.url, chat(stream=True, max_tokens=5, stream_options={"include_usage": True})
    )
    events = data_events(reply)
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] >= 1
    assert all(c.get("token_ids") is None for e in events for c in e["choices"])


@pytest.mark.parametrize("make", [chat, completion])
async def test_non_streaming_is_assembled_from_the_stream(
    router: NarwhalProcess, vllm_sim: NarwhalProcess, make: Any
) -> None:
    body = make("Describe the sea", max_tokens=16)
    direct = await send(vllm_sim.url, body)
    reply = await send(router.url, body)
    assert reply.status == 200, reply.raw
    assembled, engine = reply.json(), direct.json()
    key = "message" if "messages" in body else None
    got = assembled["choices"][0]
    want = engine["choices"][0]
    if key:
        assert assembled["object"] == "chat.completion"
        assert got["message"]["content"] == want["message"]["content"]
        assert got["message"]["role"] == "assistant"
    else:
        assert assembled["object"] == "text_completion"
        assert got["text"] == want["text"]
    assert got["finish_reason"] == want["finish_reason"]
    assert assembled["usage"]["completion_tokens"] == engine["usage"]["completion_tokens"]
    assert assembled["usage"]["prompt_tokens"] == engine["usage"]["prompt_tokens"]
    assert assembled["model"] == engine["model"]
    # This client did not ask for IDs: null, where vLLM's own answer has them null too.
    assert got["token_ids"] is None and want["token_ids"] is None
    if key:
        assert assembled["prompt_token_ids"] is None and engine["prompt_token_ids"] is None
    else:
        assert got["prompt_token_ids"] is None and want["prompt_token_ids"] is None


async def test_non_streaming_ids_for_clients_that_ask(router: NarwhalProcess) -> None:
    reply = await send(router.url, chat(max_tokens=9, return_token_ids=True))
    body = reply.json()
    assert len(body["choices"][0]["token_ids"]) == body["usage"]["completion_tokens"]
    assert body["prompt_token_ids"]
    reply = await send(router.url, completion(max_tokens=9, return_token_ids=True))
    choice = reply.json()["choices"][0]
    assert choice["prompt_token_ids"] and len(choice["token_ids"]) >= 1


async def test_tool_calls_streamed_and_assembled(router: NarwhalProcess) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    streamed = await send(router.url, chat("#sim:tool_calls weather?", stream=True, tools=tools))
    calls: dict[int, dict[str, str]] = {}
    for event in data_events(streamed):
        for choice in event["choices"]:
            for fragment in choice["delta"].get("tool_calls") or []:
                call = calls.setdefault(fragment["index"], {"id": "", "name": "", "args": ""})
                call["id"] += fragment.get("id") or ""
                function = fragment.get("function") or {}
                call["name"] += function.get("name") or ""
                call["args"] += function.get("arguments") or ""
    assert len(calls) == 2
    reply = await send(router.url, chat("#sim:tool_calls weather?", tools=tools))
    assert reply.status == 200, reply.raw
    choice = reply.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assembled = choice["message"]["tool_calls"]
    assert [c["function"]["arguments"] for c in assembled] == [
        calls[i]["args"] for i in sorted(calls)
    ]
    for call in assembled:
        assert call["id"] and call["function"]["name"] and call["type"] == "function"
    assert choice["message"]["content"] is None  # as the engine's own non-streaming answer


@pytest.mark.parametrize(
    ("scenario", "field"),
    [("reasoning", "reasoning"), ("refusal", "refusal"), ("function_call", "function_call")],
)
async def test_other_delta_fields_are_assembled(
    router: NarwhalProcess, scenario: str, field: str
) -> None:
    streamed = await send(router.url, chat(f"#sim:{scenario} hi", stream=True, max_tokens=20))
    assert streamed.status == 200
    assert any(field in c["delta"] for e in data_events(streamed) for c in e["choices"])
    reply = await send(router.url, chat(f"#sim:{scenario} hi", max_tokens=20))
    assert reply.status == 200, reply.raw
    message = reply.json()["choices"][0]["message"]
    assert message.get(field)


async def test_logprobs_concatenate_in_both_shapes(router: NarwhalProcess) -> None:
    reply = await send(router.url, chat("hi", max_tokens=6, logprobs=True, top_logprobs=2))
    body = reply.json()
    assert len(body["choices"][0]["logprobs"]["content"]) == body["usage"]["completion_tokens"]
    reply = await send(router.url, completion("hi", max_tokens=6, logprobs=2))
    body = reply.json()
    logprobs = body["choices"][0]["logprobs"]
    n = body["usage"]["completion_tokens"]
    assert len(logprobs["tokens"]) == len(logprobs["token_logprobs"]) == n
    assert logprobs["text_offset"] == sorted(logprobs["text_offset"])


@pytest.mark.parametrize(
    "fault", ["no_token_ids", "bool_token_id", "negative_token_id", "malformed_token_ids"]
)
async def test_bad_token_ids_fail_the_attempt(router: NarwhalProcess, fault: str) -> None:
    before = await metrics_of(router.url)
    reply = await send(router.url, chat(f"#sim:{fault} go", max_tokens=12))
    assert reply.status == 502
    assert reply.json()["error"]["code"] == "upstream_error"
    streamed = await send(router.url, chat(f"#sim:{fault} go", max_tokens=12, stream=True))
    if streamed.status == 200:  # the bad event came after the headers
        events = streamed.events()
        assert "[DONE]" not in events
        assert events[-1]["error"]["code"] == "upstream_error"
    else:
        assert streamed.status == 502
    after = await metrics_of(router.url)
    key = 'narwhal_outcomes_total{outcome="upstream_error"}'
    assert after[key] == before[key] + 2


@pytest.mark.parametrize("fault", ["audio_delta", "annotations"])
async def test_unsupported_fields_with_values_are_502_when_assembled(
    router: NarwhalProcess, fault: str
) -> None:
    reply = await send(router.url, chat(f"#sim:{fault} go", max_tokens=8))
    assert reply.status == 502
    streamed = await send(router.url, chat(f"#sim:{fault} go", max_tokens=8, stream=True))
    assert streamed.status == 200 and streamed.events()[-1] == "[DONE]"  # forwarded as sent


@pytest.mark.parametrize("fault", ["error_midstream", "disconnect_midstream"])
async def test_midstream_failures(router: NarwhalProcess, fault: str) -> None:
    streamed = await send(router.url, chat(f"#sim:{fault}=5 go", max_tokens=40, stream=True))
    if streamed.status == 200:  # the failure came after the first events went out
        events = streamed.events()
        assert "[DONE]" not in events
        assert set(events[-1]) == {"error"}
        assert events[-1]["error"]["code"] == "upstream_error"
    else:  # the failure arrived with the first events: still a proper status
        assert streamed.status == 502
    reply = await send(router.url, chat(f"#sim:{fault} go", max_tokens=20))
    assert reply.status == 502


async def test_engine_500_is_502(router: NarwhalProcess) -> None:
    reply = await send(router.url, chat("#sim:http_500 go"))
    assert reply.status == 502
    assert reply.json()["error"]["code"] == "upstream_error"


async def test_router_metrics_after_traffic(router: NarwhalProcess) -> None:
    await send(router.url, chat(stream=True, max_tokens=5))
    values = await settle(router.url, lambda v: v["narwhal_decode_slots_in_use"] == 0)
    assert any(k.startswith('narwhal_ttft_seconds_count{engine="v0"') for k in values)
    assert values['narwhal_output_tokens_total{engine="v0",source="token_ids"}'] > 0
    offered = values["narwhal_offered_total"]
    outcomes = sum(v for k, v in values.items() if k.startswith("narwhal_outcomes_total{"))
    assert offered == outcomes
    for gauge in (
        "narwhal_prefill_slots_in_use",
        "narwhal_decode_slots_in_use",
        "narwhal_admission_queue_depth",
        "narwhal_retained_requests",
    ):
        assert values[gauge] == 0


async def test_a_client_that_stops_reading_still_gets_the_whole_stream(
    router: NarwhalProcess,
) -> None:
    """Backpressure: while the client does not read, the relay stops reading from the
    engine (instead of buffering the whole answer); once it reads again, every event
    arrives, in order, and the stream ends with [DONE]. The stream (~6 MB) is larger than
    what loopback's socket buffers absorb (the send side grows to 4 MB), so the router's
    own buffer passes its high-water mark and the pause really happens."""
    tokens = 24_000
    body = json.dumps(chat("go", max_tokens=tokens, stream=True, ignore_eos=True)).encode()
    host, port = router.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n%b" % (len(body), body)
    )
    await writer.drain()
    await asyncio.sleep(2.0)  # not reading: Narwhal's writes back up, it must pause
    raw = await asyncio.wait_for(reader.read(), timeout=30)
    writer.close()
    head, _, chunked = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    events = Reply(200, {}, _dechunk(chunked)).events()
    assert events[-1] == "[DONE]"
    assert sum(len(e["choices"][0]["delta"].get("content") or "") > 0 for e in events[:-1]) == (
        tokens
    )


def _dechunk(data: bytes) -> bytes:
    out = []
    pos = 0
    while True:
        eol = data.index(b"\r\n", pos)
        size = int(data[pos:eol], 16)
        if size == 0:
            return b"".join(out)
        out.append(data[eol + 2 : eol + 2 + size])
        pos = eol + 2 + size + 2
