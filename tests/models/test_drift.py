"""Drift scores rise when an engine slows, come back when it recovers, stay finite."""

from __future__ import annotations

import math

import pytest

from narwhal.models.drift import DriftScore


def test_rises_to_the_slowdown_and_comes_back() -> None:
    drift = DriftScore()
    for _ in range(50):
        drift.add(0.010, 0.010)
    assert drift.score == pytest.approx(0.0, abs=1e-9)
    for _ in range(60):
        drift.add(0.020, 0.010)
    assert drift.score == pytest.approx(math.log(2), rel=0.01)
    for _ in range(80):
        drift.add(0.010, 0.010)
    assert abs(drift.score) < 0.01


def test_needs_a_few_samples_before_it_counts() -> None:
    drift = DriftScore(min_samples=8)
    for _ in range(7):
        drift.add(1.0, 0.01)
    assert drift.score == 0.0
    drift.add(1.0, 0.01)
    assert drift.score > 0


def test_absurd_samples_stay_finite_and_are_recovered_from() -> None:
    drift = DriftScore()
    for observed in (600.0, 1e-9, -1.0, 0.0, math.inf, math.nan):
        drift.add(observed, 0.01)  # a 10-minute stall, a clock jump, garbage
    assert math.isfinite(drift.value) and abs(drift.value) <= math.log(10)
    for _ in range(100):
        drift.add(0.01, 0.01)
    assert abs(drift.value) < 0.01
