"""Engine profiles (sans-IO): what a few probe requests say about an engine, and the fit.

A profile is the baseline of an engine's performance models: coefficients of

    prefill seconds  = a + b·p + c·p² + e·d     p = prompt tokens / 1000, d = decoding / 100
    decode step      = t + u·d                  (TPOT with no prefill beside it)
    first decode step after a KV transfer (decode engines) = f + g·p

TPOT is the decode step stretched by the prefill the engine does meanwhile (the engine
model's `stretch`): with chunked prefill, decode steps share the engine with prefill
chunks, so they lengthen by 1 / (1 - rho), rho the share of the engine's time its
prefill takes, up to a step full of prefill. A pure decode engine has rho = 0.

Probes measure what one engine does alone: a few requests of `PROBE_PROMPTS` tokens (or
`fleet.probe_prompt_tokens`), counted in the engine's own tokens and fitted under its
`max_model_len` (`fit_probe_sizes`), and `PROBE_OUTPUT` tokens each, one after another,
timed from validated token IDs (the first output event, and the spacing of the rest).
They fix a, b (least squares over the probe lengths) and t; c starts at 0 (attention's
quadratic cost shows on long prompts served later), and the load slopes e, u, v start
from what such engines usually do and are learned from served requests. A probe whose
events fail the token-ID check fails its measurement, and a profile needs every probe.

Then `CONCURRENT_PROBES` equal prompts are sent at once, to see how the engine serves
prompts that arrive together (`fit_concurrency`): their first tokens together at one
step's end (batched or chunked prefill, as vLLM's), or one after another (serial: one
prompt at a time, first come first served), and what a token of prefill costs batched
against alone. The result is data for the projection (`Profile.prefill_discipline` and
the fields beside it); the profile's coefficients come from the solo probes alone.

Re-profiling a drifted engine keeps the shape and rescales it: each quantity by the
median ratio of what the probes measured to what the old profile predicted for them.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, Literal

# Prompt lengths of the probe requests (the engine's tokens) and their fixed output length.
PROBE_PROMPTS: Final = (64, 512, 2048, 64)
PROBE_OUTPUT: Final = 16
# The prompts sent together: how many, their length (fitted like the others) and output.
CONCURRENT_PROBES: Final = 4
CONCURRENT_PROMPT: Final = 1024
CONCURRENT_OUTPUT: Final = 16  # enough that a batching engine decodes beside the next prefill
# Room left under max_model_len beside a probe's output: a chat template's tokens, and an
# engine that counts one more (a BOS) than its /tokenize said.
PROBE_MARGIN: Final = 8
MIN_PROBE_PROMPT: Final = 8  # tokens: a shorter prompt measures nothing but overhead
# Spread (see `fit_concurrency`) from which first tokens count as one after another.
SERIAL_SPREAD: Final = 0.5
# Floors: no engine answers in no time, and a fit must never predict zero or less.
MIN_PREFILL_S: Final = 2e-4
MIN_TPOT_S: Final = 1e-4

Source = Literal["token_ids", "usage_and_events"]
Discipline = Literal["batched", "serial", "one_at_a_time", "unknown"]


class ProfileError(ValueError):
    """The probes cannot make a profile (the message says why)."""


def fit_probe_sizes(
    sizes: Sequence[int], max_model_len: int | None, output: int = PROBE_OUTPUT
) -> tuple[int, ...]:
    """Probe prompt lengths that fit the engine's context: each with `output` tokens and
    `PROBE_MARGIN` beside it within `max_model_len` (None: unknown, the sizes as given).
    Sizes over the limit scale down all together, so that the fit still sees prompts of
    different lengths; ProfileError when the context leaves no room for a probe."""
    if max_model_len is None:
        return tuple(sizes)
    limit = max_model_len - output - PROBE_MARGIN
    if limit < MIN_PROBE_PROMPT:
        raise ProfileError(
            f"max_model_len {max_model_len} leaves no room for a probe of "
            f"{MIN_PROBE_PROMPT} prompt and {output} output tokens"
        )
    largest = max(sizes)
    if largest <= limit:
        return tuple(sizes)
    scale = limit / largest
    return tuple(max(MIN_PROBE_PROMPT, min(limit, int(size * scale))) for size in sizes)


@dataclass(frozen=True, slots=True)
class ConcurrentSample:
    """Prompts of one length sent to the engine at once: their first-token times, in
    seconds from the moment they were sent, in the order they came."""

    prompt_tokens: int
    first_token_s: tuple[float, ...]
    # Each one's last output token, in the same order (empty: not timed).
    last_token_s: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class Concurrency:
    """What prompts arriving together showed (`fit_concurrency`)."""

    prompt_tokens: int
    first_token_s: tuple[float, ...]
    spread: float
    discipline: Discipline
    batched_tokens_per_s: float
    batched_cost_ratio: float
    # The most prompt tokens one of the engine's steps can hold, as far as they showed:
    # less than one prompt more than the most that came at one step's end, or None when
    # they all came together (a step holds them all, and maybe more) or the steps before
    # the last were short of prompts still arriving (`_step_tokens`).
    step_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class ProbeSample:
    """One probe: its prompt (as the engine counted it), first-output time and TPOT."""

    prompt_tokens: int
    ttft_s: float
    tpot_s: float | None  # None when the output came in one event
    # What the engine held when the probe ran (re-profiling happens under load).
    backlog_s: float = 0.0
    decoding: float = 0.0
    stretch: float = 1.0  # how much prefill beside it stretched the engine's decode steps


@dataclass(frozen=True, slots=True)
class Profile:
    prefill: tuple[float, float, float, float]  # a, b, c, e
    tpot: tuple[float, float]  # t, u: the decode step
    first_step: tuple[float, float]  # f, g
    measured_at: float  # wall clock (time.time())
    measured_monotonic: float
    samples: int
    source: Source
    kind: Literal["probes", "reprofile"] = "probes"
    # A re-profile: what the probes measured against the profile before (1 = unchanged).
    rescaled: tuple[float, float] = (1.0, 1.0)  # prefill, TPOT
    # The solo probes' prompt lengths as the engine counted them, and the context they were
    # fitted under (the engine's max_model_len then; None: not known). A new limit means
    # a new engine process: the profiler measures it again.
    probe_prompt_tokens: tuple[int, ...] = ()
    max_model_len: int | None = None
    # How the engine serves prompts that arrive together, from CONCURRENT_PROBES equal
    # prompts sent at once (None/"unknown": not measured):
    # - prefill_discipline: "batched" when their first tokens come together at one step's
    #   end (continuous batching with a step budget they fit, as vLLM's chunked prefill),
    #   "serial" when they come one after another (one prefill at a time, first come
    #   first served; or a step budget smaller than one prompt), "one_at_a_time" when
    #   each came only after the one before had finished its output too (an engine
    #   without continuous batching: one request in it at a time).
    # - concurrent_first_token_spread: the median gap between consecutive first tokens
    #   over the solo prefill time of that prompt: about 0 batched, about 1 serial.
    # - batched_prefill_tokens_per_s: the prompt tokens of all of them over the time the
    #   last one's first token took: the engine's prefill throughput under a burst.
    # - batched_cost_ratio: that burst's time over the solo prefill time of each prompt
    #   one after another: 1 when batching saves nothing, under 1 when a batched token
    #   costs less than a token alone.
    # - concurrent_first_token_s: the raw first-token times (s from sending), in order,
    #   and concurrent_prompt_tokens the length of each prompt.
    prefill_discipline: Discipline = "unknown"
    concurrent_first_token_spread: float | None = None
    batched_prefill_tokens_per_s: float | None = None
    batched_cost_ratio: float | None = None
    concurrent_first_token_s: tuple[float, ...] = ()
    concurrent_prompt_tokens: int | None = None
    # - concurrent_step_tokens: the most prompt tokens a step can hold, as they showed
    #   (`Concurrency.step_tokens`; None: at least all of them).
    concurrent_step_tokens: int | None = None

    def with_concurrency(self, concurrency: Concurrency | None) -> Profile:
        """This profile with what the concurrent probes measured (None: unchanged)."""
        if concurrency is None:
            return self
        return replace(
            self,
            prefill_discipline=concurrency.discipline,
            concurrent_first_token_spread=concurrency.spread,
            batched_prefill_tokens_per_s=concurrency.batched_tokens_per_s,
            batched_cost_ratio=concurrency.batched_cost_ratio,
            concurrent_first_token_s=concurrency.first_token_s,
            concurrent_prompt_tokens=concurrency.prompt_tokens,
            concurrent_step_tokens=concurrency.step_tokens,
        )

    def view(self, now: float) -> dict[str, Any]:
        """The profile as /admin/engines shows it."""
        a, b, c, e = self.prefill
        t, u = self.tpot
        f, g = self.first_step
        return {
            "measured_at": round(self.measured_at, 3),
            "age_s": round(max(0.0, now - self.measured_monotonic), 3),
            "samples": self.samples,
            "source": self.source,
            "kind": self.kind,
            "rescaled": {"prefill": self.rescaled[0], "tpot": self.rescaled[1]},
            "prefill_s": {
                "base": a,
                "per_1k_tokens": b,
                "per_1k_tokens_squared": c,
                "per_100_decoding": e,
            },
            "decode_step_s": {"base": t, "per_100_decoding": u},
            "first_decode_step_s": {"base": f, "per_1k_tokens": g},
            "probe_prompt_tokens": list(self.probe_prompt_tokens),
            "max_model_len": self.max_model_len,
            "concurrent": {
                "prefill_discipline": self.prefill_discipline,
                "first_token_spread": _rounded(self.concurrent_first_token_spread),
                "batched_prefill_tokens_per_s": _rounded(self.batched_prefill_tokens_per_s),
                "batched_cost_ratio": _rounded(self.batched_cost_ratio),
                "prompt_tokens": self.concurrent_prompt_tokens,
                "step_tokens": self.concurrent_step_tokens,
                "first_token_s": [round(t, 4) for t in self.concurrent_first_token_s],
            },
        }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def fit_concurrency(sample: ConcurrentSample, solo_prefill_s: float) -> Concurrency:
    """The discipline from prompts sent together, `solo_prefill_s` the time one of them
    takes alone (the solo probes' fit).

    The spread is the median of the gaps between consecutive first tokens over the solo
    time: an engine that batches them ends them at one step's end (gaps about 0, even
    when one arrived late and ran a step alone: the median ignores that one), an engine
    that prefills one at a time ends them a prefill apart (gaps about the solo time).
    Where each prompt's first token came a prefill (half a solo time, at least) after
    the one before had its last token, the engine ran them one at a time, outputs and
    all: no continuous batching.

    How many came at each step's end (first tokens within half a solo time of one
    another) bounds what a step holds: a chunked scheduler with a budget of B tokens ends
    about B / P prompts of P tokens a step, so B is less than one prompt more than the
    most that came together (vLLM's CPU default of 2,048 tokens shows as two steps of two
    1,024-token prompts). Unless the last step ended more than one prompt more than any
    before it: the steps before were short of prompts that had not arrived, not of
    budget, and nothing is known of it (`_step_tokens`)."""
    times = sorted(sample.first_token_s)
    if len(times) < 2 or sample.prompt_tokens <= 0:
        raise ProfileError("fewer than 2 concurrent probes answered")
    solo = max(MIN_PREFILL_S, solo_prefill_s)
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    spread = max(0.0, statistics.median(gaps)) / solo
    last = max(MIN_PREFILL_S, times[-1])
    step_tokens = _step_tokens(times, sample.prompt_tokens, 0.5 * solo)
    discipline: Discipline = "serial" if spread >= SERIAL_SPREAD else "batched"
    if discipline == "serial" and len(sample.last_token_s) == len(sample.first_token_s):
        ends = sorted(zip(sample.first_token_s, sample.last_token_s, strict=True))
        if all(later[0] - earlier[1] >= 0.5 * solo for earlier, later in itertools.pairwise(ends)):
            discipline = "one_at_a_time"
    return Concurrency(
        prompt_tokens=sample.prompt_tokens,
        first_token_s=tuple(times),
        spread=spread,
        discipline=discipline,
        batched_tokens_per_s=len(times) * sample.prompt_tokens / last,
        batched_cost_ratio=last / (len(times) * solo),
        step_tokens=step_tokens,
    )


def _step_tokens(times: list[float], prompt_tokens: int, apart: float) -> int | None:
    """The most prompt tokens a step can hold, from first tokens (sorted) of equal prompts
    sent together: steps end more than `apart` from one another (see `fit_concurrency`)."""
    steps = [1]
    start = times[0]
    for t in times[1:]:
        if t - start > apart:
            steps.append(1)
            start = t
        else:
            steps[-1] += 1
    if len(steps) < 2 or steps[-1] > max(steps[:-1]) + 1:
        return None
    return (max(steps) + 1) * prompt_tokens


def prefill_features(prompt_tokens: float, decoding: float) -> tuple[float, float, float, float]:
    p = prompt_tokens / 1000.0
    return (1.0, p, p * p, decoding / 100.0)


def tpot_features(decoding: float) -> tuple[float, float]:
    return (1.0, decoding / 100.0)


def first_step_features(prompt_tokens: float) -> tuple[float, float]:
    return (1.0, prompt_tokens / 1000.0)


def dot(theta: Sequence[float], x: Sequence[float]) -> float:
    return sum(t * v for t, v in zip(theta, x, strict=True))


def fit_profile(
    samples: Sequence[ProbeSample], *, source: Source, wall: float, now: float
) -> Profile:
    """A profile from solo probes: prefill intercept and slope, TPOT base."""
    if len(samples) < 2:
        raise ProfileError(f"{len(samples)} probe(s) answered; a profile needs at least 2")
    xs = [s.prompt_tokens / 1000.0 for s in samples]
    ys = [s.ttft_s for s in samples]
    a, b = _line(xs, ys)
    # A longer prompt is never free: where noise on a loaded host flattened the line (the
    # long probe no slower than the short ones), a token costs at least a quarter of what
    # the longest probe took per token, intercept and all.
    longest = max(samples, key=lambda s: s.prompt_tokens)
    if longest.prompt_tokens > 0:
        b = max(b, 0.25 * longest.ttft_s / (longest.prompt_tokens / 1000.0))
    tpots = [s.tpot_s for s in samples if s.tpot_s is not None]
    if not tpots:
        raise ProfileError("no probe streamed its output token by token (no TPOT)")
    t = max(MIN_TPOT_S, statistics.median(tpots))
    # Load slopes until served requests teach better: a decode step grows with the batch
    # (about its own base cost per 100 sequences on common GPUs and models), steps
    # are stretched by the prefill beside them, and each decoding sequence adds to every
    # prefill step.
    u = t
    e = u
    return Profile(
        prefill=(a, b, 0.0, e),
        tpot=(t, u),
        first_step=(2.0 * t, 0.005),
        measured_at=wall,
        measured_monotonic=now,
        samples=len(samples),
        source=source,
        probe_prompt_tokens=tuple(s.prompt_tokens for s in samples),
    )


def rescale(
    profile: Profile, samples: Sequence[ProbeSample], *, wall: float, now: float
) -> Profile:
    """Re-profiling: the old profile scaled by what the probes measured against it."""
    ttft_ratios = []
    tpot_ratios = []
    for s in samples:
        expected = s.backlog_s + max(
            MIN_PREFILL_S, dot(profile.prefill, prefill_features(s.prompt_tokens, s.decoding))
        )
        if s.ttft_s > 0:
            ttft_ratios.append(s.ttft_s / expected)
        if s.tpot_s is not None and s.tpot_s > 0:
            step = max(MIN_TPOT_S, dot(profile.tpot, tpot_features(s.decoding)))
            expected_tpot = step * s.stretch
            tpot_ratios.append(s.tpot_s / expected_tpot)
    if not ttft_ratios or not tpot_ratios:
        raise ProfileError("the probes measured no first token or no TPOT")
    k_prefill = _bounded(statistics.median(ttft_ratios))
    k_tpot = _bounded(statistics.median(tpot_ratios))
    # Everything else (the concurrent probes' findings, the context) stays as measured
    # before until the run that called this measures it again.
    return replace(
        profile,
        prefill=tuple(k_prefill * c for c in profile.prefill),  # type: ignore[arg-type]
        tpot=tuple(k_tpot * c for c in profile.tpot),  # type: ignore[arg-type]
        first_step=tuple(k_tpot * c for c in profile.first_step),  # type: ignore[arg-type]
        measured_at=wall,
        measured_monotonic=now,
        samples=len(samples),
        kind="reprofile",
        rescaled=(k_prefill, k_tpot),
        probe_prompt_tokens=tuple(s.prompt_tokens for s in samples),
    )


def _bounded(ratio: float) -> float:
    return min(20.0, max(0.05, ratio))


def _line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares intercept and slope, both kept at or above their floors."""
    mean_x = statistics.fmean(xs)
    mean_y = statistics.fmean(ys)
    sxx = sum((x - mean_x) ** 2 for x in xs)
    slope = 0.0
    if sxx > 0:
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sxx
    slope = max(0.0, slope)
    intercept = max(MIN_PREFILL_S, mean_y - slope * mean_x)
    return intercept, slope


