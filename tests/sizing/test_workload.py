"""WorkloadSizer: local sizing with bounds, the bounded wait for an engine's count, long
prompts in pieces, and calibration."""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

import aiohttp
import pytest

from narwhal.protocol.dialects import capabilities
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
from narwhal.sizing.calibration import DEFAULT_BOUNDS, MIN_SAMPLES
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
    candidates = [TokenizeCandidate("e0", url, capabilities(dialect))]
    return EngineTokenizer(session, lambda: candidates)


async def test_a_configured_tokenizer_comes_first_and_no_engine_is_asked(
    session: aiohttp.ClientSession, tokenize_server: TokenizeServer
) -> None:
    sizer = WorkloadSizer(
        PromptSizer(lambda text: len(text.split())),
        engine(session, tokenize_server.url),
        use_engine=True,
    )
    assert not sizer.calibrating
    size = await sizer.size(*chat("three short words"))
    assert size == PromptSize.exact(3 + 4, "local")  # the words, and the template allowance
    assert size.settled
    await asyncio.sleep(0.01)
    assert tokenize_server.bodies == []


async def test_token_id_prompts_are_exact_without_any_tokenizer(
    session: aiohttp.ClientSession, tokenize_server: TokenizeServer
) -> None:
    sizer = WorkloadSizer(PromptSizer(), engine(session, tokenize_server.url), use_engine=True)
    size = await sizer.size(*parsed("completion", prompt=[9, 8, 7, 6]))
    assert size == PromptSize(4, 4, 4, "local")
    await asyncio.sleep(0.01)
    assert tokenize_server.bodies == []


async def test_sizing_never_waits_for_an_engine(
    session: aiohttp.ClientSession, tokenize_server: TokenizeServer
) -> None:
    """An engine that does not answer: sizing is the calibrated estimate with its (default)
    bounds, at once; the engine is asked only in the background, one call at a time."""
    tokenize_server.behaviour = "stall"
    sizer = WorkloadSizer(PromptSizer(), engine(session, tokenize_server.url), use_engine=True)
    request, raw = chat("A prompt the engine counts its own way, some day.")
    estimate = TOKENIZER.chat_prompt_count(request.body["messages"])
    started = time.monotonic()
    sizes = [await sizer.size(request, raw) for _ in range(5)]
    assert time.monotonic() - started < 0.1
    low, high = DEFAULT_BOUNDS
    assert set(sizes) == {
        PromptSize(
            estimate, math.floor(estimate * low), math.ceil(estimate * high), "calibrated", estimate
        )
    }
    await tokenize_server.wait_for_requests(1)
    await asyncio.sleep(0.02)
    assert len(tokenize_server.bodies) == 1  # the one background sample still out


async def test_engine_count_waits_a_bounded_time_and_its_late_answer_still_counts(
    session: aiohttp.ClientSession, tokenize_server: TokenizeServer
) -> None:
    sizer = WorkloadSizer(PromptSizer(), engine(session, tokenize_server.url), use_engine=True)
    tokenize_server.behaviour = "hold"
    request, raw = chat("Near the boundary: worth the engine's own count.")
    size = await sizer.size(request, raw)
    started = time.monotonic()
    fallback = await sizer.engine_count("chat", size, 0.05)
    waited = time.monotonic() - started
    assert 0.05 <= waited < 0.2, waited
    assert fallback.source == "fallback"
    assert (fallback.tokens, fallback.low, fallback.high) == (size.tokens, size.low, size.high)
    # The engine answers later: the cache has it, so the same prompt is now its count.
    tokenize_server.release.set()
    for _ in range(100):
        if sizer.stats()["tokenize_answered"] >= 1:
            break
        await asyncio.sleep(0.01)
    assert await sizer.size(request, raw) == PromptSize.exact(42, "engine")
    # In time: the engine's count, exact.
    other, other_raw = chat("Another prompt, answered in time.")
    counted = await sizer.engine_count("chat", await sizer.size(other, other_raw), 1.0)
    assert counted == PromptSize(42, 42, 42, "engine", counted.estimated)
    # Failing: at once, the size as it was.
    tokenize_server.behaviour = "500"
    third, third_raw = chat("A third, while the engine fails.")
    third_size = await sizer.size(third, third_raw)
    started = time.monotonic()
    failed = await sizer.engine_count("chat", third_size, 1.0)
    assert failed.source == "fallback" and time.monotonic() - started < 0.5
    assert sizer.stats()["tokenize_failed_status"] >= 1
    # No wait allowed (admission.sizing_wait_s: 0): no call.
    asked = len(tokenize_server.bodies)
    assert (await sizer.engine_count("chat", third_size, 0.0)).source == "fallback"
    assert len(tokenize_server.bodies) == asked


