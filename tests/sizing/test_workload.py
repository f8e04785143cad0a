"""WorkloadSizer: the order of sources, long prompts in pieces, and calibration."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from narwhal.protocol.requests import CompletionRequest, parse_request
from narwhal.protocol.tokenizer import SimTokenizer
from narwhal.sim import SimOptions, start_sim
from narwhal.sizing import (
    EngineTokenizer,
    PromptSize,
    PromptSizer,
    TokenizeCandidate,
    WorkloadSizer,
)
from narwhal.sizing.calibration import EstimateCalibration
from tests.sizing.tokenize_server import TokenizeServer

MODEL = "m"
TOKENIZER = SimTokenizer()


def parsed(route: str, **body: Any) -> tuple[CompletionRequest, int]:
    raw = json.dumps({"model": MODEL, **body}).encode()
    return parse_request(raw, route, model=MODEL), len(raw)  # type: ignore[arg-type]


def chat(text: str) -> tuple[CompletionRequest, int]:
    return parsed("chat", messages=[{"role": "user", "content": text}])


class SpySizer(PromptSizer):
    """Today's sizer, recording which way it was asked."""

    def __init__(self, count_text: Any = None) -> None:
        super().__init__(count_text)
        self.calls: list[str] = []

    def __call__(self, request: CompletionRequest) -> int:
        self.calls.append("inline")
        return super().__call__(request)

    async def size_long(self, request: CompletionRequest) -> int:
        self.calls.append("long")
        return await super().size_long(request)


def engine(session: aiohttp.ClientSession, url: str, dialect: str = "vllm") -> EngineTokenizer:
    candidates = [TokenizeCandidate("e0", url, dialect)]
    return EngineTokenizer(session, lambda: candidates)


async def test_a_configured_tokenizer_comes_first_and_no_engine_is_asked(
    session: aiohttp.ClientSession, tokenize_server: TokenizeServer
) -> None:
    sizer = WorkloadSizer(
        PromptSizer(lambda text: len(text.split())),
        engine(session, tokenize_server.url),
        use_engine=True,
    )
    size = await sizer.size(*chat("three short words"))
    assert size == PromptSize(3 + 4, "tokenizer")  # the words, and the template allowance
    assert tokenize_server.bodies == []


async def test_token_id_prompts_are_exact_without_any_tokenizer(
    session: aiohttp.ClientSession, tokenize_server: TokenizeServer
) -> None:
    sizer = WorkloadSizer(PromptSizer(), engine(session, tokenize_server.url), use_engine=True)
    assert await sizer.size(*parsed("completion", prompt=[9, 8, 7, 6])) == PromptSize(
        4, "tokenizer"
    )
    assert tokenize_server.bodies == []


async def test_then_the_engine_then_the_estimate(
    session: aiohttp.ClientSession, tokenize_server: TokenizeServer
) -> None:
    text = "A prompt the engine counts its own way."
    request, size = chat(text)
    estimate = TOKENIZER.chat_prompt_count(request.body["messages"])
    sizer = WorkloadSizer(PromptSizer(), engine(session, tokenize_server.url), use_engine=True)
    assert await sizer.size(request, size) == PromptSize(42, "engine", estimate)
    assert await sizer.size(request, size) == PromptSize(42, "engine")  # from the cache
    tokenize_server.behaviour = "500"
    other, other_size = chat("Another prompt, while the engine fails.")
    fallback = await sizer.size(other, other_size)
    assert fallback.source == "estimate"
    assert fallback.estimated == TOKENIZER.chat_prompt_count(other.body["messages"])
    assert sizer.stats()["tokenize_failed_status"] == 1
    assert (sizer.stats()["sized_engine"], sizer.stats()["sized_estimate"]) == (2, 1)


async def test_open_mode_is_todays_local_sizing_whatever_it_is_given(
    session: aiohttp.ClientSession, tokenize_server: TokenizeServer
) -> None:
    local = PromptSizer()
    learned = EstimateCalibration()
    learned.observe("chat", 100, 300)
    sizer = WorkloadSizer(
        local, engine(session, tokenize_server.url), use_engine=False, calibration=learned
    )
    request, size = chat("Sized here, as before.")
    first = await sizer.size(request, size)
    assert first == PromptSize(local(request), "estimate", local(request))
    for _ in range(50):
        sizer.observe_engine_prompt_tokens("chat", first, 3 * first.tokens)
    assert await sizer.size(request, size) == first  # no calibration either
    assert tokenize_server.bodies == []
    assert "tokenize_answered" not in sizer.stats()


