"""Calibration of the text estimate from the engines' own counts."""

from __future__ import annotations

import pytest

from narwhal.sizing.calibration import MAX_RATIO, MIN_RATIO, EstimateCalibration


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