async def test_open_mode_is_todays_local_sizing_whatever_it_is_given(
    session: aiohttp.ClientSession, tokenize_server: TokenizeServer
) -> None:
    """Open admission sizes by the estimate, value for value, and asks no engine; the
    bounds around it (for the context check alone) follow the engines' usage."""
    local = PromptSizer()
    sizer = WorkloadSizer(local, engine(session, tokenize_server.url), use_engine=False)
    assert not sizer.calibrating
    request, size = chat("Sized here, as before, and long enough to teach the bounds too.")
    first = await sizer.size(request, size)
    estimated = local(request)
    assert (first.tokens, first.source, first.estimated) == (estimated, "estimate", estimated)
    assert first.low < estimated < first.high  # wide before any usage was seen
    for _ in range(50):
        sizer.observe_engine_prompt_tokens("chat", first, 3 * first.tokens)
    again = await sizer.size(request, size)
    assert again.tokens == estimated  # no calibration of the size itself
    assert again.high >= 2 * estimated  # but the engines count three times as many
    assert (await sizer.engine_count("chat", first, 1.0)).source == "fallback"
    await asyncio.sleep(0.01)
    assert tokenize_server.bodies == []
    assert "tokenize_answered" not in sizer.stats()


async def test_long_bodies_are_sized_in_pieces(
    session: aiohttp.ClientSession, tokenize_server: TokenizeServer
) -> None:
    local = SpySizer()
    sizer = WorkloadSizer(local, engine(session, tokenize_server.url), use_engine=True)
    short = chat("short")
    medium = chat("word " * 20_000)  # past 64 KiB: in pieces, and still askable
    long = chat("word " * 60_000)  # past 256 KiB: the answer would pass the cap, not asked
    assert (await sizer.size(*short)).query is not None
    assert (await sizer.size(*medium)).query is not None
    long_size = await sizer.size(*long)
    assert long_size.source == "calibrated" and long_size.query is None
    assert long_size.estimated == TOKENIZER.chat_prompt_count(long[0].body["messages"])
    assert (await sizer.engine_count("chat", long_size, 1.0)).source == "fallback"
    assert local.calls == ["inline", "long", "long"]
    # With a configured tokenizer too.
    exact = SpySizer(lambda text: len(text.split()))
    await WorkloadSizer(exact).size(*medium)
    assert exact.calls == ["long"]


async def test_engine_answers_calibrate_later_estimates_and_their_bounds(
    session: aiohttp.ClientSession, tokenize_server: TokenizeServer
) -> None:
    """An engine whose tokenizer counts twice what the estimate does: once it has answered
    for enough prompts, estimates come out twice as large, and exact within their bounds."""
    sizer = WorkloadSizer(PromptSizer(), engine(session, tokenize_server.url), use_engine=True)
    for i in range(MIN_SAMPLES + 8):
        request, size = chat(f"Prompt number {i} of a steady workload, tokenized by the engine.")
        tokenize_server.count = 2 * TOKENIZER.chat_prompt_count(request.body["messages"])
        counted = await sizer.engine_count("chat", await sizer.size(request, size), 1.0)
        assert counted.source == "engine"
        await asyncio.sleep(0.005)  # the background sample of the same prompt, if any
    assert sizer.calibration("chat") == pytest.approx(2.0)
    assert sizer.bounds("chat") == (2.0, 2.0)
    assert sizer.calibration("completion") == 1.0
    assert sizer.bounds("completion") == DEFAULT_BOUNDS
    tokenize_server.behaviour = "404"
    request, size = chat("A new prompt the engine no longer counts at all.")
    fallback = await sizer.size(request, size)
    assert fallback.source == "calibrated" and fallback.estimated is not None
    assert fallback.tokens == fallback.low == fallback.high == 2 * fallback.estimated


