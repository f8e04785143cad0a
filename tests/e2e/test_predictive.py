"""Predictive admission against real processes: profiling, the two predictive 429s, and
overload refused early instead of queued past the budget.

The sims run at time-scale 1 (their performance model in real time: 20,000 prompt
tokens/s, 6 ms decode steps, an 8,192-token step budget), so projections are about real
durations; the prompts use `#sim:len=N` for a known output length where it matters.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import openai
import pytest

from tests.e2e.conftest import MODEL, chat, completion, metrics_of, send, settle, sim_process
from tests.processes import NarwhalProcess, router_process

# What an admitted request's TTFT may exceed the budget by, as a client measures it: the
# projection's own error is inside the budget (its 99th-percentile margin), this slack is
# for the client side (connection, body, sizing) on a shared 2-core machine.
SLACK_S = 0.25


def predictive(engines: list[tuple[str, NarwhalProcess]], **admission: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "engines": [{"name": name, "url": p.url, "role": "both"} for name, p in engines],
        "admission": {"mode": "predictive", **admission},
    }


@pytest.fixture(scope="module")
def sim() -> Iterator[NarwhalProcess]:
    with sim_process("--time-scale", "1") as process:
        yield process


async def engines(router: NarwhalProcess) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.get(router.url + "/admin/engines") as resp:
            assert resp.status == 200
            return {e["name"]: e for e in (await resp.json())["engines"]}


def words(tokens: int) -> str:
    """A prompt of about `tokens` tokens for the sim's tokenizer (one per word)."""
    return "".join(" word" for _ in range(tokens))


async def test_engines_are_profiled_from_token_ids_before_they_take_work(
    sim: NarwhalProcess,
) -> None:
    with router_process(predictive([("s0", sim)])) as router:
        engine = (await engines(router))["s0"]
        assert engine["state"] == "up" and engine["eligible"] is True
        assert engine["profiling"]["state"] == "profiled"
        profile = engine["profile"]
        assert profile["source"] == "token_ids" and profile["samples"] >= 3
        assert profile["age_s"] >= 0 and profile["measured_at"] > time.time() - 60
        # The sim prefills 20,000 tokens/s (50 ms per 1,000) in steps of 6 ms: the fit
        # from four probes finds it.
        assert profile["prefill_s"]["per_1k_tokens"] == pytest.approx(0.05, rel=0.25)
        assert profile["decode_step_s"]["base"] == pytest.approx(0.006, rel=0.5)
        # The model's context, which caps a request's expected output, from /v1/models.
        assert engine["monitoring"]["max_model_len"] == 32768
        reply = await send(router.url, chat("Hello"))
        assert reply.status == 200, reply.raw
        values = await metrics_of(router.url)
        # The probes were never counted as client traffic.
        assert values["narwhal_offered_total"] == 1
        assert values['narwhal_engine_profiled{engine="s0"}'] == 1
        assert values['narwhal_engine_profile_attempts_total{engine="s0"}'] == 1


@pytest.mark.parametrize(
    "fault", ["no_token_ids", "bool_token_id", "negative_token_id", "malformed_token_ids"]
)
async def test_an_engine_whose_ids_fail_the_check_stays_unprofiled(
    sim: NarwhalProcess, fault: str
) -> None:
    with sim_process("--time-scale", "0", "--always", f"#sim:{fault}") as bad:
        with router_process(predictive([("good", sim), ("bad", bad)])) as router:
            report = await engines(router)
            assert report["bad"]["state"] == "unprofiled"
            assert report["bad"]["eligible"] is False and report["bad"]["profile"] is None
            profiling = report["bad"]["profiling"]
            assert profiling["state"] == "failed"
            assert "token" in profiling["reason"], profiling
            assert report["good"]["eligible"] is True
            # The router serves on the engine that passed.
            replies = await asyncio.gather(*(send(router.url, chat(f"hi {i}")) for i in range(4)))
            assert [r.status for r in replies] == [200] * 4


async def test_no_profiled_engine_is_503_backend_unavailable() -> None:
    with sim_process("--time-scale", "0", "--always", "#sim:bool_token_id") as bad:
        with router_process(predictive([("bad", bad)])) as router:
            reply = await send(router.url, chat("hi"))
            assert reply.status == 503
            assert reply.json()["error"]["code"] == "backend_unavailable"
            assert reply.headers["Retry-After"] == "1"
            async with aiohttp.ClientSession() as session:
                async with session.get(router.url + "/ready") as resp:
                    assert resp.status == 503
                    assert (await resp.json())["reason"] == "no_engines"
            values = await metrics_of(router.url)
            assert values['narwhal_outcomes_total{outcome="unavailable"}'] == 1


async def test_a_prompt_alone_over_the_budget_is_refused_before_any_engine(
    sim: NarwhalProcess,
) -> None:
    with router_process(predictive([("s0", sim)], ttft_target_s=0.1)) as router:
        before = await _engine_requests(sim)
        reply = await send(router.url, completion(words(8000), max_tokens=4))  # ~0.4 s alone
        assert reply.status == 429
        error = reply.json()["error"]
        assert error["code"] == "prompt_exceeds_ttft_budget"
        assert error["type"] == "invalid_request_error" and error["param"] == "prompt"
        assert "shorten the prompt" in error["message"]
        assert "Retry-After" not in reply.headers  # waiting would not help
        values = await metrics_of(router.url)
        assert values['narwhal_refused_total{reason="prompt"}'] == 1
        assert values['narwhal_outcomes_total{outcome="refused"}'] == 1
        assert await _engine_requests(sim) == before  # nothing was sent
        assert (await send(router.url, completion("short", max_tokens=4))).status == 200