ProfileState = Literal["unprofiled", "profiling", "profiled", "failed"]


@dataclass(slots=True)
class Profiling:
    """Where profiling stands, for placement (profiled?) and for operators (why not)."""

    state: ProfileState = "unprofiled"
    reason: str | None = None
    attempts: int = 0
    reprofiles: int = 0
    last_reprofile_at: float | None = None
    reprofile_wanted: bool = False
    last_reason: str | None = None  # why the last successful run was made
    probe_runs: int = 0  # successful runs, first profiles and re-profiles
    probe_tokens: int = 0  # prompt and output tokens the probes had the engine serve


def throughput_prior(profile: Profile) -> tuple[float, float, float]:
    """The throughput fit's prior, by the profile: seconds per prompt token (its slope),
    more per 100 sequences decoding, and seconds per prompt (its intercept)."""
    a, b, _, e = profile.prefill
    return max(MIN_PREFILL_S, b) / 1000.0, max(0.0, e) / 1000.0, max(0.0, a)


def per_prompt_cost(profile: Profile, alpha: float, alone: float) -> float:
    """Seconds each prompt adds beyond its tokens when several wait: what the prompts
    sent together showed (each one after the first added its tokens and this: a batching
    engine pays a step's fixed cost once for all of them), else the intercept of a prompt
    alone, `alone` (an engine that prefills one at a time pays it for each)."""
    times, tokens = profile.concurrent_first_token_s, profile.concurrent_prompt_tokens
    if len(times) < 2 or not tokens:
        return alone
    first = dot(profile.prefill, prefill_features(tokens, 0.0))  # one of them alone
    each = (max(times) - first) / (len(times) - 1) - tokens * alpha
    return min(alone, max(0.0, each))
