"""A real vLLM (the CPU build, the tiny test model) through Narwhal, compared with the same
requests sent to vLLM directly: text at `temperature: 0`, token IDs and when a client sees
them, usage against the IDs, finish and stop reasons, tool calls through vLLM's `hermes`
parser, logprobs, and the official `openai` client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.e2e.conftest import Reply, send
from tests.processes import NarwhalProcess
from tests.real.conftest import MODEL, VLLM_MARKS
from tests.real.engines import EngineProcess

pytestmark = VLLM_MARKS

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                "required": ["city", "unit"],
            },
        },
    }
]
# A model with random weights never writes a tool call of its own accord: vLLM's guided
# decoding writes this one, in the hermes format, and the hermes parser reads it back.
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}</tool_call>'


def chat(content: str = "Hello there", **fields: Any) -> dict[str, Any]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], **fields}
    return {"temperature": 0, "max_tokens": 16, **body}


def completion(prompt: str = "Once upon a time", **fields: Any) -> dict[str, Any]:
    return {"temperature": 0, "max_tokens": 16, "model": MODEL, "prompt": prompt, **fields}


def text_of(reply: Reply) -> str:
    """The whole answer's text (content of a chat, text of a completion), either form."""
    assert reply.status == 200, reply.raw
    if reply.headers.get("Content-Type", "").startswith("text/event-stream"):
        events = [e for e in reply.events() if e != "[DONE]"]
        parts = []
        for event in events:
            for choice in event["choices"]:
                delta = choice.get("delta", {})
                parts.append(choice.get("text") or delta.get("content") or "")
        return "".join(parts)
    choice = reply.json()["choices"][0]
    return choice["text"] if "text" in choice else choice["message"]["content"] or ""


def finish(reply: Reply) -> tuple[str | None, Any]:
    """(finish_reason, stop_reason) of the answer's only choice."""
    if reply.headers.get("Content-Type", "").startswith("text/event-stream"):
        events = [e for e in reply.events() if e != "[DONE]"]
        ends = [c for e in events for c in e["choices"] if c.get("finish_reason")]
        assert len(ends) == 1, events
        return ends[0]["finish_reason"], ends[0].get("stop_reason")
    choice = reply.json()["choices"][0]
    return choice["finish_reason"], choice.get("stop_reason")


async def both(vllm: EngineProcess, router: NarwhalProcess, body: dict[str, Any]) -> list[Reply]:
    """The same request to vLLM directly and through Narwhal, one after the other."""
    direct = await send(vllm.url, body, timeout=60)
    routed = await send(router.url, body, timeout=60)
    assert direct.status == 200, direct.raw
    assert routed.status == 200, routed.raw
    return [direct, routed]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("make", [chat, completion], ids=["chat", "completion"])
async def test_text_finish_and_usage_match_vllm_direct(
    vllm: EngineProcess, router: NarwhalProcess, make: Any, stream: bool
) -> None:
    fields: dict[str, Any] = {"max_tokens": 24}
    if stream:
        fields["stream"] = True
        fields["stream_options"] = {"include_usage": True}
    direct, routed = await both(vllm, router, make(**fields))
    assert text_of(routed) == text_of(direct) != ""
    assert finish(routed) == finish(direct)
    if stream:
        usage = [e["usage"] for e in routed.events() if e != "[DONE]" and e.get("usage")]
        expected = [e["usage"] for e in direct.events() if e != "[DONE]" and e.get("usage")]
        assert routed.events()[-1] == "[DONE]"
    else:
        usage, expected = [routed.json()["usage"]], [direct.json()["usage"]]
    assert len(usage) == 1 and len(expected) == 1
    assert _counts(usage[0]) == _counts(expected[0])


def _counts(usage: dict[str, Any]) -> tuple[int, int, int]:
    return usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]


async def test_token_ids_only_when_asked_and_usage_counts_them(
    vllm: EngineProcess, router: NarwhalProcess
) -> None:
    """Narwhal always asks vLLM for IDs (to count tokens); a client sees them only when it
    asked, as from vLLM itself, and usage counts exactly those IDs."""
    plain = await send(router.url, completion())
    choice = plain.json()["choices"][0]
    assert choice.get("token_ids") is None and choice.get("prompt_token_ids") is None
    direct, routed = await both(vllm, router, completion(return_token_ids=True))
    ids, expected = routed.json()["choices"][0], direct.json()["choices"][0]
    assert ids["token_ids"] == expected["token_ids"] and ids["token_ids"]
    assert ids["prompt_token_ids"] == expected["prompt_token_ids"]
    usage = routed.json()["usage"]
    assert usage["completion_tokens"] == len(ids["token_ids"])
    assert usage["prompt_tokens"] == len(ids["prompt_token_ids"])
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