async def test_usage_calibrates_estimates_and_stays_at_one_for_sim_engines(
    session: aiohttp.ClientSession,
) -> None:
    """An openai-dialect sim has no tokenize: prompts are estimated, and the engine's
    usage.prompt_tokens, which for the sim is the estimate exactly, keeps the factor at 1
    and, once enough prompts have been served, the bounds at the estimate itself."""
    sim = await start_sim(SimOptions(model=MODEL, dialect="openai", time_scale=0.0))
    try:
        sizer = WorkloadSizer(PromptSizer(), engine(session, sim.url, "openai"), use_engine=True)
        for i in range(MIN_SAMPLES):
            messages = [{"role": "user", "content": f"Question {i}: why is the sky blue? " * 3}]
            request, raw_size = parsed("chat", messages=messages)
            size = await sizer.size(request, raw_size)
            assert size.source == "calibrated"
            body = {"model": MODEL, "messages": messages, "max_tokens": 1}
            async with session.post(sim.url + "/v1/chat/completions", json=body) as response:
                usage = (await response.json())["usage"]
            assert usage["prompt_tokens"] == size.tokens
            sizer.observe_engine_prompt_tokens("chat", size, usage["prompt_tokens"])
        assert sizer.calibration("chat") == 1.0
        assert sizer.bounds("chat") == (1.0, 1.0)
        settled = await sizer.size(*parsed("chat", messages=messages))
        assert settled.settled and settled.source == "calibrated"
        assert sizer.stats()["tokenize_no_engine"] >= 1  # background samples found none
    finally:
        await sim.close()


async def test_only_estimates_learn_from_usage() -> None:
    sizer = WorkloadSizer(PromptSizer(), use_engine=True)
    request, size = chat("Some words to estimate, enough of them to count for the bounds.")
    estimated = await sizer.size(request, size)
    sizer.observe_engine_prompt_tokens("chat", PromptSize.exact(10, "engine", 5), 1000)
    sizer.observe_engine_prompt_tokens("chat", PromptSize.exact(10, "local"), 1000)
    assert sizer.calibration("chat") == 1.0
    sizer.observe_engine_prompt_tokens("chat", estimated, round(1.5 * estimated.tokens))
    assert sizer.calibration("chat") == pytest.approx(1.5, rel=0.1)
    fallback = await sizer.engine_count("chat", estimated, 1.0)  # no engine: fallback
    sizer.observe_engine_prompt_tokens("chat", fallback, round(1.5 * estimated.tokens))
    assert sizer.calibration("chat") == pytest.approx(1.5, rel=0.1)


async def test_sizes_are_counted_by_the_source_admission_acted_on() -> None:
    sizer = WorkloadSizer(PromptSizer(), use_engine=True)
    size = await sizer.size(*chat("counted once"))
    sizer.count(size)
    sizer.count(await sizer.engine_count("chat", size, 1.0))
    sizer.count(PromptSize.exact(3, "local"))
    stats = sizer.stats()
    assert (stats["sized_calibrated"], stats["sized_fallback"], stats["sized_local"]) == (1, 1, 1)
    assert stats["sized_engine"] == stats["sized_estimate"] == 0


async def test_bounds_learned_are_checked_now_and_then_in_the_background(
    session: aiohttp.ClientSession, tokenize_server: TokenizeServer
) -> None:
    """Engines that count as the estimate does (narwhal sim): every prompt is sampled in
    the background, one call at a time, until the bounds are learned; then one in 64, and
    a change the samples find widens the bounds again."""
    sizer = WorkloadSizer(PromptSizer(), engine(session, tokenize_server.url), use_engine=True)
    sizes = []
    for i in range(200):
        request, size = chat(f"Prompt number {i:03d} of a workload the engine counts exactly.")
        tokenize_server.count = TOKENIZER.chat_prompt_count(request.body["messages"])
        sizes.append(await sizer.size(request, size))
        await asyncio.sleep(0.002)  # let a background sample run
    assert not sizes[0].settled
    assert all(s.settled and s.source == "calibrated" for s in sizes[-100:])
    asked = len(tokenize_server.bodies)
    assert MIN_SAMPLES <= asked <= MIN_SAMPLES + 10 + 200 // 64, asked
    tokenize_server.count = 10_000  # the engine's tokenizer changed
    for i in range(140):
        request, size = chat(f"Later prompt {i}, which the engine now counts another way.")
        await sizer.size(request, size)
        await asyncio.sleep(0.002)
    request, size = chat("After the samples that found the difference")
    assert not (await sizer.size(request, size)).settled


