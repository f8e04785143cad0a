"""Profiles from probes: the fit, its floors, re-profiling by rescaling."""

from __future__ import annotations

import pytest

from narwhal.models.profile import (
    PROBE_MARGIN,
    PROBE_OUTPUT,
    PROBE_PROMPTS,
    ConcurrentSample,
    ProbeSample,
    ProfileError,
    fit_concurrency,
    fit_probe_sizes,
    fit_profile,
    rescale,
)


def probes(a: float, b: float, tpot: float) -> list[ProbeSample]:
    return [ProbeSample(p, a + b * p / 1000, tpot) for p in (64, 512, 2048, 64)]


def test_fit_recovers_intercept_slope_and_tpot() -> None:
    profile = fit_profile(probes(0.008, 0.05, 0.006), source="token_ids", wall=1.0, now=2.0)
    a, b, c, _ = profile.prefill
    assert (a, b, c) == pytest.approx((0.008, 0.05, 0.0))
    assert profile.tpot[0] == pytest.approx(0.006)
    assert profile.samples == 4 and profile.source == "token_ids"
    view = profile.view(now=5.0)
    assert view["age_s"] == 3.0 and view["prefill_s"]["per_1k_tokens"] == pytest.approx(0.05)


def test_fit_never_predicts_zero_or_a_negative_slope() -> None:
    # An engine too fast to time (every probe 0 s), or noise that slopes downwards.
    flat = [ProbeSample(p, 0.0, 1e-6) for p in (64, 512, 2048)]
    profile = fit_profile(flat, source="token_ids", wall=0, now=0)
    assert profile.prefill[0] > 0 and profile.prefill[1] == 0.0 and profile.tpot[0] > 0
    # Noise that slopes downwards: a token still costs a quarter of what the longest probe
    # took per token (a real vLLM on a loaded host once fitted a slope of 0).
    down = [ProbeSample(64, 0.05, 0.01), ProbeSample(2048, 0.01, 0.01)]
    slope = fit_profile(down, source="token_ids", wall=0, now=0).prefill[1]
    assert slope == pytest.approx(0.25 * 0.01 / 2.048)


def test_fit_refuses_too_little() -> None:
    with pytest.raises(ProfileError):
        fit_profile(probes(0.01, 0.05, 0.006)[:1], source="token_ids", wall=0, now=0)
    no_tpot = [ProbeSample(p, 0.01, None) for p in (64, 512)]
    with pytest.raises(ProfileError, match="TPOT"):
        fit_profile(no_tpot, source="usage_and_events", wall=0, now=0)


def test_rescale_follows_what_the_probes_measured() -> None:
    profile = fit_profile(probes(0.008, 0.05, 0.006), source="token_ids", wall=0, now=0)
    slower = [
        ProbeSample(s.prompt_tokens, s.ttft_s, 2 * (s.tpot_s or 0))
        for s in probes(0.008, 0.05, 0.006)
    ]
    again = rescale(profile, slower, wall=1, now=1)
    assert again.kind == "reprofile"
    assert again.tpot[0] == pytest.approx(2 * profile.tpot[0], rel=0.01)
    assert again.prefill[1] == pytest.approx(profile.prefill[1], rel=0.01)


def test_probe_sizes_fit_under_the_context_with_their_output() -> None:
    assert fit_probe_sizes(PROBE_PROMPTS, None) == PROBE_PROMPTS
    assert fit_probe_sizes(PROBE_PROMPTS, 32768) == PROBE_PROMPTS
    # vLLM --max-model-len 2048: the 2,048-token probe and its 16 output tokens do not fit.
    fitted = fit_probe_sizes(PROBE_PROMPTS, 2048)
    assert max(fitted) + PROBE_OUTPUT + PROBE_MARGIN <= 2048
    assert max(fitted) >= 2000
    # Scaled together: the fit still sees short and long prompts.
    small = fit_probe_sizes(PROBE_PROMPTS, 300)
    assert max(small) + PROBE_OUTPUT <= 300 and len(set(small)) == 3
    assert fit_probe_sizes((100, 5000), 1000, 2) == (19, 990)


