"""Cache-aware placement on constructed cases (sans-IO): a cached prefix is priced in
seconds of prefill against the engines' backlogs, never by a fixed threshold."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from narwhal.admission.predictive import PredictiveCheck
from narwhal.config import EngineConfig
from narwhal.errors import PromptExceedsTtftBudget
from narwhal.fleet.scrape import EngineScrape
from narwhal.fleet.state import EngineHealth
from narwhal.models.book import ModelBook
from narwhal.models.profile import ProbeSample, fit_profile
from narwhal.protocol.requests import parse_request
from narwhal.scheduler.placement import InFlightScorer, PlacementRequest
from narwhal.scheduler.predictive import ProjectingScorer
from narwhal.scheduler.prefix_cache import PrefixCache
from narwhal.scheduler.registry import EngineEntry, EngineRegistry
from narwhal.scheduler.scheduler import Scheduler

# Every engine: 10 ms + 50 ms per 1,000 prompt tokens, alone.
A, B = 0.010, 0.050
SYSTEM = "You are a careful assistant. " * 1100  # 31,900 characters
TOKENS = 8000  # the prompt's size, as sizing gave it (about 4 characters a token)


def registry_of(
    n: int = 2, roles: tuple[tuple[str, str], ...] = ()
) -> tuple[EngineRegistry, ModelBook]:
    """Engines e0..e(n-1), role both (or `roles`: (name, role) pairs), all profiled alike."""
    named = roles or tuple((f"e{i}", "both") for i in range(n))
    engines = [
        EngineConfig(name=name, url=f"http://127.0.0.1/{name}", role=role)  # type: ignore[arg-type]
        for name, role in named
    ]
    registry = EngineRegistry(engines)
    book = ModelBook(registry.entries, ttft_budget_s=2.0)
    probes = [ProbeSample(p, A + B * p / 1000, 0.006) for p in (64, 512, 2048)]
    for name, entry in registry.entries.items():
        entry.model = book.model(name)
        entry.model.install(fit_profile(probes, source="token_ids", wall=0, now=0))
    return registry, book


def chat(*messages: tuple[str, str]) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": r, "content": c} for r, c in messages]}


def placement(prefix: PrefixCache, body: dict[str, Any], tokens: int = TOKENS) -> PlacementRequest:
    request = parse_request(json.dumps(body).encode(), "chat", model="m")
    return PlacementRequest("chat", tokens, 16, 16.0, prefix=prefix.blocks_of(request))


def backlog(registry: EngineRegistry, name: str, seconds: float) -> None:
    """The engine's lane projects `seconds` of work ahead of any new prompt (the lane
    itself is tested in tests/models/test_lane.py)."""
    model = registry.entries[name].model
    assert model is not None
    alone = model.solo
    model.ttft = lambda tokens, *_: seconds + alone(tokens)  # type: ignore[method-assign]


def up(registry: EngineRegistry, name: str) -> EngineEntry:
    """The engine, monitored and up."""
    entry = registry.entries[name]
    entry.health = EngineHealth(stale_after_s=5.0)
    entry.health.status = "up"
    return entry


def cache_of(registry: EngineRegistry) -> PrefixCache:
    return PrefixCache(list(registry.entries), block_chars=64, max_blocks=100_000)


def warm(prefix: PrefixCache, registry: EngineRegistry, name: str, body: dict[str, Any]) -> None:
    """An earlier request with this prompt was placed on `name`."""
    prefix.placed(registry.entries[name], placement(prefix, body), 0)


FIRST_TURN = chat(("system", SYSTEM), ("user", "What is a narwhal?"))
SECOND_TURN = chat(
    ("system", SYSTEM),
    ("user", "What is a narwhal?"),
    ("assistant", "A whale with a tusk."),
    ("user", "Where does it live?"),
)


def test_the_engine_holding_the_prefix_is_priced_for_the_rest_of_the_prompt_only() -> None:
    registry, _ = registry_of()
    prefix = cache_of(registry)
    warm(prefix, registry, "e0", FIRST_TURN)
    request = placement(prefix, SECOND_TURN)
    cached = prefix.cached_tokens(registry.entries["e0"], request)
    # The system prompt and first question are shared: whole 16-token blocks of them.
    assert 7800 <= cached < TOKENS and cached % 16 == 0
    assert prefix.cached_tokens(registry.entries["e1"], request) == 0


@pytest.mark.parametrize(
    ("e0_backlog_s", "winner"),
    [
        (0.0, "e0"),
        # The cold engine prefills 8,000 tokens: 0.41 s, and adds that work to its queue.
        # The cached one prefills a few blocks (0.01 s) behind its backlog: it wins while
        # the backlog is worth less than twice the prefill it saves, about 0.8 s.
        (0.3, "e0"),
        (0.7, "e0"),
        (0.9, "e1"),
        (2.0, "e1"),
    ],
)
def test_a_cached_engine_wins_until_its_backlog_outweighs_the_prefill_it_saves(
    e0_backlog_s: float, winner: str
) -> None:
    registry, book = registry_of()
    prefix = cache_of(registry)
    scheduler = Scheduler(registry, ProjectingScorer(book, prefix=prefix), prefix=prefix)
    warm(prefix, registry, "e0", FIRST_TURN)
    backlog(registry, "e0", e0_backlog_s)
    plan = scheduler.plan(placement(prefix, SECOND_TURN))
    assert plan is not None and plan.decode.name == winner
    # The plan carries what its engine holds; the engine's index now holds the prompt.
    assert (plan.cached_tokens > 0) == (winner == "e0")
    third = placement(prefix, SECOND_TURN)
    assert prefix.cached_tokens(registry.entries[winner], third) > 7900


def test_without_the_prefix_cache_the_same_fleet_places_by_load_alone() -> None:
    registry, book = registry_of()
    prefix = cache_of(registry)
    warm(prefix, registry, "e0", FIRST_TURN)
    backlog(registry, "e0", 0.1)
    scheduler = Scheduler(registry, ProjectingScorer(book))  # policy: load
    plan = scheduler.plan(placement(prefix, SECOND_TURN))
    assert plan is not None and plan.decode.name == "e1" and plan.cached_tokens == 0


def test_unrelated_prompts_spread_by_load() -> None:
    registry, book = registry_of()
    prefix = cache_of(registry)
    warm(prefix, registry, "e0", FIRST_TURN)
    backlog(registry, "e0", 0.1)
    scheduler = Scheduler(registry, ProjectingScorer(book, prefix=prefix), prefix=prefix)
    other = chat(("system", "Another assistant entirely. " * 1100), ("user", "Hi"))
    plan = scheduler.plan(placement(prefix, other))
    assert plan is not None and plan.decode.name == "e1" and plan.cached_tokens == 0


def test_the_check_admits_a_long_prompt_that_only_a_cached_engine_can_serve_in_time() -> None:
    registry, book = registry_of()
    prefix = cache_of(registry)
    long_system = "You are a careful assistant. " * 5000  # 145,000 characters
    first = chat(("system", long_system), ("user", "Hi"))
    second = chat(("system", long_system), ("user", "Hi"), ("assistant", "Hello"), ("user", "?"))
    tokens = 36_000  # 1.81 s alone, over a 1 s budget on any cold engine
    cold = PredictiveCheck(registry, book, ttft_budget_s=1.0)
    warm_check = PredictiveCheck(registry, book, ttft_budget_s=1.0, prefix=prefix)
    request = placement(prefix, second, tokens)
    with pytest.raises(PromptExceedsTtftBudget, match="prompt alone"):
        warm_check.check(request, arrived=0.0, now=0.0, queued=0)
    prefix.placed(registry.entries["e1"], placement(prefix, first, tokens - 10), 0)
    with pytest.raises(PromptExceedsTtftBudget, match="prompt alone"):
        cold.check(request, arrived=0.0, now=0.0, queued=0)
    projection = warm_check.check(request, arrived=0.0, now=0.0, queued=0)
    assert projection is not None and projection.raw < 0.05


def test_without_models_a_cached_prefix_counts_as_prefill_work_spared() -> None:
    registry, _ = registry_of()
    for entry in registry.entries.values():
        entry.model = None
    prefix = cache_of(registry)
    scorer = InFlightScorer(prefix=prefix)
    scheduler = Scheduler(registry, scorer, random.Random(0), prefix=prefix)
    warm(prefix, registry, "e0", FIRST_TURN)
    request = placement(prefix, SECOND_TURN)
    # About 7,900 cached tokens: 7.7 typical prompts of prefill work spared there.
    registry.entries["e0"].load.decoding = 5
    plan = scheduler.plan(request)
    assert plan is not None and plan.decode.name == "e0"
    registry.entries["e0"].load.decoding = 12
    plan = scheduler.plan(placement(prefix, SECOND_TURN))
    assert plan is not None and plan.decode.name == "e1"


def test_an_engine_seen_down_comes_back_with_an_empty_index() -> None:
    registry, _ = registry_of()
    prefix = cache_of(registry)
    entry = up(registry, "e0")
    warm(prefix, registry, "e0", FIRST_TURN)
    assert prefix.cached_tokens(entry, placement(prefix, SECOND_TURN)) > 0
    entry.health.status = "down"
    prefix.follow(entry)
    entry.health.status = "up"
    prefix.follow(entry)
    assert prefix.cached_tokens(entry, placement(prefix, SECOND_TURN)) == 0
    report = prefix.report("e0")
    assert report is not None and report["resets"] == 1 and report["blocks"] == 0


def scraped(entry_health: EngineHealth, hits: float, queries: float, blocks: int = 8192) -> None:
    entry_health.record_scrape(
        EngineScrape(1.0, 0.0, 0.1, queries, hits, block_size=16, num_gpu_blocks=blocks), 0.0
    )


def test_the_index_follows_the_engine_kv_cache_and_forgets_a_restarted_engine() -> None:
    registry, _ = registry_of()
    prefix = cache_of(registry)
    entry = up(registry, "e0")
    # 2,048 blocks of 16 tokens, at 4 characters a token: 2,048 index blocks of 64.
    scraped(entry.health, hits=0, queries=0, blocks=2048)
    prefix.follow(entry)
    assert prefix.engines["e0"].index.capacity == 2048
    warm(prefix, registry, "e0", FIRST_TURN)
    assert len(prefix.engines["e0"].index) == len(placement(prefix, FIRST_TURN).prefix.hashes)
    scraped(entry.health, hits=5000, queries=9000, blocks=2048)
    prefix.follow(entry)
    assert prefix.cached_tokens(entry, placement(prefix, SECOND_TURN)) > 0
    # Its counters went back: it restarted, and what it had cached is gone.
    scraped(entry.health, hits=0, queries=300, blocks=2048)
    prefix.follow(entry)
    assert prefix.cached_tokens(entry, placement(prefix, SECOND_TURN)) == 0
    # A smaller cache after the restart: the index shrinks with it (at the characters
    # a token the fleet's prompts have shown, about 4 here).
    scraped(entry.health, hits=0, queries=600, blocks=8)
    prefix.follow(entry)
    assert 3.9 < prefix.chars_per_token < 4.1
    assert prefix.engines["e0"].index.capacity == int(8 * 16 * prefix.chars_per_token // 64)


def test_memory_is_bounded_by_the_configured_cap_whatever_the_engine_reports() -> None:
    registry, _ = registry_of()
    prefix = PrefixCache(list(registry.entries), block_chars=64, max_blocks=100)
    entry = up(registry, "e0")
    scraped(entry.health, hits=0, queries=0, blocks=10**9)
    for topic in range(20):
        body = chat(("system", f"Topic {topic}. " * 500), ("user", "?"))
        prefix.placed(entry, placement(prefix, body), 0)
    assert prefix.engines["e0"].index.capacity == 100
    assert len(prefix.engines["e0"].index) == 100


def test_a_busier_decode_batch_does_not_pull_a_conversation_off_its_history() -> None:
    # Cache-aware placement goes by projected TTFT: e0 streams a little slower with 40
    # sequences decoding, but its first token comes far sooner for this conversation.
    registry, book = registry_of()
    prefix = cache_of(registry)
    scheduler = Scheduler(registry, ProjectingScorer(book, prefix=prefix), prefix=prefix)
    warm(prefix, registry, "e0", FIRST_TURN)
    registry.entries["e0"].load.decoding = 40
    registry.entries["e0"].load.decode_bound = 40
    plan = scheduler.plan(placement(prefix, SECOND_TURN))
    assert plan is not None and plan.decode.name == "e0"
    # Placement by load (no prefix cache) weighs the slower decoding and goes to e1.
    plan = Scheduler(registry, ProjectingScorer(book)).plan(placement(prefix, SECOND_TURN))
    assert plan is not None and plan.decode.name == "e1"


def test_an_engine_that_does_not_cache_prefixes_is_priced_for_the_whole_prompt() -> None:
    registry, _ = registry_of()
    prefix = cache_of(registry)
    entry = up(registry, "e0")
    warm(prefix, registry, "e0", FIRST_TURN)
    assert prefix.cached_tokens(entry, placement(prefix, SECOND_TURN)) > 0
    entry.health.record_scrape(
        EngineScrape(1.0, 0.0, 0.1, 0.0, 0.0, block_size=16, num_gpu_blocks=8192,
                     prefix_caching=False),
        0.0,
    )  # fmt: skip
    assert prefix.cached_tokens(entry, placement(prefix, SECOND_TURN)) == 0


def test_for_a_prefill_decode_pair_the_prefill_engine_cache_counts() -> None:
    roles = (("p0", "prefill"), ("p1", "prefill"), ("d0", "decode"))
    registry, book = registry_of(roles=roles)
    prefix = cache_of(registry)
    scheduler = Scheduler(registry, ProjectingScorer(book, prefix=prefix), prefix=prefix)
    warm(prefix, registry, "p1", FIRST_TURN)
    plan = scheduler.plan(placement(prefix, SECOND_TURN))
    assert plan is not None and plan.prefill is not None
    assert plan.prefill.name == "p1" and plan.decode.name == "d0"
    assert plan.cached_tokens > 7800
    # The decode engine's index is not written: it never computes the prompt.
    assert len(prefix.engines["d0"].index) == 0