async def test_no_wait_while_the_engines_answer_later_than_it_allows(
    session: aiohttp.ClientSession, tokenize_server: TokenizeServer
) -> None:
    """Once an engine's answers have come later than the wait, a decision at the edge is
    taken on the estimate at once; answers in time again bring the waits back."""
    sizer = WorkloadSizer(PromptSizer(), engine(session, tokenize_server.url), use_engine=True)
    tokenize_server.behaviour = "hold"
    request, raw = chat("A prompt the engine is slow to count, under a burst.")
    size = await sizer.size(request, raw)
    assert (await sizer.engine_count("chat", size, 0.05)).source == "fallback"
    await asyncio.sleep(0.15)
    tokenize_server.release.set()  # answered, 0.15 s after it was asked
    await asyncio.sleep(0.1)  # both answered: the wait's call and the background sample
    assert sizer.stats()["tokenize_answered"] == 2
    tokenize_server.behaviour = "ok"
    other, other_raw = chat("The next prompt at the edge.")
    started = time.monotonic()
    assert (await sizer.engine_count("chat", await sizer.size(other, other_raw), 0.05)).source == (
        "fallback"
    )
    assert time.monotonic() - started < 0.04
    # The background samples answer at once now: the waits come back.
    for i in range(10):
        await sizer.size(*chat(f"Prompt {i}, counted in the background."))
        await asyncio.sleep(0.02)
    third, third_raw = chat("A third prompt at the edge.")
    assert (await sizer.engine_count("chat", await sizer.size(third, third_raw), 0.05)).source == (
        "engine"
    )


async def test_an_engines_count_of_a_probe_text_sizes_the_first_requests() -> None:
    """The profiler's probes are counted by the engine before any client's request: their
    ratio (here 2.9 tokens per estimated one, as the test tier's tiny model counts) sizes
    the first prompts, which would otherwise go in at a third of their size. The bounds
    stay the default ones: they are about clients' prompts."""
    sizer = WorkloadSizer(PromptSizer(), use_engine=True)
    text = " ".join(f"probe{i % 7}" for i in range(400))
    estimated = TOKENIZER.count(text)
    sizer.learn_text(text, round(2.9 * estimated))
    for route in ("chat", "completion"):
        assert sizer.calibration(route) == pytest.approx(2.9, rel=0.01)  # type: ignore[arg-type]
        assert sizer.bounds(route) == DEFAULT_BOUNDS  # type: ignore[arg-type]
    request, raw_size = chat("words " * 300)
    size = await sizer.size(request, raw_size)
    assert size.source == "calibrated"
    assert size.tokens == pytest.approx(2.9 * size.estimated, rel=0.01)  # type: ignore[operator]
    assert size.high == size.tokens  # (the default bounds' top is below the factor)
    # Clients' counts take over from there, as they would have from nothing.
    for _ in range(60):
        sizer.observe_engine_prompt_tokens("chat", size, round(1.2 * size.estimated))  # type: ignore[operator]
    assert sizer.calibration("chat") == pytest.approx(1.2, rel=0.05)


async def test_probe_texts_teach_nothing_where_sizing_is_not_calibrated() -> None:
    # Open admission (today's local sizing, value for value) and a configured tokenizer.
    for sizer in (
        WorkloadSizer(PromptSizer()),
        WorkloadSizer(PromptSizer(lambda text: len(text.split())), use_engine=True),
    ):
        sizer.learn_text("a b c d e f g h", 30)
        assert sizer.calibration("chat") == sizer.calibration("completion") == 1.0
