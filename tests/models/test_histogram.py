"""The decayed histogram (output lengths' sketch) and the quantile tracker."""

from __future__ import annotations

import random

import pytest

from narwhal.models.histogram import DecayedHistogram, QuantileTracker


def test_quantiles_within_a_bucket_of_the_truth() -> None:
    rng = random.Random(1)
    histogram = DecayedHistogram(1.0, 1 << 20, half_life=1e9)
    values = sorted(rng.lognormvariate(5, 1) for _ in range(20_000))
    for value in values:
        histogram.add(value)
    for q in (0.1, 0.5, 0.9, 0.99):
        true = values[int(q * len(values))]
        assert histogram.quantile(q) == pytest.approx(true, rel=0.2)  # bucket ratio 2^0.25


def test_decay_follows_a_new_distribution() -> None:
    histogram = DecayedHistogram(1.0, 1 << 20, half_life=200)
    for _ in range(5000):
        histogram.add(10.0)
    for _ in range(2000):
        histogram.add(1000.0)
    assert histogram.quantile(0.5) == pytest.approx(1000.0, rel=0.2)


def test_memory_is_fixed_and_weights_never_overflow() -> None:
    histogram = DecayedHistogram(1.0, 1 << 20, half_life=10)
    size = len(histogram)
    for n in range(100_000):
        histogram.add(float(n % 500 + 1))
    assert len(histogram) == size
    total = sum(weight for _, weight in histogram.weighted())
    assert total == pytest.approx(1.0)


def test_bad_values_are_ignored() -> None:
    histogram = DecayedHistogram(1.0, 100.0)
    for bad in (float("nan"), float("inf"), -3.0):
        histogram.add(bad)
    assert histogram.samples == 0 and histogram.quantile(0.5) is None


@pytest.mark.parametrize("q", [0.5, 0.9, 0.99])
def test_quantile_tracker_settles_on_its_quantile(q: float) -> None:
    rng = random.Random(7)
    tracker = QuantileTracker(q, initial=1.0, step=0.02)
    samples = [rng.lognormvariate(0.3, 0.25) for _ in range(60_000)]
    for value in samples:
        tracker.add(value)
    above = sum(1 for v in samples[-20_000:] if v > tracker.value) / 20_000
    assert above == pytest.approx(1 - q, abs=max(0.01, 0.25 * (1 - q)))


def test_quantile_tracker_is_bounded_and_ignores_non_numbers() -> None:
    tracker = QuantileTracker(0.99, initial=1.0, step=0.5, lowest=0.5, highest=4.0)
    for _ in range(1000):
        tracker.add(1e9)
    assert tracker.value == pytest.approx(4.0)
    for bad in (float("nan"), 0.0, -1.0):
        tracker.add(bad)
    assert tracker.value == pytest.approx(4.0)
