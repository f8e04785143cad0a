"""Output-length learning: predictions from what was served, within the cap, and decode
correction for requests that have run past their expected length."""

from __future__ import annotations

import random

import pytest

from narwhal.models.lengths import DEFAULT_OUTPUT, MIN_SAMPLES, OutputLengths


def test_before_learning_the_default_within_the_cap() -> None:
    lengths = OutputLengths()
    assert lengths.predict("chat", 100, None) == DEFAULT_OUTPUT
    assert lengths.predict("chat", 100, 32) == 32


def test_learns_the_mean_per_route_and_prompt_class() -> None:
    rng = random.Random(2)
    lengths = OutputLengths()
    for _ in range(3000):
        lengths.observe("chat", 100, int(rng.uniform(50, 150)))  # short prompts: ~100
        lengths.observe("chat", 3000, int(rng.uniform(300, 500)))  # long prompts: ~400
        lengths.observe("completion", 100, 16)
    assert lengths.predict("chat", 120, None) == pytest.approx(100, rel=0.08)
    assert lengths.predict("chat", 2500, None) == pytest.approx(400, rel=0.08)
    assert lengths.predict("completion", 100, None) == pytest.approx(16, rel=0.1)
    assert lengths.predict("chat", 2500, 200) == pytest.approx(200, rel=0.02)  # the cap


def test_a_sparse_class_borrows_from_its_route() -> None:
    lengths = OutputLengths()
    for _ in range(MIN_SAMPLES * 5):
        lengths.observe("chat", 100, 64)
    lengths.observe("chat", 20_000, 5000)  # one sample in the largest class
    assert lengths.predict("chat", 20_000, None) < 200


def test_decode_correction_past_the_expected_length() -> None:
    rng = random.Random(4)
    lengths = OutputLengths()
    for _ in range(5000):
        lengths.observe("chat", 100, int(rng.expovariate(1 / 100)) + 1)
    expected = lengths.predict("chat", 100, None)
    assert expected == pytest.approx(100, rel=0.1)
    # Memoryless lengths: a request that has run 300 tokens is expected to go on ~100
    # more, not to end at once.
    assert lengths.remaining("chat", 100, 300, None) == pytest.approx(100, rel=0.3)
    # Past every length seen: half again what it has produced, within its cap.
    assert lengths.remaining("chat", 100, 100_000, None) == pytest.approx(50_000, rel=0.01)
    assert lengths.remaining("chat", 100, 100_000, 100_010) == pytest.approx(10)
    assert lengths.remaining("chat", 100, 64, 64) == 0.0


def test_memory_is_bounded_by_routes_classes_and_buckets() -> None:
    lengths = OutputLengths()
    for n in range(50_000):
        lengths.observe("chat", n % 30_000, n % 7000)
    buckets = {len(h) for classes in lengths._classes.values() for h in classes}
    assert len(buckets) == 1
    assert sum(len(classes) for classes in lengths._classes.values()) == 10


def test_the_variation_of_lengths_is_learned() -> None:
    """How far one output is from its expectation, relatively: none for lengths that are
    all alike, about 0.58 for lengths uniform in 1..200; 1 before anything is seen."""
    assert OutputLengths().variation() == 1.0
    same = OutputLengths()
    for _ in range(100):
        same.observe("chat", 100, 64)
    assert same.variation() < 0.05
    spread = OutputLengths()
    for length in range(1, 201):
        spread.observe("completion", 100, length)
    assert 0.45 < spread.variation() < 0.7