async def test_a_burst_beyond_capacity_is_refused_early_and_the_admitted_meet_the_budget(
    sim: NarwhalProcess,
) -> None:
    """40 requests of ~2,000 prompt tokens at once on one engine that prefills 10 such a
    second, budget 1 s: the router admits what it can serve within the budget and refuses
    the rest at once with ttft_budget_exceeded, instead of queueing them past it."""
    budget = 1.0
    with router_process(predictive([("s0", sim)], ttft_target_s=budget)) as router:
        loop = asyncio.get_running_loop()

        async def one(i: int) -> tuple[int, float, float, dict[str, Any]]:
            body = chat(f"#sim:len=8 {i}" + words(2000), stream=True)
            started = loop.time()
            async with aiohttp.ClientSession() as session:
                async with session.post(router.url + "/v1/chat/completions", json=body) as resp:
                    first = None
                    async for _ in resp.content.iter_any():
                        first = first or loop.time()
                        break
                    await resp.read()
                    headers = dict(resp.headers)
                    return resp.status, (first or loop.time()) - started, started, headers

        results = await asyncio.gather(*(one(i) for i in range(40)))
        admitted = [r for r in results if r[0] == 200]
        refused = [r for r in results if r[0] == 429]
        assert len(admitted) + len(refused) == 40, [r[0] for r in results]
        assert 4 <= len(admitted) <= 20, len(admitted)
        assert len(refused) >= 20
        slowest_first_byte = max(ttft for _, ttft, _, _ in admitted)
        assert slowest_first_byte <= budget + SLACK_S, slowest_first_byte
        # Refusals come at once, not after a wait: the slowest well inside the budget.
        assert max(t for _, t, _, _ in refused) < 0.5
        for _, _, _, headers in refused:
            assert int(headers["Retry-After"]) >= 1
        values = await settle(
            router.url,
            lambda v: v["narwhal_retained_requests"] == 0 and v["narwhal_offered_total"] == 40,
        )
        assert values['narwhal_refused_total{reason="projected"}'] == len(refused)
        assert values['narwhal_outcomes_total{outcome="refused"}'] == len(refused)
        assert values['narwhal_outcomes_total{outcome="completed"}'] == len(admitted)
        # Every admitted request's TTFT as the router measured it is within the budget too.
        assert values['narwhal_ttft_seconds_bucket{engine="s0",le="+Inf"}'] >= len(admitted)
        # Each admitted request's first token was held to its projection's bound, once.
        within = values['narwhal_ttft_bound_total{outcome="within"}']
        exceeded = values['narwhal_ttft_bound_total{outcome="exceeded"}']
        assert within + exceeded == len(admitted)
        assert values['narwhal_engine_ttft_bound_factor{engine="s0"}'] >= 1.0


async def test_open_mode_profiles_nothing(sim: NarwhalProcess) -> None:
    config = predictive([("s0", sim)])
    config["admission"]["mode"] = "open"
    with router_process(config) as router:
        engine = (await engines(router))["s0"]
        assert engine["profile"] is None and engine["profiling"] is None
        assert engine["eligible"] is True
        assert "narwhal_engine_profiled" not in " ".join(await metrics_of(router.url))


async def _engine_requests(sim: NarwhalProcess) -> float:
    values = await metrics_of(sim.url)
    return sum(v for k, v in values.items() if k.startswith("vllm:request_success_total"))


async def test_the_official_client_does_not_retry_a_prompt_alone_refusal(
    sim: NarwhalProcess,
) -> None:
    """The openai client retries a 429 twice unless the answer says `x-should-retry:
    false`: the refusal reaches it once, at once, and the router sees one request."""
    with router_process(predictive([("s0", sim)], ttft_target_s=0.1)) as router:
        client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="unused")
        async with client:
            with pytest.raises(openai.RateLimitError) as info:
                await client.completions.create(model=MODEL, prompt=words(8000), max_tokens=4)
        assert info.value.response.headers["x-should-retry"] == "false"
        assert info.value.code == "prompt_exceeds_ttft_budget"
        values = await metrics_of(router.url)
        assert values["narwhal_offered_total"] == 1
        assert values['narwhal_refused_total{reason="prompt"}'] == 1


async def test_a_prompt_that_fills_the_context_is_told_so_not_to_raise_the_budget(
    sim: NarwhalProcess,
) -> None:
    """60,000 words, too long a body to ask the engine's /tokenize, so sized by an
    estimate the context check lets through (its least, a quarter, fits 32,768): the
    prompt-alone refusal says the context is the limit."""
    with router_process(predictive([("s0", sim)], ttft_target_s=0.1)) as router:
        reply = await send(router.url, completion(words(60_000), max_tokens=4))
        assert reply.status == 429, reply.raw
        error = reply.json()["error"]
        assert error["code"] == "prompt_exceeds_ttft_budget"
        assert "context of 32768 tokens" in error["message"]
        assert "ttft_target_s" not in error["message"]
        assert reply.headers["x-should-retry"] == "false"
