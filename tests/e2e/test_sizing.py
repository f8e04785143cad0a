"""Prompt sizing against real processes: admission never waits on an engine's `/tokenize`
unless the estimate's error could change its answer, and then only a bounded time.

The sims run at time-scale 1 (20,000 prompt tokens/s, so a 1,000-token prompt is 50 ms
of prefill); a fresh router's estimate has its wide default bounds (0.3-1.5 times the
estimate), since no engine has counted anything yet; once engines have counted enough
prompts the bounds are what they showed (for the sim, whose counts are the estimate's,
the estimate itself). The slow sim answers `/tokenize` two seconds late, as the engine of
the issue did under a burst; the router's wait is set longer than its 20 ms default so
that a request that waited shows it in its latency.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import MODEL, Reply, chat, completion, metrics_of, send, settle, sim_process
from tests.processes import NarwhalProcess, router_process

TOKENIZE_DELAY_S = 2.0
WAIT_S = 0.2  # under the tokenize call's own 0.25 s timeout
BUDGET_S = 0.25


def words(tokens: int) -> str:
    """A prompt of about `tokens` tokens for the sim's tokenizer (one per word)."""
    return "".join(" word" for _ in range(tokens))


def predictive(engine: NarwhalProcess, sizing_wait_s: float) -> dict[str, Any]:
    return {
        "model": MODEL,
        "engines": [{"name": "s0", "url": engine.url, "role": "both"}],
        "admission": {
            "mode": "predictive",
            "ttft_target_s": BUDGET_S,
            "sizing_wait_s": sizing_wait_s,
        },
    }


@pytest.fixture(scope="module")
def slow_sim() -> Iterator[NarwhalProcess]:
    with sim_process("--time-scale", "1", "--tokenize-delay-s", str(TOKENIZE_DELAY_S)) as p:
        yield p


async def timed(url: str, body: dict[str, Any]) -> tuple[Reply, float]:
    started = time.monotonic()
    reply = await send(url, body)
    return reply, time.monotonic() - started


def sizing(values: dict[str, float]) -> dict[str, float]:
    prefix = 'narwhal_prompt_sizing_total{source="'
    return {k[len(prefix) : -2]: v for k, v in values.items() if k.startswith(prefix)}


async def test_clear_decisions_never_wait_for_a_slow_tokenize(slow_sim: NarwhalProcess) -> None:
    """Prompts far from the budget are refused (prompt alone) or admitted at once, with
    the default bounds, though the engine's /tokenize takes 2 s. Once the engines' usage
    has taught the bounds, a burst past capacity is refused (projected) without any
    request waiting for the engine."""
    with router_process(predictive(slow_sim, WAIT_S)) as router:
        # The prompt alone: ~20,000 tokens, 1 s of prefill; even at 0.3 of the estimate it
        # would take longer than the budget.
        for i in range(2):
            reply, took = await timed(router.url, completion(f"{i}" + words(20_000), max_tokens=4))
            assert reply.status == 429, reply.raw
            assert reply.json()["error"]["code"] == "prompt_exceeds_ttft_budget"
            assert took < WAIT_S, took
        # A short prompt on an idle engine: admitted at once.
        reply, took = await timed(router.url, chat("Hello there", max_tokens=4))
        assert reply.status == 200, reply.raw
        assert took < WAIT_S, took
        values = await metrics_of(router.url)
        assert sizing(values) == {
            "local": 0,
            "engine": 0,
            "calibrated": 3,
            "fallback": 0,
            "estimate": 0,
        }
        assert values['narwhal_refused_total{reason="prompt"}'] == 2
        bound = 'narwhal_prompt_size_estimate_error_ratio{{bound="{}",route="chat"}}'
        assert values[bound.format("low")] == pytest.approx(0.3)
        assert values[bound.format("high")] == pytest.approx(1.5)

        # Served requests teach the bounds (usage.prompt_tokens): the sim's counts are
        # the estimate's, so they close on it.
        for i in range(32):
            reply = await send(router.url, chat(f"#sim:len=1 warm-up {i}" + words(20)))
            assert reply.status == 200, reply.raw
        values = await metrics_of(router.url)
        assert values[bound.format("low")] == values[bound.format("high")] == 1.0

        # A burst: 40 prompts of ~500 tokens (25 ms each) at once, about four budgets.
        replies = await asyncio.gather(
            *(timed(router.url, chat(f"#sim:len=4 {i}" + words(500))) for i in range(40))
        )
        statuses = [reply.status for reply, _ in replies]
        assert set(statuses) <= {200, 429}, statuses
        refused = [took for reply, took in replies if reply.status == 429]
        assert len(refused) >= 20, statuses
        assert {r.json()["error"]["code"] for r, _ in replies if r.status == 429} == {
            "ttft_budget_exceeded"
        }
        values = await settle(
            router.url,
            lambda v: v["narwhal_retained_requests"] == 0 and v["narwhal_offered_total"] == 75,
        )
        counted = sizing(values)
        assert counted["engine"] == counted["fallback"] == 0  # nothing waited
        assert counted["calibrated"] == 75
        # At the client, far under the engine's 2 s (this machine's load allowed for).
        assert max(refused) < TOKENIZE_DELAY_S / 4, sorted(refused)
        assert values['narwhal_outcomes_total{outcome="refused"}'] == len(refused) + 2


