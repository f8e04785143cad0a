"""The prefill lane, a twin of a chunked-prefill scheduler: steps, the budget's chunks,
first tokens at step ends, and projections that follow the steps."""

from __future__ import annotations

import pytest

from narwhal.models.lane import PrefillLane, StepCosts

# 8,192 tokens a step, 6 ms a step, 50 us a token, 2 ms a prompt started.
COSTS = StepCosts(budget=8192, base=0.006, per_token=50e-6, per_prompt=0.002)


def test_an_idle_engine_starts_a_step_for_the_prompt_at_once() -> None:
    lane = PrefillLane()
    first_token, ahead = lane.project(1000, 0.0, COSTS, arrivals=0.0)
    assert first_token == pytest.approx(0.006 + 0.05 + 0.002)
    assert ahead == pytest.approx(0.0)


def test_a_prompt_waits_for_the_step_in_progress_then_shares_the_next() -> None:
    lane = PrefillLane()
    lane.add("a", 4000, 0.0)  # a step starts for it: 0.006 + 0.2 + 0.002 = 0.208 s
    lane.add("b", 2000, 0.05)  # waits for the next step
    first_token, ahead = lane.project(1000, 0.1, COSTS, arrivals=0.0)
    # 0.108 s left of a's step, then one step with b and this prompt
    expected = 0.108 + 0.006 + 3000 * 50e-6 + 2 * 0.002
    assert first_token == pytest.approx(expected)
    assert ahead == pytest.approx(expected - (0.006 + 0.05 + 0.002))


def test_prompts_expected_before_the_step_starts_stretch_it() -> None:
    lane = PrefillLane()
    lane.add("a", 4000, 0.0)
    quiet, _ = lane.project(1000, 0.1, COSTS, arrivals=0.0)
    busy, _ = lane.project(1000, 0.1, COSTS, arrivals=10_000.0)  # tokens/s
    # 0.108 s until the next step starts: 1,080 more tokens join it, 54 ms
    assert busy - quiet == pytest.approx(1080 * 50e-6)


def test_more_than_a_budget_ahead_takes_more_steps() -> None:
    lane = PrefillLane()
    for i in range(5):
        lane.add(i, 4000, 0.0)  # one step: 8,192 of the 20,000 tokens
    first_token, _ = lane.project(1000, 0.0, COSTS, arrivals=0.0)
    in_step = 0.006 + 8192 * 50e-6 + 5 * 0.002
    # 11,808 left plus 1,000: two more steps (the prompts started already cost nothing more)
    later = 2 * 0.006 + 12_808 * 50e-6 + 1 * 0.002
    assert first_token == pytest.approx(in_step + later)


def test_a_step_end_credits_the_chunk_it_prefilled_of_the_next_prompt() -> None:
    lane = PrefillLane()
    lane.add("a", 5000, 0.0)
    lane.add("b", 5000, 0.0)
    lane.add("c", 5000, 0.1)  # after the step began
    assert lane.finish("a", 0.42, COSTS.budget) == pytest.approx(0.42)
    # The step had 8,192 tokens: a's 5,000, then 3,192 of b. c was not in it.
    assert [remaining for _, remaining, _ in lane.prompts()] == [5000 - 3192, 5000]


def test_the_finishes_of_one_step_are_accounted_once() -> None:
    """Each first token of a step arrives on its own; the credit to the prompt after
    them must be the step's budget less all of them, not given again each time."""
    lane = PrefillLane()
    for key, tokens in (("a", 2000), ("b", 2000), ("c", 2000), ("d", 4000)):
        lane.add(key, tokens, 0.0)
    for key, at in (("a", 0.4), ("b", 0.401), ("c", 0.402)):
        lane.finish(key, at, COSTS.budget)
    assert [remaining for _, remaining, _ in lane.prompts()] == [4000 - (8192 - 6000)]


def test_departure_rule_sums_to_the_busy_time_whatever_the_batching() -> None:
    lane = PrefillLane()
    for i, key in enumerate("abcd"):
        lane.add(key, 1000, 0.001 * i)
    finishes = (("a", 0.2), ("b", 0.2), ("c", 0.4), ("d", 0.4))
    services = [lane.finish(key, at, COSTS.budget) for key, at in finishes]
    assert sum(s for s in services if s is not None) == pytest.approx(0.4)
    assert len(lane) == 0


def test_removed_and_unknown_prompts_leave_nothing_behind() -> None:
    lane = PrefillLane()
    lane.add("a", 3000, 0.0)
    lane.add("b", 3000, 0.0)
    lane.remove("a")
    lane.remove("b")
    lane.remove("never")
    assert len(lane) == 0
    assert lane.finish("a", 1.0, COSTS.budget) is None
    assert lane.project(100, 1.0, COSTS, 0.0)[1] == 0.0