async def test_long_bodies_are_sized_in_pieces(
    session: aiohttp.ClientSession, tokenize_server: TokenizeServer
) -> None:
    local = SpySizer()
    sizer = WorkloadSizer(local, engine(session, tokenize_server.url), use_engine=True)
    short = chat("short")
    medium = chat("word " * 20_000)  # past 64 KiB: in pieces, and still asked
    long = chat("word " * 60_000)  # past 256 KiB: the answer would pass the cap, not asked
    assert (await sizer.size(*short)).source == "engine"
    assert (await sizer.size(*medium)).source == "engine"
    long_size = await sizer.size(*long)
    assert long_size.source == "estimate"
    assert long_size.estimated == TOKENIZER.chat_prompt_count(long[0].body["messages"])
    assert local.calls == ["inline", "long", "long"]
    assert len(tokenize_server.bodies) == 2
    # With a configured tokenizer too.
    exact = SpySizer(lambda text: len(text.split()))
    await WorkloadSizer(exact).size(*medium)
    assert exact.calls == ["long"]


async def test_engine_answers_calibrate_later_estimates(
    session: aiohttp.ClientSession, tokenize_server: TokenizeServer
) -> None:
    """An engine whose tokenizer counts twice what the estimate does: once it stops
    answering, estimates come out about twice as large."""
    sizer = WorkloadSizer(PromptSizer(), engine(session, tokenize_server.url), use_engine=True)
    for i in range(40):
        request, size = chat(f"Prompt number {i} of a steady workload, tokenized.")
        tokenize_server.count = 2 * TOKENIZER.chat_prompt_count(request.body["messages"])
        assert (await sizer.size(request, size)).source == "engine"
    assert sizer.calibration("chat") == pytest.approx(2.0)
    assert sizer.calibration("completion") == 1.0
    tokenize_server.behaviour = "404"
    request, size = chat("A new prompt the engine no longer counts.")
    fallback = await sizer.size(request, size)
    assert fallback.source == "estimate" and fallback.estimated is not None
    assert fallback.tokens == round(2 * fallback.estimated)


async def test_usage_calibrates_estimates_and_stays_at_one_for_sim_engines(
    session: aiohttp.ClientSession,
) -> None:
    """An openai-dialect sim has no tokenize: prompts are estimated, and the engine's
    usage.prompt_tokens, which for the sim is the estimate exactly, keeps the factor at 1."""
    sim = await start_sim(SimOptions(model=MODEL, dialect="openai", time_scale=0.0))
    try:
        sizer = WorkloadSizer(PromptSizer(), engine(session, sim.url, "openai"), use_engine=True)
        for i in range(5):
            messages = [{"role": "user", "content": f"Question {i}: why is the sky blue?"}]
            request, raw_size = parsed("chat", messages=messages)
            size = await sizer.size(request, raw_size)
            assert size.source == "estimate"
            body = {"model": MODEL, "messages": messages, "max_tokens": 1}
            async with session.post(sim.url + "/v1/chat/completions", json=body) as response:
                usage = (await response.json())["usage"]
            assert usage["prompt_tokens"] == size.tokens
            sizer.observe_engine_prompt_tokens("chat", size, usage["prompt_tokens"])
        assert sizer.calibration("chat") == 1.0
        assert sizer.stats()["tokenize_no_engine"] == 5
    finally:
        await sim.close()


async def test_only_estimates_learn_from_usage() -> None:
    sizer = WorkloadSizer(PromptSizer(), use_engine=True)
    request, size = chat("Some words to estimate.")
    estimated = await sizer.size(request, size)
    sizer.observe_engine_prompt_tokens("chat", PromptSize(10, "engine", 5), 1000)
    sizer.observe_engine_prompt_tokens("chat", PromptSize(10, "tokenizer"), 1000)
    assert sizer.calibration("chat") == 1.0
    sizer.observe_engine_prompt_tokens("chat", estimated, round(1.5 * estimated.tokens))
    assert sizer.calibration("chat") == pytest.approx(1.5, rel=0.1)


async def test_an_estimate_proven_exact_is_used_without_asking_and_checked_now_and_then(
    session: aiohttp.ClientSession, tokenize_server: TokenizeServer
) -> None:
    """Engines that count as the estimate does (narwhal sim): after a run of exact
    matches the request no longer waits for a tokenize call; one in 64 is still checked,
    off the request's path, and the first difference sends sizing back to the engine."""
    sizer = WorkloadSizer(PromptSizer(), engine(session, tokenize_server.url), use_engine=True)
    sources = []
    for i in range(200):
        request, size = chat(f"Prompt number {i:03d}.")  # all of one length
        tokenize_server.count = TOKENIZER.chat_prompt_count(request.body["messages"])
        sources.append((await sizer.size(request, size)).source)
        await asyncio.sleep(0.001)  # let a background check run
    assert sources[:32] == ["engine"] * 32
    assert set(sources[32:]) == {"estimate"}
    await asyncio.sleep(0.05)
    asked = len(tokenize_server.bodies)
    assert 32 < asked <= 32 + 3  # 168 sized without a call; two or three checks
    tokenize_server.count = 10_000  # the engine's tokenizer changed
    for i in range(70):
        request, size = chat(f"Later prompt {i}")
        await sizer.size(request, size)
        await asyncio.sleep(0.001)
    request, size = chat("After the check that found the difference")
    assert (await sizer.size(request, size)).source == "engine"
