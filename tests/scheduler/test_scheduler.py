"""Placement decisions, sans-IO: eligibility, scoring, ties, limits, P/D pairs, retries."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from narwhal.config import EngineConfig, EnginePhaseConcurrency
from narwhal.fleet.scrape import EngineScrape
from narwhal.fleet.state import EngineHealth
from narwhal.scheduler.placement import EngineLoad, InFlightScorer, PlacementRequest
from narwhal.scheduler.registry import EngineEntry, EngineRegistry
from narwhal.scheduler.scheduler import NoCapacity, Scheduler


def engine(name: str, role: str = "both", **extra: Any) -> EngineConfig:
    return EngineConfig(name=name, url=f"http://127.0.0.1/{name}", role=role, **extra)  # type: ignore[arg-type]


def scheduler(*engines: EngineConfig, healthy: set[str] | None = None, **kw: Any) -> Scheduler:
    registry = EngineRegistry(engines, lambda n: healthy is None or n in healthy)
    return Scheduler(registry, rng=random.Random(1), **kw)


def request(prompt_tokens: int) -> PlacementRequest:
    return PlacementRequest.sized("chat", prompt_tokens)


def test_cheapest_engine_wins() -> None:
    s = scheduler(engine("a"), engine("b"))
    s.registry.entries["a"].load.decoding = 3
    plan = s.plan(request(100))
    assert plan is not None and plan.decode.name == "b" and plan.prefill is None


def test_ties_are_broken_at_random_not_always_the_first() -> None:
    s = scheduler(engine("a"), engine("b"), engine("c"))
    picks = Counter(s.plan(request(10)).decode.name for _ in range(300))  # type: ignore[union-attr]
    assert set(picks) == {"a", "b", "c"} and min(picks.values()) > 50


def test_prefill_work_and_engine_metrics_count() -> None:
    scorer = InFlightScorer(prompt_tokens_per_request=1000)
    busy = EngineEntry(engine("x"), EngineLoad(prefilling=1, prefill_tokens=4000))
    assert scorer.cost(busy, request(0), "both") == 5
    # The engine sees more work than Narwhal placed (another router's): it counts too.
    health = EngineHealth(stale_after_s=5)
    health.record_scrape(EngineScrape(running=6, waiting=2, kv_usage=0.1), 0.0, own=1)
    seen = EngineEntry(engine("x"), EngineLoad(decoding=1), health=health)
    assert scorer.cost(seen, request(0), "both") == 8


def test_a_request_finished_since_the_scrape_is_not_taken_for_someone_elses() -> None:
    # The scrape caught Narwhal's one request running; it has finished since. Read against
    # today's count (none), the engine would look busy with another router's request.
    scorer = InFlightScorer(prompt_tokens_per_request=1000)
    health = EngineHealth(stale_after_s=5)
    health.record_scrape(EngineScrape(running=1, waiting=0, kv_usage=0.1), 0.0, own=1)
    idle = EngineEntry(engine("x"), EngineLoad(), health=health)
    assert scorer.cost(idle, request(0), "both") == 0
    assert idle.unplaced() == (0.0, 0.0)
    # Narwhal's queued requests the engine shows waiting are not counted twice either.
    health.record_scrape(EngineScrape(running=1, waiting=2, kv_usage=0.1), 1.0, own=3)
    queued = EngineEntry(engine("x"), EngineLoad(prefilling=3), health=health)
    assert queued.unplaced() == (0.0, 0.0)
    assert scorer.cost(queued, request(0), "both") == 3


def test_ineligible_engines_are_never_chosen() -> None:
    s = scheduler(
        engine("up"),
        engine("down"),
        engine("drained"),
        engine("w", wave=2),
        healthy={"up", "drained", "w"},
    )
    s.registry.set_drained("drained", True)
    s.registry.set_wave(2, True)
    for _ in range(50):
        assert s.plan(request(1)).decode.name == "up"  # type: ignore[union-attr]
    assert [s.registry.state(e) for e in s.registry.entries.values()] == [
        "up",
        "down",
        "drained",
        "maintenance",
    ]


def test_no_eligible_engine_is_none() -> None:
    s = scheduler(engine("a"), healthy=set())
    assert s.plan(request(1)) is None and not s.has_path()


def test_retry_goes_to_another_engine_and_never_back() -> None:
    s = scheduler(engine("a"), engine("b"))
    assert s.plan(request(1), exclude={"a"}).decode.name == "b"  # type: ignore[union-attr]
    assert s.plan(request(1), exclude={"a", "b"}) is None


def test_engines_at_their_own_limit_make_the_request_wait() -> None:
    limited = engine("a", phase_concurrency=EnginePhaseConcurrency(prefill=1, decode=2))
    s = scheduler(limited)
    load = s.registry.entries["a"].load
    load.prefilling = load.decode_bound = 1
    with pytest.raises(NoCapacity):
        s.plan(request(1))
    load.prefilling = 0  # prefill done; the decode place is still held
    assert s.plan(request(1)) is not None
    load.decode_bound = 2  # one decoding, one still in prefill elsewhere: full
    with pytest.raises(NoCapacity):
        s.plan(request(1))


def test_disaggregated_pair_when_prefill_and_decode_engines_are_eligible() -> None:
    s = scheduler(
        engine("p0", "prefill"), engine("d0", "decode"), engine("d1", "decode"), engine("b0")
    )
    s.registry.entries["d0"].load.decoding = 5
    plan = s.plan(request(100))
    assert plan is not None and plan.prefill is not None
    assert (plan.prefill.name, plan.decode.name) == ("p0", "d1")


def test_both_engines_serve_when_no_pair_is_eligible() -> None:
    s = scheduler(
        engine("p0", "prefill"), engine("d0", "decode"), engine("b0"), healthy={"p0", "b0"}
    )
    plan = s.plan(request(1))
    assert plan is not None and plan.prefill is None and plan.decode.name == "b0"


def test_no_eligible_decode_engine_is_none_even_while_the_prefill_engines_are_full() -> None:
    # Whether any engine is left decides before whether one has room: a request that no
    # engine can serve must not wait for a slot it could never use.
    s = scheduler(
        engine("p0", "prefill", phase_concurrency=EnginePhaseConcurrency(prefill=1)),
        engine("d0", "decode"),
    )
    s.registry.entries["p0"].load.prefilling = 1
    with pytest.raises(NoCapacity):
        s.plan(request(1))
    assert s.plan(request(1), exclude={"d0"}) is None
    assert not s.could_place({"d0"})


def test_a_both_engine_serves_when_the_pair_has_no_decode_engine_left() -> None:
    s = scheduler(
        engine("p0", "prefill", phase_concurrency=EnginePhaseConcurrency(prefill=1)),
        engine("d0", "decode"),
        engine("b0"),
    )
    s.registry.entries["p0"].load.prefilling = 1
    plan = s.plan(request(1), exclude={"d0"})
    assert plan is not None and plan.prefill is None and plan.decode.name == "b0"


def test_round_robin_policy_rotates() -> None:
    s = scheduler(engine("a"), engine("b"), round_robin=True)
    s.registry.entries["a"].load.decoding = 100  # load is ignored
    names = [s.plan(request(1)).decode.name for _ in range(4)]  # type: ignore[union-attr]
    assert names == ["a", "b", "a", "b"]


def test_whole_fleet_maintenance() -> None:
    s = scheduler(engine("a", wave=1), engine("b", wave=2))
    s.registry.set_wave(1, True)
    assert not s.registry.whole_fleet_in_maintenance()
    s.registry.set_wave(2, True)
    assert s.registry.whole_fleet_in_maintenance()
