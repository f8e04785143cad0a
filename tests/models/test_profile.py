"""Profiles from probes: the fit, its floors, re-profiling by rescaling."""

from __future__ import annotations

import pytest

from narwhal.models.profile import ProbeSample, ProfileError, fit_profile, rescale


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
    down = [ProbeSample(64, 0.05, 0.01), ProbeSample(2048, 0.01, 0.01)]
    assert fit_profile(down, source="token_ids", wall=0, now=0).prefill[1] == 0.0


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