async def test_a_decision_at_the_edge_waits_for_the_engines_count_a_bounded_time(
    slow_sim: NarwhalProcess,
) -> None:
    """~5,000 tokens: alone within the budget at 0.3 of the estimate, over it at 1.5, so
    the engine's count decides. The slow engine does not answer within the wait: the
    router decides on the estimate when the wait is up (counted `fallback`), not after
    the engine's 2 s; and having seen the engine answer that late, it does not wait for
    the next one. An engine that answers at once is waited for and its count used."""
    with router_process(predictive(slow_sim, WAIT_S)) as router:
        reply, took = await timed(router.url, completion(words(5_000), max_tokens=4))
        assert reply.status == 429, reply.raw
        assert reply.json()["error"]["code"] == "prompt_exceeds_ttft_budget"
        assert WAIT_S <= took < WAIT_S + 0.5, took
        timeouts = 'narwhal_tokenize_calls_total{result="timeout"}'
        values = await settle(router.url, lambda v: v[timeouts] >= 1)
        assert sizing(values)["fallback"] == 1 and sizing(values)["engine"] == 0
        assert values[timeouts] >= 1  # the call went on to its own 0.25 s timeout
        reply, took = await timed(router.url, completion("1" + words(5_000), max_tokens=4))
        assert reply.status == 429, reply.raw
        assert took < WAIT_S, took
        assert sizing(await metrics_of(router.url))["fallback"] == 2
    with sim_process("--time-scale", "1") as fast:
        with router_process(predictive(fast, WAIT_S)) as router:
            reply, took = await timed(router.url, completion(words(5_000), max_tokens=4))
            assert reply.status == 429, reply.raw
            assert reply.json()["error"]["code"] == "prompt_exceeds_ttft_budget"
            assert took < WAIT_S, took
            values = await metrics_of(router.url)
            assert sizing(values)["engine"] == 1 and sizing(values)["fallback"] == 0
            assert values['narwhal_tokenize_calls_total{result="answered"}'] >= 1


async def test_at_the_edge_the_engines_count_decides() -> None:
    """A model whose tokenizer counts a quarter of what the estimate does: the ~5,000-token
    prompt refused above on the estimate (and on an engine that counts as it does) is
    admitted on the engine's count, waited for because the bounds straddle the budget."""
    with sim_process("--time-scale", "1", "--tokenize-scale", "0.25") as sim:
        with router_process(predictive(sim, WAIT_S)) as router:
            reply = await send(router.url, completion(words(5_000), max_tokens=4))
            assert reply.status == 200, reply.raw
            values = await metrics_of(router.url)
            assert sizing(values)["engine"] == 1 and sizing(values)["fallback"] == 0
            assert values['narwhal_refused_total{reason="prompt"}'] == 0


async def test_the_first_request_is_sized_in_the_engines_tokens_from_the_probes() -> None:
    """An engine whose tokenizer counts three tokens per estimated one. Its counts of the
    profiler's probe texts set the estimate's factor before any client's request, so the
    first prompt of ~1,500 estimated tokens is known to be about 4,500 (225 ms of prefill,
    over the 0.25 s budget as its bound says): the engine's count is waited for and the
    prompt refused. Sized by the bare estimate, it would have gone in at once, as 1,500."""
    with sim_process("--time-scale", "1", "--tokenize-scale", "3") as sim:
        with router_process(predictive(sim, WAIT_S)) as router:
            reply = await send(router.url, completion(words(1_500), max_tokens=4))
            assert reply.status == 429, reply.raw
            assert reply.json()["error"]["code"] == "prompt_exceeds_ttft_budget"
            values = await metrics_of(router.url)
            assert sizing(values)["engine"] == 1 and sizing(values)["calibrated"] == 0
