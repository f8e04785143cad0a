"""The projection and its bound against engines that schedule differently from the one
it was first designed on (`narwhal sim --prefill-discipline`), in virtual time: the
router's decision core driving each engine's step model (tests/closed_loop.py).

Targets (the issue's, on every discipline): at least 99% of admitted requests within the
budget at 3x capacity; in a step from 0.2x to 3x, at least 98% of the requests admitted
in the overload's first 10 s within it; the bound exceeded by few admitted requests
(at most 2% here: runs of 30 s leave a 1% target within the noise of a few requests);
at half capacity, where open admission keeps every request within the budget, at most 2%
refused; and goodput at 3x no lower than 90% of goodput at 1x.
"""

from __future__ import annotations

from typing import Final

import pytest

from tests.closed_loop import (
    DISCIPLINES,
    OUTPUTS,
    PROMPTS,
    ClosedLoop,
    Record,
    capacity,
    poisson,
    summarize,
)

BUDGET: Final = 1.0
BASE: Final = DISCIPLINES["chunked-8192"]
# (sequential has a test of its own: its capacity is a request and a half a second)
ENGINES: Final = {name: options for name, options in DISCIPLINES.items() if name != "sequential"}
_capacities: dict[str, float] = {}


def run(
    name: str, level: float, seconds: float, *, policy: str = "predictive", seed: int = 1
) -> tuple[list[Record], float]:
    options = ENGINES[name]
    if name not in _capacities:
        _capacities[name] = capacity(options, PROMPTS, OUTPUTS)
    loop = ClosedLoop([options], budget=BUDGET, policy=policy)  # type: ignore[arg-type]
    loop.profile()
    start = loop.now + 1.0
    rate = _capacities[name] * level
    return loop.run(poisson(rate, seconds, PROMPTS, OUTPUTS, seed=seed, start=start)), start


@pytest.mark.parametrize("name", list(ENGINES))
def test_at_three_times_capacity_admitted_requests_meet_the_budget(name: str) -> None:
    records, _ = run(name, 3.0, 30.0)
    summary = summarize(records, BUDGET, 30.0)
    assert summary.within_share >= 0.99, summary.line()
    # (30 s at 3x admit some 500 requests, the bound's learning among them: the 1% the
    # benchmark measures over a minute, plus five requests)
    assert summary.over_bound_share <= 0.02, summary.line()
    light, _ = run(name, 1.0, 30.0)
    assert summary.goodput >= 0.9 * summarize(light, BUDGET, 30.0).goodput, summary.line()


@pytest.mark.parametrize("name", list(ENGINES))
def test_the_onset_of_an_overload_is_not_over_admitted(name: str) -> None:
    """0.2x for 10 s, then 3x in one step: the first seconds are where the promise is
    kept or broken, while what the model learned at light load is all it has."""
    options = ENGINES[name]
    if name not in _capacities:
        _capacities[name] = capacity(options, PROMPTS, OUTPUTS)
    rate = _capacities[name]
    loop = ClosedLoop([options], budget=BUDGET)
    loop.profile()
    start = loop.now + 1.0
    arrivals = poisson(0.2 * rate, 10.0, PROMPTS, OUTPUTS, seed=3, start=start)
    arrivals += poisson(3.0 * rate, 20.0, PROMPTS, OUTPUTS, seed=4, start=start + 10.0)
    records = loop.run(arrivals)
    first = [r for r in records if start + 10.0 <= r.arrival.at < start + 20.0]
    summary = summarize(first, BUDGET, 10.0)
    assert summary.admitted > 0.2 * len(first), summary.line()  # it does admit
    assert summary.within_share >= 0.98, summary.line()


@pytest.mark.parametrize("name", list(ENGINES))
def test_at_half_capacity_little_is_refused_where_open_admission_would_serve_all(
    name: str,
) -> None:
    open_records, _ = run(name, 0.5, 40.0, policy="open")
    assert summarize(open_records, BUDGET, 40.0).within_share >= 0.99
    records, _ = run(name, 0.5, 40.0)
    summary = summarize(records, BUDGET, 40.0)
    assert summary.refused_share <= 0.02, summary.line()
    assert summary.within_share >= 0.99, summary.line()


def test_an_engine_without_continuous_batching_is_held_to_its_one_request_at_a_time() -> None:
    """`transformers serve`'s default: one request in the engine at a time, its whole
    output before the next prefill. The probes sent together show it (the engine model
    then waits for each request ahead to finish, and bounds that wait by the spread of
    their output lengths), and the budget holds at 3x. Capacity is a request and a half
    a second: 60 s at 3x admits some 60 requests, so one miss is more than a percent."""
    options = DISCIPLINES["sequential"]
    rate = capacity(options, PROMPTS, OUTPUTS)
    loop = ClosedLoop([options], budget=BUDGET)
    loop.profile()
    model = loop.book.model("e0") if loop.book is not None else None
    assert model is not None and model.one_at_a_time
    start = loop.now + 1.0
    records = loop.run(poisson(3.0 * rate, 60.0, PROMPTS, OUTPUTS, seed=1, start=start))
    summary = summarize(records, BUDGET, 60.0)
    assert summary.within_share >= 0.98, summary.line()
    assert summary.over_bound_share <= 0.035, summary.line()
    light_loop = ClosedLoop([options], budget=BUDGET)
    light_loop.profile()
    at = light_loop.now + 1.0
    light = summarize(
        light_loop.run(poisson(rate, 60.0, PROMPTS, OUTPUTS, seed=1, start=at)), BUDGET, 60.0
    )
    assert light.admitted > 0.3 * light.offered, light.line()
    assert summary.goodput >= 0.9 * light.goodput, (summary.line(), light.line())


@pytest.mark.parametrize("name", ["chunked-8192", "serial", "sglang"])
def test_an_engine_that_slows_down_midway_is_followed_within_seconds(name: str) -> None:
    """At 1.5x, the engine's prefill halves in speed 20 s in (another tenant on the GPU,
    thermal throttling): what the model learned is wrong at once, and the prompts waiting
    show it before any first token does. Requests admitted in the second after the change
    were priced at the old speed (on the serial engine, nine of about twenty); from two
    seconds on the projection has followed."""
    options = ENGINES[name]
    if name not in _capacities:
        _capacities[name] = capacity(options, PROMPTS, OUTPUTS)
    loop = ClosedLoop([options], budget=BUDGET)
    loop.profile()
    start = loop.now + 1.0

    def slow_down(loop: ClosedLoop) -> None:
        engine = loop.runs["e0"].engine
        engine.prefill_rate /= 2.0
        engine.base_s *= 2.0

    loop.at(start + 20.0, slow_down)
    rate = 1.5 * _capacities[name]
    records = loop.run(poisson(rate, 40.0, PROMPTS, OUTPUTS, seed=5, start=start))
    after = [r for r in records if start + 22.0 <= r.arrival.at < start + 32.0]
    summary = summarize(after, BUDGET, 10.0)
    assert summary.admitted > 0.15 * len(after), summary.line()
    assert summary.within_share >= 0.99, summary.line()
    assert summarize(records, BUDGET, 40.0).within_share >= 0.97
