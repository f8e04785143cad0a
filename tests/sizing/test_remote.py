"""EngineTokenizer over real sockets: the sim's own counts, and every way an engine fails."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from narwhal.protocol.dialects import capabilities
from narwhal.protocol.requests import CompletionRequest, parse_request
from narwhal.sim import SimOptions, start_sim
from narwhal.sizing.remote import EngineTokenizer, TokenizeCandidate
from tests.sizing.tokenize_server import TokenizeServer

MODEL = "m"
SYSTEM = {"role": "system", "content": "You are terse.\nAnswer in one line."}
USER = {"role": "user", "content": "The quick brown fox, 123 jumps! Über naïve café?"}


def request(route: str, **body: Any) -> CompletionRequest:
    raw = json.dumps({"model": MODEL, **body}).encode()
    return parse_request(raw, route, model=MODEL)  # type: ignore[arg-type]


def chat(*messages: dict[str, Any], **body: Any) -> CompletionRequest:
    return request("chat", messages=list(messages or (SYSTEM, USER)), **body)


def tokenizer_for(
    session: aiohttp.ClientSession, *engines: tuple[str, str, str], **kwargs: Any
) -> EngineTokenizer:
    candidates = [
        TokenizeCandidate(name, url, capabilities(dialect)) for name, url, dialect in engines
    ]
    return EngineTokenizer(session, lambda: candidates, **kwargs)


@pytest.fixture
async def sims() -> AsyncIterator[Callable[[str], Any]]:
    started: list[Any] = []

    async def start(dialect: str) -> Any:
        sim = await start_sim(SimOptions(model=MODEL, dialect=dialect, time_scale=0.0))  # type: ignore[arg-type]
        started.append(sim)
        return sim

    yield start
    for sim in started:
        await sim.close()


async def usage_prompt_tokens(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> int:
    async with session.post(url, json={"model": MODEL, "max_tokens": 1, **body}) as response:
        assert response.status == 200, await response.text()
        answer = await response.json()
    count: int = answer["usage"]["prompt_tokens"]
    return count


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
async def test_counts_equal_the_sims_own_usage_chat_template_included(
    session: aiohttp.ClientSession, sims: Callable[[str], Any], dialect: str
) -> None:
    sim = await sims(dialect)
    tokenizer = tokenizer_for(session, ("s0", sim.url, dialect))
    messages = [SYSTEM, USER]
    served = await usage_prompt_tokens(
        session, sim.url + "/v1/chat/completions", {"messages": messages}
    )
    counted = await tokenizer.count(chat(*messages))
    assert counted == served
    # The template is in it: more than the two texts alone.
    assert counted > await tokenizer.count(request("completion", prompt=USER["content"])) + 2
    prompt = "Once upon a time,\n\nthere were 3 foxes."
    served = await usage_prompt_tokens(session, sim.url + "/v1/completions", {"prompt": prompt})
    assert await tokenizer.count(request("completion", prompt=prompt)) == served
    # The batch's text is the same prompt: a cache hit, plus the IDs counted here.
    batch = request("completion", prompt=[prompt, [5, 6, 7]])
    assert await tokenizer.count(batch) == served + 3
    assert (tokenizer.answered, tokenizer.cache_hits) == (3, 1) and not tokenizer.failures


async def test_what_each_dialect_is_sent(
    session: aiohttp.ClientSession, tokenize_server: TokenizeServer
) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for dialect in ("vllm", "sglang"):
        tokenizer = tokenizer_for(session, ("e", tokenize_server.url, dialect))
        await tokenizer.count(chat(USER, tools=tools, chat_template_kwargs={"x": 1}))
        await tokenizer.count(request("completion", prompt="hello", max_tokens=5))
    vllm_chat, vllm_completion, sglang_chat, sglang_completion = tokenize_server.bodies
    assert vllm_chat == {
        "model": MODEL,
        "messages": [USER],
        "tools": tools,
        "chat_template_kwargs": {"x": 1},
        "add_generation_prompt": True,
    }
    assert sglang_chat == {
        key: vllm_chat[key] for key in vllm_chat if key != "add_generation_prompt"
    }
    assert vllm_completion == sglang_completion == {"model": MODEL, "prompt": "hello"}


async def test_never_sent_token_ids_multi_text_batches_and_non_text_parts(
    session: aiohttp.ClientSession, tokenize_server: TokenizeServer
) -> None:
    tokenizer = tokenizer_for(session, ("e", tokenize_server.url, "vllm"))
    assert await tokenizer.count(request("completion", prompt=[1, 2, 3])) == 3
    assert await tokenizer.count(request("completion", prompt=[[1, 2], [3, 4, 5]])) == 5
    assert await tokenizer.count(request("completion", prompt=["a", "b"])) is None
    image = {"type": "image_url", "image_url": {"url": "http://example.invalid/x.png"}}
    parts = {"role": "user", "content": [{"type": "text", "text": "what is it?"}, image]}
    assert await tokenizer.count(chat(parts)) is None
    assert tokenize_server.bodies == []
    assert not tokenizer.failures


async def test_repeated_prompts_are_answered_from_the_cache(
    session: aiohttp.ClientSession, tokenize_server: TokenizeServer
) -> None:
    tokenizer = tokenizer_for(session, ("e", tokenize_server.url, "vllm"), cache_size=2)
    first, second, third = (request("completion", prompt=p) for p in ("a", "b", "c"))
    assert await tokenizer.count(first) == 42
    tokenize_server.count = 7  # an answer from the engine would show
    assert await tokenizer.count(chat(USER, temperature=0.1)) == 7
    assert await tokenizer.count(chat(USER, temperature=0.9)) == 7  # same prompt, a hit
    assert await tokenizer.count(first) == 42
    assert len(tokenize_server.bodies) == 2 and tokenizer.cache_hits == 2
    await tokenizer.count(second)
    await tokenizer.count(third)  # the cache holds 2: the chat prompt went
    assert await tokenizer.count(chat(USER)) == 7
    assert len(tokenize_server.bodies) == 5


async def test_a_stalled_engine_falls_back_within_the_timeout(
    session: aiohttp.ClientSession, tokenize_server: TokenizeServer
) -> None:
    tokenize_server.behaviour = "stall"
    tokenizer = tokenizer_for(session, ("e", tokenize_server.url, "vllm"), timeout_s=0.2)
    started = time.monotonic()
    assert await tokenizer.count(chat()) is None
    elapsed = time.monotonic() - started
    assert 0.15 < elapsed < 0.45
    assert tokenizer.failures["timeout"] == 1 and tokenizer.in_flight == 0


async def test_an_engine_without_the_endpoint_is_not_asked_again_for_a_while(
    session: aiohttp.ClientSession,
    tokenize_server: TokenizeServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="narwhal.sizing.remote")
    working = TokenizeServer(count=9)
    await working.start()
    try:
        now = [1000.0]
        tokenizer = tokenizer_for(
            session,
            ("absent", tokenize_server.url, "vllm"),
            ("working", working.url, "sglang"),
            ("generic", working.url, "openai"),  # no tokenize in its dialect: never asked
            recheck_after_s=60.0,
            clock=lambda: now[0],
        )
        tokenize_server.behaviour = "404"
        results = [await tokenizer.count(request("completion", prompt=f"p{i}")) for i in range(6)]
        # Round robin: the first call went to the absent engine, every later one to the other.
        assert results == [None, 9, 9, 9, 9, 9]
        assert len(tokenize_server.bodies) == 1 and len(working.bodies) == 5
        assert tokenizer.failures["absent"] == 1
        now[0] += 59.0
        tokenize_server.behaviour = "405"
        for i in range(4):
            await tokenizer.count(request("completion", prompt=f"q{i}"))
        assert len(tokenize_server.bodies) == 1
        now[0] += 2.0  # past the recheck: asked again, and marked again
        for i in range(4):
            await tokenizer.count(request("completion", prompt=f"r{i}"))
        assert len(tokenize_server.bodies) == 2 and tokenizer.failures["absent"] == 2
        said = [r for r in caplog.records if r.levelno >= logging.INFO]
        assert [r.getMessage().split(" answered")[0] for r in said] == ["engine absent"]
    finally:
        await working.stop()


async def test_with_no_engine_left_to_ask_it_falls_back_without_a_call(
    session: aiohttp.ClientSession, tokenize_server: TokenizeServer
) -> None:
    tokenize_server.behaviour = "404"
    tokenizer = tokenizer_for(session, ("e", tokenize_server.url, "vllm"))
    assert await tokenizer.count(chat()) is None
    assert await tokenizer.count(chat()) is None
    assert len(tokenize_server.bodies) == 1 and tokenizer.no_engine == 1


@pytest.mark.parametrize(
    ("behaviour", "kind"),
    [
        ("500", "status"),
        ("garbage", "bad_answer"),
        ("negative", "bad_answer"),
        ("bool", "bad_answer"),
        ("string", "bad_answer"),
        ("digits", "bad_answer"),
        ("huge", "too_large"),
        ("huge_chunked", "too_large"),
    ],
)
async def test_bad_answers_fall_back_and_are_counted_by_kind(
    session: aiohttp.ClientSession, tokenize_server: TokenizeServer, behaviour: str, kind: str
) -> None:
    tokenize_server.behaviour = behaviour
    # (a time-out long enough for a megabyte on a loaded machine: time-outs are not this test's)
    tokenizer = tokenizer_for(session, ("e", tokenize_server.url, "vllm"), timeout_s=5.0)
    assert await tokenizer.count(chat()) is None
    assert await tokenizer.count(chat()) is None  # failures are not cached, nor marked
    assert dict(tokenizer.failures) == {kind: 2}
    assert tokenizer.stats()[f"failed_{kind}"] == 2 and tokenizer.stats()["cache_entries"] == 0


async def test_an_unreachable_engine_falls_back(
    session: aiohttp.ClientSession, closed_port: int
) -> None:
    tokenizer = tokenizer_for(session, ("e", f"http://127.0.0.1:{closed_port}", "vllm"))
    assert await tokenizer.count(chat()) is None
    assert dict(tokenizer.failures) == {"unreachable": 1}


async def test_a_broken_candidate_list_is_a_counted_fallback_not_an_exception(
    session: aiohttp.ClientSession,
) -> None:
    def broken() -> list[TokenizeCandidate]:
        raise RuntimeError("a bug in the caller")

    tokenizer = EngineTokenizer(session, broken)
    assert await tokenizer.count(chat()) is None
    assert dict(tokenizer.failures) == {"error": 1} and tokenizer.in_flight == 0


async def test_past_the_in_flight_bound_it_falls_back_at_once(
    session: aiohttp.ClientSession, tokenize_server: TokenizeServer
) -> None:
    tokenize_server.behaviour = "hold"
    tokenizer = tokenizer_for(
        session, ("e", tokenize_server.url, "vllm"), max_in_flight=3, timeout_s=5.0
    )
    held = [
        asyncio.ensure_future(tokenizer.count(request("completion", prompt=f"p{i}")))
        for i in range(3)
    ]
    await asyncio.wait_for(tokenize_server.wait_for_requests(3), 5.0)
    assert tokenizer.in_flight == 3
    started = time.monotonic()
    assert await tokenizer.count(request("completion", prompt="one too many")) is None
    assert time.monotonic() - started < 0.05
    assert tokenizer.failures["busy"] == 1 and len(tokenize_server.bodies) == 3
    tokenize_server.release.set()
    assert await asyncio.gather(*held) == [42, 42, 42]
    assert tokenizer.in_flight == 0
    assert await tokenizer.count(request("completion", prompt="room again")) == 42
