"""Probe sizes for a re-profile, and when its probes say the engine itself is unchanged."""

from __future__ import annotations

import dataclasses

from narwhal.models.profile import ConcurrentSample, ProbeSample, fit_profile
from narwhal.profiling.readings import concurrency_of, probes_unchanged, with_hint


def test_a_hint_longer_than_every_probe_is_probed_too_within_the_context() -> None:
    sizes = (64, 512, 2048, 64)
    assert with_hint(sizes, None, 8192) == sizes
    assert with_hint(sizes, 2400, 8192) == sizes  # within a quarter of the largest
    assert with_hint(sizes, 3100, 8192) == (*sizes, 3100)
    assert with_hint(sizes, 3100, None) == (*sizes, 3100)
    # Capped by the context (16 output tokens and a margin of 8 beside it).
    assert with_hint(sizes, 9000, 4096) == (*sizes, 4096 - 16 - 8)
    assert with_hint(sizes, 9000, 2060) == sizes  # no room beyond the largest probe


def test_a_reprofile_within_the_drift_threshold_either_way_is_unchanged() -> None:
    samples = [ProbeSample(p, 0.01 + 0.05 * p / 1000, 0.006) for p in (64, 512, 2048)]
    profile = fit_profile(samples, source="token_ids", wall=0.0, now=0.0)
    for rescaled, unchanged in (
        ((1.0, 1.0), True),
        ((0.8, 1.2), True),
        ((1.4, 1.0), False),  # slower alone: a changed engine
        ((1.0, 0.7), False),
    ):
        assert probes_unchanged(dataclasses.replace(profile, rescaled=rescaled)) is unchanged


def test_of_two_samples_of_prompts_sent_together_the_least_spread_stands() -> None:
    """A batching engine seen through a busy host once (its first tokens 40 ms apart) and
    once as it is (together): batched. An engine serving one prompt after another is
    serial in both, and stays so."""
    samples = [ProbeSample(p, 0.01 + 0.02 * p / 1000, 0.006) for p in (64, 512, 2048)]
    profile = fit_profile(samples, source="token_ids", wall=0.0, now=0.0)
    noisy = ConcurrentSample(2048, (0.05, 0.09, 0.13, 0.17))
    together = ConcurrentSample(2048, (0.05, 0.051, 0.051, 0.052))
    assert concurrency_of(profile, [noisy]).discipline == "serial"
    assert concurrency_of(profile, [noisy, together]).discipline == "batched"
    assert concurrency_of(profile, [together, noisy]).discipline == "batched"
    serial = ConcurrentSample(2048, (0.05, 0.10, 0.15, 0.20))
    assert concurrency_of(profile, [serial, noisy]).discipline == "serial"


def test_prompts_sent_together_are_costed_at_the_faster_of_their_samples() -> None:
    """A serial engine sampled twice, once on a host that held it back before it began (its
    first tokens as far apart, all 0.2 s late): serial, at the cost of the sample that
    was not held back."""
    samples = [ProbeSample(p, 0.01 + 0.02 * p / 1000, 0.006) for p in (64, 512, 2048)]
    profile = fit_profile(samples, source="token_ids", wall=0.0, now=0.0)
    serial = ConcurrentSample(2048, (0.05, 0.10, 0.15, 0.20))
    held_back = ConcurrentSample(2048, (0.26, 0.305, 0.35, 0.395))
    for order in ([serial, held_back], [held_back, serial]):
        fit = concurrency_of(profile, order)
        assert fit.discipline == "serial"
        assert fit.batched_tokens_per_s == 4 * 2048 / 0.20