async def test_streamed_token_ids_only_when_asked(router: NarwhalProcess) -> None:
    streaming = {"stream": True, "stream_options": {"include_usage": True}}
    plain = await send(router.url, chat(**streaming))
    chunks = [e for e in plain.events() if e != "[DONE]"]
    assert all(c.get("token_ids") is None for e in chunks for c in e["choices"])
    asked = await send(router.url, chat(return_token_ids=True, **streaming))
    chunks = [e for e in asked.events() if e != "[DONE]"]
    ids = [i for e in chunks for c in e["choices"] for i in c.get("token_ids") or []]
    (usage,) = [e["usage"] for e in chunks if e.get("usage")]
    assert len(ids) == usage["completion_tokens"] > 0


@pytest.mark.parametrize("stream", [False, True])
async def test_finish_reasons_length_stop_string_and_eos(
    vllm: EngineProcess, router: NarwhalProcess, stream: bool
) -> None:
    fields: dict[str, Any] = {"stream": True} if stream else {}
    # length: cut at max_tokens.
    direct, routed = await both(vllm, router, completion("Hello there", max_tokens=3, **fields))
    assert finish(routed) == finish(direct) == ("length", None)
    # A stop string taken from the greedy answer: finish "stop", stop_reason the string.
    long = text_of(await send(vllm.url, completion("Hello there", max_tokens=24)))
    stop = long[len(long) // 2 :][:2]
    assert stop.strip(), long
    direct, routed = await both(
        vllm, router, completion("Hello there", max_tokens=24, stop=[stop], **fields)
    )
    assert finish(routed) == finish(direct) == ("stop", stop)
    assert text_of(routed) == text_of(direct)
    # The model's own end of sequence (the test model ends this prompt within 16 tokens).
    direct, routed = await both(vllm, router, completion(max_tokens=40, **fields))
    assert finish(routed) == finish(direct) == ("stop", None)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_tool_call_through_the_hermes_parser(
    vllm: EngineProcess, router: NarwhalProcess, stream: bool
) -> None:
    body = chat(
        "What is the weather in Paris?",
        max_tokens=80,
        tools=TOOLS,
        tool_choice="auto",
        structured_outputs={"regex": _regex(CALL)},
    )
    if stream:
        body["stream"] = True
    direct, routed = await both(vllm, router, body)
    assert finish(routed) == finish(direct) == ("tool_calls", None)
    calls = _tool_calls(routed)
    assert calls == _tool_calls(direct)
    assert calls == [("get_weather", {"city": "Paris", "unit": "c"})]


FORCED = pytest.mark.parametrize(
    "tool_choice",
    [{"type": "function", "function": {"name": "get_weather"}}, "required"],
    ids=["named", "required"],
)


@FORCED
async def test_a_forced_tool_choice_is_assembled_from_vllms_stream(
    vllm: EngineProcess, router: NarwhalProcess, tool_choice: Any
) -> None:
    """vLLM serves a named or required tool choice by guided decoding and streams it as
    tool-call deltas; Narwhal, which always streams from the engine, answers a whole request
    with those calls assembled (name and arguments as vLLM streamed them)."""
    body = chat("Weather?", max_tokens=60, tools=TOOLS, tool_choice=tool_choice)
    streamed = await send(vllm.url, {**body, "stream": True})
    routed = await send(router.url, body)
    assert routed.status == 200, routed.raw
    assert finish(routed) == finish(streamed)
    calls = _tool_calls(streamed)
    assert calls and calls[0][0] == "get_weather"
    assert [(name, json.loads(args)) for name, args in _raw_tool_calls(routed)] == calls


@FORCED
@pytest.mark.xfail(
    strict=True,
    reason="vllm-stream-vs-whole: vLLM's whole answer to a forced tool choice differs from "
    "its stream (content '' where the stream has null; 'required' cut at max_tokens comes "
    "whole as raw text, streamed as tool calls), and Narwhal assembles the stream",
)
async def test_a_forced_tool_choice_is_answered_as_vllm_answers_it_whole(
    vllm: EngineProcess, router: NarwhalProcess, tool_choice: Any
) -> None:
    body = chat("Weather?", max_tokens=60, tools=TOOLS, tool_choice=tool_choice)
    direct, routed = await both(vllm, router, body)
    assert finish(routed) == finish(direct)
    message = routed.json()["choices"][0]["message"]
    assert message["content"] == direct.json()["choices"][0]["message"]["content"]
    assert _raw_tool_calls(routed) == _raw_tool_calls(direct)


def _raw_tool_calls(reply: Reply) -> list[tuple[str, str]]:
    """(name, arguments as sent) of each tool call of a whole answer."""
    message = reply.json()["choices"][0]["message"]
    return [
        (c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []
    ]


def _regex(literal: str) -> str:
    return "".join("\\" + c if c in "{}[]().*+?|^$\\" else c for c in literal)


def _tool_calls(reply: Reply) -> list[tuple[str, Any]]:
    """(name, parsed arguments) of each tool call, from the message or the deltas."""
    if not reply.headers.get("Content-Type", "").startswith("text/event-stream"):
        message = reply.json()["choices"][0]["message"]
        return [
            (c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in message["tool_calls"]
        ]
    calls: dict[int, list[str]] = {}
    for event in reply.events():
        if event == "[DONE]":
            continue
        for choice in event["choices"]:
            for call in choice.get("delta", {}).get("tool_calls") or []:
                entry = calls.setdefault(call["index"], ["", ""])
                function = call.get("function") or {}
                entry[0] += function.get("name") or ""
                entry[1] += function.get("arguments") or ""
    return [(name, json.loads(arguments)) for name, arguments in calls.values()]


@pytest.mark.parametrize("stream", [False, True])
async def test_logprobs_match_vllm_direct(
    vllm: EngineProcess, router: NarwhalProcess, stream: bool
) -> None:
    fields: dict[str, Any] = {"stream": True} if stream else {}
    direct, routed = await both(vllm, router, chat(logprobs=True, top_logprobs=2, **fields))
    assert _chat_logprobs(routed) == _chat_logprobs(direct)
    assert len(_chat_logprobs(routed)) == 16
    direct, routed = await both(vllm, router, completion(logprobs=2, **fields))
    assert _completion_logprobs(routed) == _completion_logprobs(direct) != []


def _choices(reply: Reply) -> list[dict[str, Any]]:
    if reply.headers.get("Content-Type", "").startswith("text/event-stream"):
        return [c for e in reply.events() if e != "[DONE]" for c in e["choices"]]
    return list(reply.json()["choices"])


def _chat_logprobs(reply: Reply) -> list[tuple[str, float, list[str]]]:
    out = []
    for choice in _choices(reply):
        for item in (choice.get("logprobs") or {}).get("content") or []:
            top = [t["token"] for t in item["top_logprobs"]]
            out.append((item["token"], round(item["logprob"], 4), top))
    return out


def _completion_logprobs(reply: Reply) -> list[tuple[str, float]]:
    out = []
    for choice in _choices(reply):
        logprobs = choice.get("logprobs") or {}
        for token, value in zip(
            logprobs.get("tokens") or [], logprobs.get("token_logprobs") or [], strict=True
        ):
            out.append((token, round(value, 4)))
    return out


@pytest.fixture
def client(router: NarwhalProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture
def direct_client(vllm: EngineProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=vllm.url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def test_the_openai_client_sync_and_streaming(
    client: openai.OpenAI, direct_client: openai.OpenAI
) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]
    messages: Any = [{"role": "user", "content": "Write a poem about the sea."}]
    answers = [
        c.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, temperature=0)
        for c in (direct_client, client)
    ]
    assert answers[1].choices[0].message.content == answers[0].choices[0].message.content
    assert answers[1].usage == answers[0].usage
    streamed = []
    for c in (direct_client, client):
        with c.completions.create(
            model=MODEL, prompt="The quick brown fox", max_tokens=20, temperature=0, stream=True
        ) as stream:
            streamed.append("".join(chunk.choices[0].text for chunk in stream if chunk.choices))
    assert streamed[1] == streamed[0] != ""