def test_a_context_with_no_room_for_a_probe_is_a_profile_error() -> None:
    with pytest.raises(ProfileError, match="max_model_len 24"):
        fit_probe_sizes(PROBE_PROMPTS, 24)


def test_first_tokens_together_are_batched_even_when_one_came_a_step_late() -> None:
    # Four 1,024-token prompts of 51 ms each alone; one arrived as a step had begun.
    batched = ConcurrentSample(1024, (0.205, 0.053, 0.205, 0.205))
    result = fit_concurrency(batched, solo_prefill_s=0.053)
    assert result.discipline == "batched" and result.spread == pytest.approx(0.0)
    assert result.first_token_s == (0.053, 0.205, 0.205, 0.205)
    assert result.batched_tokens_per_s == pytest.approx(4 * 1024 / 0.205)
    assert result.batched_cost_ratio == pytest.approx(0.205 / (4 * 0.053))
    # The first step was short of prompts, not of budget: nothing is known of the budget.
    assert result.step_tokens is None


def test_first_tokens_in_steps_of_two_bound_what_a_step_holds() -> None:
    # vLLM on CPU (2,048 tokens a step): two of four 1,024-token prompts end each step.
    chunked = ConcurrentSample(1024, (0.071, 0.072, 0.139, 0.140))
    result = fit_concurrency(chunked, solo_prefill_s=0.035)
    assert result.discipline == "batched" and result.step_tokens == 3 * 1024
    together = ConcurrentSample(1024, (0.130, 0.131, 0.131, 0.132))
    assert fit_concurrency(together, solo_prefill_s=0.035).step_tokens is None
    serial = ConcurrentSample(1024, (0.053, 0.106, 0.159, 0.212))
    assert fit_concurrency(serial, solo_prefill_s=0.053).step_tokens == 2 * 1024


def test_first_tokens_one_after_another_are_serial() -> None:
    serial = ConcurrentSample(1024, (0.053, 0.106, 0.159, 0.212))
    result = fit_concurrency(serial, solo_prefill_s=0.053)
    assert result.discipline == "serial" and result.spread == pytest.approx(1.0)
    assert result.batched_cost_ratio == pytest.approx(1.0)
    with pytest.raises(ProfileError):
        fit_concurrency(ConcurrentSample(1024, (0.05,)), solo_prefill_s=0.05)


def test_each_one_after_the_one_before_had_finished_is_one_at_a_time() -> None:
    """No continuous batching: each prompt's prefill started after the output before it
    ended (2 output tokens of 10 ms each). A serial engine with continuous batching
    decodes beside the next prefill: its last tokens overlap the next first token."""
    first = (0.053, 0.126, 0.199, 0.272)
    one_at_a_time = ConcurrentSample(1024, first, tuple(t + 0.02 for t in first))
    assert fit_concurrency(one_at_a_time, solo_prefill_s=0.053).discipline == "one_at_a_time"
    first = (0.053, 0.106, 0.159, 0.212)
    overlapping = ConcurrentSample(1024, first, (0.106, 0.159, 0.212, 0.222))
    assert fit_concurrency(overlapping, solo_prefill_s=0.053).discipline == "serial"


def test_the_profile_carries_concurrency_and_shows_it() -> None:
    profile = fit_profile(probes(0.008, 0.05, 0.006), source="token_ids", wall=0, now=0)
    assert profile.prefill_discipline == "unknown" and profile.probe_prompt_tokens == (
        64,
        512,
        2048,
        64,
    )
    measured = fit_concurrency(ConcurrentSample(1024, (0.06, 0.16, 0.16, 0.16)), 0.06)
    with_it = profile.with_concurrency(measured)
    assert with_it.prefill == profile.prefill and with_it.prefill_discipline == "batched"
    view = with_it.view(now=0)["concurrent"]
    assert view["prefill_discipline"] == "batched" and view["prompt_tokens"] == 1024
    assert view["first_token_s"] == [0.06, 0.16, 0.16, 0.16]
    # A re-profile keeps what the run before measured unless measured again.
    again = rescale(with_it, probes(0.008, 0.05, 0.006), wall=1, now=1)
    assert again.kind == "reprofile" and again.prefill_discipline == "batched"
