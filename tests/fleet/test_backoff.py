"""The probe schedule (narwhal.fleet.backoff), with a seeded generator."""

from __future__ import annotations

import random

import pytest

from narwhal.fleet.backoff import backoff_factor, next_delay


def test_factor_doubles_from_the_second_failure_up_to_four() -> None:
    assert [backoff_factor(n) for n in range(7)] == [1, 1, 2, 4, 4, 4, 4]


def test_seeded_schedule_is_exact() -> None:
    rng = random.Random(7)
    check = random.Random(7)
    delays = [next_delay(0.5, n, rng) for n in range(6)]
    expected = [0.5 * f * check.uniform(0.9, 1.1) for f in (1, 1, 2, 4, 4, 4)]
    assert delays == expected


@pytest.mark.parametrize("failures", [0, 1, 2, 3, 10])
def test_jitter_stays_within_ten_percent(failures: int) -> None:
    rng = random.Random(1)
    base = 2.0 * backoff_factor(failures)
    delays = [next_delay(2.0, failures, rng) for _ in range(2000)]
    assert all(0.9 * base <= d <= 1.1 * base for d in delays)
    # It is actually jittered, both ways.
    assert min(delays) < 0.95 * base < 1.05 * base < max(delays)


def test_a_recovered_engine_waits_at_most_about_four_intervals() -> None:
    rng = random.Random(3)
    assert max(next_delay(1.0, 1000, rng) for _ in range(1000)) <= 4.4
