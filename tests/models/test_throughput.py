"""The engine-agnostic prefill throughput model: what it learns from first tokens, and
what it knows from prompts still waiting (sans-IO, explicit clock)."""

from __future__ import annotations

import math

import pytest

from narwhal.models.throughput import PrefillThroughput


def serve_one_at_a_time(
    model: PrefillThroughput, prompts: list[int], per_token: float, start: float
) -> float:
    """All placed at `start`, prefilled one after another at `per_token` seconds a token."""
    for i, tokens in enumerate(prompts):
        model.placed(i, tokens, start, 0.0)
    now = start
    for i, tokens in enumerate(prompts):
        now += tokens * per_token
        model.finished(i, now, 0.0)
    return now


def test_it_learns_an_engine_slower_than_its_prior() -> None:
    model = PrefillThroughput(alpha_prior=1e-4)  # the profile said 10,000 tokens/s
    now = 0.0
    for _ in range(20):
        now = serve_one_at_a_time(model, [200, 1800, 600, 3000, 1000], 4e-4, now + 1.0)
    # The prior (a quarter of the truth) is still worth a little: within 20%.
    assert model.seconds_per_token(0.0) == pytest.approx(4e-4, rel=0.2)
    # A projection behind nothing is its own prompt at that rate.
    assert model.projection(2000, now + 5.0, 0.0) == pytest.approx(0.8, rel=0.15)


def test_prompts_finishing_together_count_as_one_interval() -> None:
    """A chunked engine's step ends with several first tokens at one instant."""
    model = PrefillThroughput(alpha_prior=1e-4)
    now = 0.0
    for round_ in range(30):
        sizes = [300, 700, 200, 800] if round_ % 2 else [1500, 500, 1000, 1000]
        for key, tokens in enumerate(sizes):
            model.placed(key, tokens, now, 0.0)
        now += sum(sizes) * 2e-4  # the step prefilled all four at 0.2 ms a token
        for key in range(4):
            model.finished(key, now, 0.0)
        now += 0.5
    assert model.seconds_per_token(0.0) == pytest.approx(2e-4, rel=0.2)
    assert model.projection(1000, now, 0.0) == pytest.approx(0.2, rel=0.15)


def test_a_waiting_head_shows_a_slow_engine_before_its_first_token() -> None:
    model = PrefillThroughput(alpha_prior=1e-4)
    model.placed("head", 1000, 0.0, 0.0)
    model.placed("next", 1000, 0.0, 0.0)
    # By the prior, the head was done at 0.1 s. At 1 s it still waits, on an engine whose
    # steps hold nothing beside it: whatever was learned, it runs at 1 ms a token or
    # slower.
    assert model.censored(1.0, beside=0) == pytest.approx(1e-3)
    assert model.projection(1000, 1.0, 0.0, beside=0) >= (1000 + 1000) * 1e-3  # next, own
    # and nothing of the head is counted as done beyond what the rate allows
    assert model.ahead(1.0, beside=0) >= 1001
    # Where its step may hold the next prompt as well, the engine may have prefilled both
    # meanwhile: half the rate is all it shows.
    assert model.censored(1.0) == pytest.approx(5e-4)
    assert model.censored(1.0, beside=500) == pytest.approx(1.0 / 1500)


def test_a_batch_prefilled_in_one_step_does_not_read_as_a_slow_engine() -> None:
    # Sixteen prompts of 120 tokens placed together on an engine that prefills them in one
    # step at 50 us a token (the embedded default's sims under a closed loop of 16): 96 ms
    # later none has its first token yet, and the engine is as fast as its prior says.
    model = PrefillThroughput(alpha_prior=5e-5)
    for key in range(16):
        model.placed(key, 120, 0.0, 0.0)
    now = 16 * 120 * 5e-5
    assert model.censored(now, beside=8192) == pytest.approx(5e-5)
    # A seventeenth waits for the sixteen and its own prefill, not for sixteen steps.
    assert model.projection(120, now, 0.0, beside=8192) < 2 * 17 * 120 * 5e-5


def test_decoding_raises_the_price_of_a_token_when_the_engine_says_so() -> None:
    model = PrefillThroughput(alpha_prior=1e-4)
    now = 0.0
    for i in range(200):
        decoding = float(i % 5) * 25.0  # 0 .. 100 sequences decoding
        tokens = 500 + 250 * (i % 7)
        model.placed(i, tokens, now, decoding)
        now += tokens * (1e-4 + 2e-4 * decoding / 100.0)
        model.finished(i, now, decoding)
        now += 0.2
    assert model.seconds_per_token(0.0) == pytest.approx(1e-4, rel=0.25)
    assert model.seconds_per_token(100.0) == pytest.approx(3e-4, rel=0.2)


def test_prompts_ahead_are_priced_at_the_batch_they_will_decode_in() -> None:
    model = PrefillThroughput(alpha_prior=1e-4, beta_prior=1e-4, max_sequences=4)
    for key in range(10):
        model.placed(key, 100, 0.0, 0.0)
    # ten ahead, but four sequence slots: the batch counted is capped at four
    per_token = model.seconds_per_token(4.0)
    assert model.projection(100, 0.0, 0.0) == pytest.approx(1100 * per_token, rel=1e-6)


def test_dropped_prompts_are_no_measurement_and_free_the_lane() -> None:
    model = PrefillThroughput(alpha_prior=1e-4)
    model.placed("a", 1000, 0.0, 0.0)
    model.dropped("a", 5.0, 0.0)
    assert len(model) == 0 and model.ahead(5.0) == 0.0
    assert model.seconds_per_token(0.0) == pytest.approx(1e-4)


def test_absurd_samples_stay_finite() -> None:
    model = PrefillThroughput(alpha_prior=1e-4)
    model.placed("x", 1000, 10.0, 0.0)
    model.finished("x", 5.0, 0.0)  # the clock went back
    model.placed("y", 1, 5.0, math.inf)
    model.finished("y", 1e9, 0.0)  # a stall of decades
    for key in range(50):
        model.placed(key, 1000, 1e9 + key, 0.0)
        model.finished(key, 1e9 + key + 0.1, 0.0)
    value = model.projection(1000, 1e9 + 100.0, 10.0)
    assert math.isfinite(value) and value > 0
    assert model.seconds_per_token(0.0) <= 1.0
