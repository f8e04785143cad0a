"""What the profiler's probes say (sans-IO): the route they take, how large they are, and
what their answers show of the engine, read by the runs that send them (`runs.py`): the
discipline of prompts sent together, whether a re-profile found the engine unchanged,
and a probe counted past the engine's context."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from narwhal.models.drift import DRIFT_THRESHOLD
from narwhal.models.profile import (
    CONCURRENT_PROBES,
    PROBE_MARGIN,
    PROBE_OUTPUT,
    Concurrency,
    ConcurrentSample,
    ProbeSample,
    Profile,
    ProfileError,
    Source,
    dot,
    fit_concurrency,
    prefill_features,
)
from narwhal.protocol.dialects import DialectCapabilities
from narwhal.protocol.requests import Route


def probe_route(engine: DialectCapabilities) -> tuple[Route, Source]:
    """The route probes take (the one the engine gives token IDs on, else chat) and what
    their timing is read from."""
    route: Route = "completion" if engine.token_ids_on else "chat"
    source: Source = "token_ids" if route in engine.token_ids_on else "usage_and_events"
    return route, source


def step_tokens(profile: Profile) -> str:
    """What the concurrent probes showed of a step's budget, for the log."""
    if profile.concurrent_step_tokens is not None:
        return f"under {profile.concurrent_step_tokens}"
    if profile.concurrent_prompt_tokens is None:
        return "an unknown number of"
    return f"at least {CONCURRENT_PROBES * profile.concurrent_prompt_tokens}"


def concurrency_of(profile: Profile, samples: Sequence[ConcurrentSample]) -> Concurrency:
    """The discipline the samples of prompts sent together show: the one of least spread
    (`Profiler._probe_all`), at the cost of the fastest. A busy host only adds time, to the
    gaps between first tokens and to the last of them alike, so the least of each is the
    nearest the engine's own (a serial engine's two samples on a host with a core held
    busy: one took twice its time)."""
    fits = [
        fit_concurrency(s, dot(profile.prefill, prefill_features(s.prompt_tokens, 0.0)))
        for s in samples
    ]
    fastest = max(fits, key=lambda fit: fit.batched_tokens_per_s)
    return dataclasses.replace(
        min(fits, key=lambda fit: fit.spread),
        batched_tokens_per_s=fastest.batched_tokens_per_s,
        batched_cost_ratio=fastest.batched_cost_ratio,
    )


def check_within(sample: ProbeSample, context: int | None, output: int) -> None:
    """An estimated probe the engine counted over its context would have been refused;
    one it accepted but counted past the limit says the sizing is wrong: not a profile."""
    if context is not None and sample.prompt_tokens + output > context:
        raise ProfileError(
            f"a probe of {sample.prompt_tokens} prompt tokens (the engine's count) and "
            f"{output} output tokens exceeds max_model_len {context}"
        )


def probes_unchanged(profile: Profile) -> bool:
    """Whether a re-profile's probes measured the engine within the drift threshold of
    the profile they were scaled against (`rescale`), prefill and TPOT."""
    return all(abs(math.log(k)) < DRIFT_THRESHOLD for k in profile.rescaled)


def with_hint(sizes: Sequence[int], hint: int | None, context: int | None) -> tuple[int, ...]:
    """The probe sizes, and one of the length clients' prompts have been (`hint`) where it
    is longer than them all by more than a quarter: within the context, beside them."""
    sizes = tuple(sizes)
    if hint is None or hint <= 1.25 * max(sizes):
        return sizes
    if context is not None:
        hint = min(hint, context - PROBE_OUTPUT - PROBE_MARGIN)
    return sizes if hint <= max(sizes) else (*sizes, hint)
