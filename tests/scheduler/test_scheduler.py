"""Placement decisions, sans-IO: eligibility, scoring, ties, limits, P/D pairs, retries."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from narwhal.config import EngineConfig, EnginePhaseConcurrency
from narwhal.scheduler.placement import EngineLoad, InFlightScorer
from narwhal.scheduler.registry import EngineRegistry
from narwhal.scheduler.scheduler import NoCapacity, Scheduler


def engine(name: str, role: str = "both", **extra: Any) -> EngineConfig:
    return EngineConfig(name=name, url=f"http://127.0.0.1/{name}", role=role, **extra)  # type: ignore[arg-type]


def scheduler(*engines: EngineConfig, healthy: set[str] | None = None, **kw: Any) -> Scheduler:
    registry = EngineRegistry(engines, lambda n: healthy is None or n in healthy)
    return Scheduler(registry, rng=random.Random(1), **kw)


def test_cheapest_engine_wins() -> None:
    s = scheduler(engine("a"), engine("b"))
    s.registry.entries["a"].load.decoding = 3
    plan = s.plan(100)
    assert plan is not None and plan.decode.config.name == "b" and plan.prefill is None


def test_ties_are_broken_at_random_not_always_the_first() -> None:
    s = scheduler(engine("a"), engine("b"), engine("c"))
    picks = Counter(s.plan(10).decode.config.name for _ in range(300))  # type: ignore[union-attr]
    assert set(picks) == {"a", "b", "c"} and min(picks.values()) > 50


def test_prefill_work_and_engine_metrics_count() -> None:
    scorer = InFlightScorer(prompt_tokens_per_request=1000)
    assert scorer.cost(EngineLoad("x", prefilling=1, prefill_tokens=4000), 0) == 5
    # The engine sees more running work than Narwhal placed (another router): use it.
    assert scorer.cost(EngineLoad("x", decoding=1, engine_running=6, engine_waiting=2), 0) == 8


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
        assert s.plan(1).decode.config.name == "up"  # type: ignore[union-attr]
    assert [s.registry.state(e) for e in s.registry.entries.values()] == [
        "up",
        "down",
        "drained",
        "maintenance",
    ]


def test_no_eligible_engine_is_none() -> None:
    s = scheduler(engine("a"), healthy=set())
    assert s.plan(1) is None and not s.has_path()


def test_retry_goes_to_another_engine_and_never_back() -> None:
    s = scheduler(engine("a"), engine("b"))
    assert s.plan(1, exclude={"a"}).decode.config.name == "b"  # type: ignore[union-attr]
    assert s.plan(1, exclude={"a", "b"}) is None


def test_engines_at_their_own_limit_make_the_request_wait() -> None:
    limited = engine("a", phase_concurrency=EnginePhaseConcurrency(prefill=1))
    s = scheduler(limited)
    s.registry.entries["a"].load.prefilling = 1
    with pytest.raises(NoCapacity):
        s.plan(1)


def test_disaggregated_pair_when_prefill_and_decode_engines_are_eligible() -> None:
    s = scheduler(
        engine("p0", "prefill"), engine("d0", "decode"), engine("d1", "decode"), engine("b0")
    )
    s.registry.entries["d0"].load.decoding = 5
    plan = s.plan(100)
    assert plan is not None and plan.prefill is not None
    assert (plan.prefill.config.name, plan.decode.config.name) == ("p0", "d1")


def test_both_engines_serve_when_no_pair_is_eligible() -> None:
    s = scheduler(
        engine("p0", "prefill"), engine("d0", "decode"), engine("b0"), healthy={"p0", "b0"}
    )
    plan = s.plan(1)
    assert plan is not None and plan.prefill is None and plan.decode.config.name == "b0"


def test_round_robin_policy_rotates() -> None:
    s = scheduler(engine("a"), engine("b"), round_robin=True)
    s.registry.entries["a"].load.decoding = 100  # load is ignored
    names = [s.plan(1).decode.config.name for _ in range(4)]  # type: ignore[union-attr]
    assert names == ["a", "b", "a", "b"]


def test_whole_fleet_maintenance() -> None:
    s = scheduler(engine("a", wave=1), engine("b", wave=2))
    s.registry.set_wave(1, True)
    assert not s.registry.whole_fleet_in_maintenance()
    s.registry.set_wave(2, True)
    assert s.registry.whole_fleet_in_maintenance()
