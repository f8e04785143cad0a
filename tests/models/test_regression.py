"""The anchored online least-squares fit: converges, forgets, stays at the prior where
the data say nothing, and ignores what is not a number."""

from __future__ import annotations

import math
import random

import pytest

from narwhal.models.regression import AnchoredLeastSquares


def test_converges_on_a_noisy_line() -> None:
    rng = random.Random(3)
    fit = AnchoredLeastSquares((0.0, 0.0), (1.0, 1.0), half_life=10_000)
    for _ in range(2000):
        x = rng.uniform(0.1, 4.0)
        fit.update((1.0, x), 0.01 + 0.05 * x + rng.gauss(0, 0.002))
    a, b = fit.theta
    assert a == pytest.approx(0.01, abs=5e-4)
    assert b == pytest.approx(0.05, abs=3e-4)


def test_an_unexcited_direction_stays_at_its_prior() -> None:
    """Every prompt the same length: the slope cannot be learned, so it must not wander
    (plain RLS with forgetting would let its uncertainty grow without bound)."""
    rng = random.Random(5)
    fit = AnchoredLeastSquares((0.01, 0.05), (8.0, 8.0), half_life=50)
    for _ in range(5000):
        fit.update((1.0, 1.0), 0.09 + rng.gauss(0, 0.001))
    a, b = fit.theta
    assert a + b == pytest.approx(0.09, abs=1e-3)  # the one thing the data say
    assert 0.0 < b < 0.09 and math.isfinite(a)


def test_forgets_an_old_regime() -> None:
    fit = AnchoredLeastSquares((0.0,), (1.0,), half_life=20)
    for _ in range(200):
        fit.update((1.0,), 1.0)
    for _ in range(200):
        fit.update((1.0,), 2.0)
    assert fit.predict((1.0,)) == pytest.approx(2.0, rel=0.01)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_numbers_change_nothing(bad: float) -> None:
    fit = AnchoredLeastSquares((0.5, 0.1), (1.0, 1.0))
    fit.update((1.0, 2.0), 0.7)
    before = list(fit.theta)
    assert not fit.update((1.0, 2.0), bad)
    assert not fit.update((1.0, bad), 0.7)
    assert not fit.update((1.0, 2.0), 0.7, weight=0.0)
    assert fit.theta == before and fit.samples == 1


def test_reset_starts_from_a_new_prior() -> None:
    fit = AnchoredLeastSquares((0.0, 0.0), (1.0, 1.0))
    for _ in range(100):
        fit.update((1.0, 1.0), 5.0)
    fit.reset((0.3, 0.2))
    assert fit.theta == [0.3, 0.2] and fit.samples == 0


def test_memory_does_not_grow_with_samples() -> None:
    fit = AnchoredLeastSquares((0.0, 0.0, 0.0, 0.0), (1.0, 1.0, 1.0, 1.0))
    sizes = []
    for n in range(3000):
        fit.update((1.0, n % 7, (n % 7) ** 2, n % 3), float(n % 11))
        if n in (100, 2999):
            sizes.append((len(fit._sxx), len(fit._sxy), len(fit.theta)))
    assert sizes[0] == sizes[1] == (4, 4, 4)
