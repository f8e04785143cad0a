"""Calibration of the text estimate from the engines' own counts."""

from __future__ import annotations

import math
import random

import pytest

from narwhal.sizing.calibration import (
    DEFAULT_BOUNDS,
    MAX_RATIO,
    MIN_INTERVAL_TOKENS,
    MIN_RATIO,
    MIN_SAMPLES,
    WINDOW,
    EstimateCalibration,
)


def test_starts_neutral_and_leaves_estimates_as_they_are() -> None:
    calibration = EstimateCalibration()
    assert calibration.ratio("chat") == calibration.ratio("completion") == 1.0
    assert calibration.apply("chat", 123) == 123
    assert calibration.apply("chat", 0) == 1  # at least one token


def test_exact_estimates_keep_the_factor_at_exactly_one() -> None:
    """`narwhal sim` engines count as the estimate does: the factor stays 1, not about 1."""
    calibration = EstimateCalibration()
    for n in (7, 300, 12, 5000, 1):
        calibration.observe("chat", n, n)
    assert calibration.ratio("chat") == 1.0
    assert calibration.apply("chat", 4321) == 4321


def test_converges_to_a_steady_ratio_and_follows_a_change() -> None:
    calibration = EstimateCalibration()
    for n in range(1, 200):
        calibration.observe("completion", 100 + n, round((100 + n) * 1.3))
    assert calibration.ratio("completion") == pytest.approx(1.3, rel=0.01)
    assert calibration.apply("completion", 1000) == pytest.approx(1300, rel=0.01)
    for _ in range(150):
        calibration.observe("completion", 400, 320)
    assert calibration.ratio("completion") == pytest.approx(0.8, rel=0.01)
    assert calibration.ratio("chat") == 1.0  # per route


def test_long_prompts_weigh_more_than_short_ones() -> None:
    calibration = EstimateCalibration()
    calibration.observe("chat", 5000, 6000)  # 1.2 on a long prompt
    calibration.observe("chat", 3, 6)  # 2.0 on a tiny one, mostly rounding
    # An average of the two ratios would be 1.6.
    assert calibration.ratio("chat") == pytest.approx(1.2, abs=0.001)


def test_one_outlier_moves_the_factor_no_further_than_the_clamp() -> None:
    calibration = EstimateCalibration(weight=0.5)
    calibration.observe("chat", 10, 10_000)  # taken as 40
    calibration.observe("chat", 10, 10)
    assert calibration.ratio("chat") == pytest.approx(2.0)  # (0.5·20 + 5) / (0.5·5 + 5)


def test_outliers_are_clamped() -> None:
    calibration = EstimateCalibration(weight=1.0)
    calibration.observe("chat", 10, 10_000)
    assert calibration.ratio("chat") == MAX_RATIO
    calibration.observe("chat", 10_000, 1)
    assert calibration.ratio("chat") == MIN_RATIO
    calibration.observe("chat", 0, 10)  # nothing to learn from
    calibration.observe("chat", 10, 0)
    assert calibration.ratio("chat") == MIN_RATIO
    with pytest.raises(ValueError):
        EstimateCalibration(weight=0)


def test_bounds_are_wide_until_enough_prompts_then_cover_what_the_engines_count() -> None:
    """Engines whose counts are a noisy 0.6 of the estimate (a real model's tokenizer on
    mixed text): learned from the last 512 prompts, the bounds hold the engines' count of
    about 99% of the prompts that follow, and are far narrower than the default."""
    rng = random.Random(7)

    def pair() -> tuple[int, int]:
        estimated = rng.randint(20, 6000)
        return estimated, max(1, round(estimated * 0.6 * math.exp(rng.gauss(0.0, 0.12))))

    calibration = EstimateCalibration()
    for _ in range(MIN_SAMPLES - 1):
        calibration.observe("chat", *pair())
    assert calibration.bounds("chat") == DEFAULT_BOUNDS
    for _ in range(WINDOW):
        calibration.observe("chat", *pair())
    assert calibration.samples("chat") == WINDOW
    low, high = calibration.bounds("chat")
    assert 0.35 < low < 0.5 and 0.7 < high < 0.95, (low, high)
    assert calibration.bounds("completion") == DEFAULT_BOUNDS  # per route
    # Held out: the bounds are frozen here, and 5,000 later prompts checked against them.
    held_out = [pair() for _ in range(5000)]
    inside = 0
    for estimated, engine in held_out:
        tokens, lower, upper = calibration.interval("chat", estimated)
        assert lower <= tokens <= upper
        inside += lower <= engine <= upper
    assert inside / len(held_out) >= 0.98, inside / len(held_out)


def test_bounds_follow_a_change_of_workload_within_the_window() -> None:
    calibration = EstimateCalibration(window=64, min_samples=16)
    for n in range(64):
        calibration.observe("completion", 1000 + n, round((1000 + n) * 0.5))
    assert calibration.bounds("completion") == pytest.approx((0.5, 0.5), abs=0.001)
    for n in range(64):
        calibration.observe("completion", 1000 + n, round((1000 + n) * 1.2))
    assert calibration.bounds("completion") == pytest.approx((1.2, 1.2), abs=0.001)


def test_exact_engines_give_an_exact_interval() -> None:
    """`narwhal sim` counts as the estimate does: once learned, the bounds are the count
    itself, so no decision ever waits for an engine."""
    calibration = EstimateCalibration()
    assert calibration.interval("chat", 1000) == (1000, 300, 1500)  # before: the defaults
    for n in range(MIN_SAMPLES):
        calibration.observe("chat", 17 + n * 37, 17 + n * 37)
    assert calibration.bounds("chat") == (1.0, 1.0)
    assert calibration.interval("chat", 4321) == (4321, 4321, 4321)


def test_short_prompts_teach_the_factor_but_not_the_bounds() -> None:
    calibration = EstimateCalibration(min_samples=1)
    calibration.observe("chat", MIN_INTERVAL_TOKENS - 1, 2 * MIN_INTERVAL_TOKENS)
    assert calibration.samples("chat") == 0 and calibration.ratio("chat") > 1.9
    assert calibration.bounds("chat") == DEFAULT_BOUNDS


def test_quantiles_of_the_central_share() -> None:
    calibration = EstimateCalibration(weight=1.0, window=400, min_samples=400)
    # 400 ratios 0.5025 .. 1.5 in shuffled order: leaving out 1% is 0.5% of the 399 gaps
    # on each side, 1.995 ranks, rounded outwards: the second value from each end.
    ratios = [0.5 + n / 400 for n in range(1, 401)]
    random.Random(3).shuffle(ratios)
    for ratio in ratios:
        calibration.observe("chat", 40_000, round(40_000 * ratio))
    assert calibration.bounds("chat") == pytest.approx((0.505, 1.4975))
    with pytest.raises(ValueError):
        EstimateCalibration(window=8, min_samples=9)
    with pytest.raises(ValueError):
        EstimateCalibration(coverage=0)
