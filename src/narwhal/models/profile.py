"""Engine profiles (sans-IO): what a few probe requests say about an engine, and the fit.

A profile is the baseline of an engine's performance models: coefficients of

    prefill seconds  = a + b·p + c·p² + e·d     p = prompt tokens / 1000, d = decoding / 100
    decode step      = t + u·d                  (TPOT with no prefill beside it)
    first decode step after a KV transfer (decode engines) = f + g·p

TPOT is the decode step stretched by the prefill the engine does meanwhile (the engine
model's `stretch`): with chunked prefill, decode steps share the engine with prefill
chunks, so they lengthen by 1 / (1 - rho), rho the share of the engine's time its
prefill takes, up to a step full of prefill. A pure decode engine has rho = 0.

Probes measure what one engine does alone: a few requests of `PROBE_PROMPTS` tokens and
`PROBE_OUTPUT` tokens each, one after another, timed from validated token IDs (the first
output event, and the spacing of the rest). They fix a, b (least squares over the
probe lengths) and t; c starts at 0 (attention's quadratic cost shows on long prompts
served later), and the load slopes e, u, v start from what such engines usually do
and are learned from served requests. A probe whose events fail the token-ID check
fails its measurement, and a profile needs every probe.

Re-profiling a drifted engine keeps the shape and rescales it: each quantity by the
median ratio of what the probes measured to what the old profile predicted for them.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

# Prompt lengths of the probe requests (tokens) and their fixed output length.
PROBE_PROMPTS: Final = (64, 512, 2048, 64)
PROBE_OUTPUT: Final = 16
# Floors: no engine answers in no time, and a fit must never predict zero or less.
MIN_PREFILL_S: Final = 2e-4
MIN_TPOT_S: Final = 1e-4

Source = Literal["token_ids", "usage_and_events"]


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
        }


class ProfileError(ValueError):
    """The probes cannot make a profile (the message says why)."""


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
    return Profile(
        prefill=tuple(k_prefill * c for c in profile.prefill),  # type: ignore[arg-type]
        tpot=tuple(k_tpot * c for c in profile.tpot),  # type: ignore[arg-type]
        first_step=tuple(k_tpot * c for c in profile.first_step),  # type: ignore[arg-type]
        measured_at=wall,
        measured_monotonic=now,
        samples=len(samples),
        source=profile.source,
        kind="reprofile",
        rescaled=(k_prefill, k_tpot),
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
