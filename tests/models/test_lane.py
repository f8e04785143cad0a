"""The prefill lane: FIFO backlog and the departure rule for measured service times."""

from __future__ import annotations

import pytest

from narwhal.models.lane import PrefillLane


def test_backlog_is_the_work_ahead_less_what_the_head_has_had() -> None:
    lane = PrefillLane()
    assert lane.remaining(0.0) == 0.0
    lane.add("a", 0.4, 0.0)
    lane.add("b", 0.2, 0.1)
    assert lane.remaining(0.1) == pytest.approx(0.5)  # a has had 0.1 of its 0.4
    assert lane.remaining(0.5) == pytest.approx(0.2)  # a is overdue: only b is counted
    assert lane.finish("a", 0.45) == pytest.approx(0.45)
    # b has been served since a finished
    assert lane.remaining(0.55) == pytest.approx(0.1)
    assert lane.finish("b", 0.7) == pytest.approx(0.25)
    assert lane.remaining(0.7) == 0.0 and len(lane) == 0


def test_departure_rule_sums_to_the_busy_time_whatever_the_batching() -> None:
    lane = PrefillLane()
    for i, key in enumerate("abcd"):
        lane.add(key, 0.1, 0.0 + 0.001 * i)
    # The engine finished a and b together at 0.2 and c and d together at 0.4.
    services = [lane.finish(k, t) for k, t in (("a", 0.2), ("b", 0.2), ("c", 0.4), ("d", 0.4))]
    assert sum(s for s in services if s is not None) == pytest.approx(0.4)


def test_a_request_placed_on_an_idle_engine_is_timed_from_its_placement() -> None:
    lane = PrefillLane()
    lane.add("a", 0.1, 0.0)
    lane.finish("a", 0.1)
    lane.add("b", 0.1, 5.0)
    assert not lane.waited("b", 5.0)
    assert lane.finish("b", 5.08) == pytest.approx(0.08)


def test_removed_work_leaves_no_residue() -> None:
    lane = PrefillLane()
    lane.add("a", 0.3, 0.0)
    lane.add("b", 0.3, 0.0)
    lane.remove("a")
    lane.remove("b")
    lane.remove("never")
    assert lane.remaining(0.0) == 0.0 and lane.finish("a", 1.0) is None
