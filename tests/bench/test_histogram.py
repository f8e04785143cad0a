"""The log histogram that holds inter-token gaps: exact counts and extremes, percentiles
within half a bin of the exact ones, zeros kept exactly 0."""

from __future__ import annotations

import math
import random

import pytest

from narwhal.bench.histogram import HIGH_S, LOW_S, LogHistogram, bin_edges, bin_index
from narwhal.bench.stats import percentile

HALF_BIN = 10 ** (1 / 200) - 1  # relative half-width of a bin: about 1.16%


def test_empty_is_nan_and_has_no_points() -> None:
    h = LogHistogram()
    assert h.count == 0 and h.zeros == 0
    assert math.isnan(h.mean) and math.isnan(h.percentile(50))
    assert math.isnan(h.min) and math.isnan(h.max)
    assert h.cumulative() == []


def test_percentiles_are_within_half_a_bin_of_the_exact_ones() -> None:
    rng = random.Random(7)
    values = [rng.lognormvariate(math.log(0.02), 1.0) for _ in range(5000)]
    h = LogHistogram()
    h.add_all(values[:2500])
    for v in values[2500:]:
        h.add(v)
    exact = sorted(values)
    assert h.count == 5000
    assert h.mean == pytest.approx(math.fsum(values) / 5000, rel=1e-12)
    assert (h.min, h.max) == (exact[0], exact[-1])
    for p in (1, 10, 50, 90, 95, 99, 99.9):
        assert h.percentile(p) == pytest.approx(percentile(exact, p), rel=HALF_BIN), p
    assert h.percentile(0) == exact[0] and h.percentile(100) == exact[-1]


def test_equal_values_and_zeros_are_exact() -> None:
    h = LogHistogram()
    h.add_all([0.0125] * 9, zeros=3)
    assert (h.count, h.zeros) == (12, 3)
    # rank 11 * p / 100: positions 0-2 hold the zeros, 3-11 the others, each exact (its
    # bin's middle is clamped to the extremes above 0, here equal)
    assert h.percentile(0) == h.percentile(18) == 0.0
    assert h.percentile(25) == pytest.approx(0.75 * 0.0125)  # rank 2.75
    assert h.percentile(50) == h.percentile(99) == 0.0125
    assert h.mean == pytest.approx(0.0125 * 9 / 12)
    (point,) = h.cumulative()
    assert point == (0.0125, 1.0)  # its bin's edge clamped to the maximum


def test_values_outside_the_range_and_nan() -> None:
    h = LogHistogram()
    h.add(LOW_S / 10)
    h.add(HIGH_S * 10)
    h.add(math.nan)  # skipped
    h.add(-1.0)  # a clock cannot go back: counted as 0
    assert (h.count, h.zeros) == (3, 1)
    assert (h.min, h.max) == (0.0, HIGH_S * 10)
    assert h.percentile(100) == HIGH_S * 10
    assert bin_index(LOW_S / 10) == 0 and bin_index(HIGH_S * 10) == bin_index(HIGH_S * 0.999)


def test_bins_cover_the_range_in_order() -> None:
    for value in (1e-6, 3.3e-5, 0.001, 0.0173, 1.0, 42.0, 999.0):
        low, high = bin_edges(bin_index(value))
        assert low <= value < high, value
        assert high / low == pytest.approx(10 ** (1 / 100))


def test_cumulative_is_a_cdf() -> None:
    h = LogHistogram()
    h.add_all([0.001, 0.002, 0.002, 0.5], zeros=4)
    points = h.cumulative()
    assert [y for _, y in points] == [0.625, 0.875, 1.0]
    assert [x for x, _ in points] == sorted(x for x, _ in points)
    assert points[-1][0] == 0.5
