"""One engine's performance model (sans-IO): its profile, what it has learned, its lane.

What placement and the predictive check ask of an engine, with `now` passed in:

    service(prompt, decoding)   seconds this prompt's prefill takes (nothing ahead)
    backlog(now)                seconds of prefill work Narwhal has placed there, left
    tpot(decoding)              seconds per output token for a request decoding there
    first_step(prompt)          decode engines: the KV transfer and first step
    score                       drift: how much slower than its profile it is (> 0)

What it is told, from the transitions admission makes and from every served request:
a prefill placed or finished (its measured service time, by the lane's departure rule),
a TPOT observed, a first decode step measured. Each updates an online least-squares fit
(`AnchoredLeastSquares`, anchored to the profile) and the drift scores. Everything is
O(1) per call and the state is bounded by the requests in flight.

Until it is profiled, an engine's model runs on generic defaults; predictive admission
does not place work on it then (the registry's ready gate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final, Literal

from narwhal.models.drift import DriftScore
from narwhal.models.lane import PrefillLane
from narwhal.models.profile import (
    MIN_PREFILL_S,
    MIN_TPOT_S,
    Profile,
    dot,
    first_step_features,
    prefill_features,
    tpot_features,
)
from narwhal.models.regression import AnchoredLeastSquares

# Before any profile: an 8B-class model on one modern GPU, roughly.
DEFAULT_PROFILE: Final = Profile(
    prefill=(0.01, 0.05, 0.0, 0.006),
    tpot=(0.006, 0.006, 0.003),
    first_step=(0.012, 0.005),
    measured_at=0.0,
    measured_monotonic=0.0,
    samples=0,
    source="token_ids",
)
# How many samples' weight the profile has in each fit, per coefficient. The intercepts
# and the prompt slope are measured by the probes (firm); the load slopes are guesses.
_PREFILL_STRENGTH: Final = (8.0, 8.0, 40.0, 2.0)
_TPOT_STRENGTH: Final = (8.0, 2.0, 2.0)
_FIRST_STEP_STRENGTH: Final = (4.0, 4.0)
_HALF_LIFE: Final = 200.0  # samples
# A measured sample more than this factor away from the model is clipped to it, so a
# stall or a clock jump moves the fit by one bounded step, not to the moon.
_CLIP: Final = 10.0
# Drift beyond this (log ratio: 0.4 is about 1.5x slower or faster) re-profiles.
DRIFT_THRESHOLD: Final = 0.4
_RATE_TAU_S: Final = 5.0  # the prefill-rate average's time constant

ProfileState = Literal["unprofiled", "profiling", "profiled", "failed"]


@dataclass(slots=True)
class Profiling:
    """Where profiling stands, for placement (profiled?) and for operators (why not)."""

    state: ProfileState = "unprofiled"
    reason: str | None = None
    attempts: int = 0
    last_attempt_at: float | None = None
    reprofiles: int = 0
    last_reprofile_at: float | None = None
    reprofile_wanted: bool = False


class _Rate:
    """An exponentially decaying rate (events per second), updated in O(1)."""

    __slots__ = ("_at", "_value")

    def __init__(self) -> None:
        self._value = 0.0
        self._at = 0.0

    def add(self, amount: float, now: float) -> None:
        self._value = self.value(now) + amount / _RATE_TAU_S
        self._at = now

    def value(self, now: float) -> float:
        elapsed = now - self._at
        if elapsed <= 0:
            return self._value
        return self._value * math.exp(-elapsed / _RATE_TAU_S)


@dataclass(slots=True)
class _Pending:
    features: tuple[float, float, float, float]
    estimate: float
    solo: bool  # nothing ahead of it when placed: its service time is its own


class EngineModel:
    def __init__(self, name: str) -> None:
        self.name = name
        self.profile: Profile | None = None
        self.profiling = Profiling()
        self._baseline = DEFAULT_PROFILE  # what drift is measured against
        self.prefill_fit = AnchoredLeastSquares(
            DEFAULT_PROFILE.prefill, _PREFILL_STRENGTH, half_life=_HALF_LIFE
        )
        self.tpot_fit = AnchoredLeastSquares(
            DEFAULT_PROFILE.tpot, _TPOT_STRENGTH, half_life=_HALF_LIFE
        )
        self.first_step_fit = AnchoredLeastSquares(
            DEFAULT_PROFILE.first_step, _FIRST_STEP_STRENGTH, half_life=_HALF_LIFE
        )
        self.prefill_drift = DriftScore()
        self.tpot_drift = DriftScore()
        self.lane = PrefillLane()
        self._rate = _Rate()  # prompt tokens per second placed here for prefill
        self._pending: dict[object, _Pending] = {}
        self.tpot_observed: float | None = None  # an average of what requests saw

    # --- profile --------------------------------------------------------------------------

    @property
    def profiled(self) -> bool:
        return self.profile is not None

    def install(self, profile: Profile) -> None:
        """A new baseline (first profile or re-profile): the fits restart from it."""
        self.profile = profile
        self._baseline = profile
        self.prefill_fit.reset(profile.prefill)
        self.tpot_fit.reset(profile.tpot)
        self.first_step_fit.reset(profile.first_step)
        self.prefill_drift.reset()
        self.tpot_drift.reset()
        state = self.profiling
        state.state = "profiled"
        state.reason = None
        state.reprofile_wanted = False
        if profile.kind == "reprofile":
            state.reprofiles += 1
            state.last_reprofile_at = profile.measured_monotonic

    @property
    def drift(self) -> float:
        """How much slower than its profile the engine runs now (log ratio; > 0 slower)."""
        return max(self.prefill_drift.score, self.tpot_drift.score)

    @property
    def drifted(self) -> bool:
        return (
            abs(self.prefill_drift.score) > DRIFT_THRESHOLD
            or abs(self.tpot_drift.score) > DRIFT_THRESHOLD
        )

    @property
    def penalty(self) -> float:
        """Cost multiplier for new work: 1, or more while the engine runs slow."""
        return 1.0 + max(0.0, self.drift)

    # --- predictions ----------------------------------------------------------------------

    def service(self, prompt_tokens: float, decoding: float) -> float:
        """Seconds of prefill for this prompt with nothing ahead of it."""
        x = prefill_features(prompt_tokens, decoding)
        predicted = self.prefill_fit.predict(x)
        # The fit may not wander below a fraction of its baseline (a prompt longer than
        # any it has seen, a negative quadratic term learned from noise).
        floor = 0.3 * dot(self._baseline.prefill, x)
        return max(MIN_PREFILL_S, floor, predicted)

    def backlog(self, now: float) -> float:
        return self.lane.remaining(now)

    def prefill_rate(self, now: float) -> float:
        return self._rate.value(now)

    def tpot(self, decoding: float, now: float) -> float:
        x = tpot_features(decoding, self._rate.value(now))
        floor = 0.3 * dot(self._baseline.tpot, x)
        return max(MIN_TPOT_S, floor, self.tpot_fit.predict(x))

    def first_step(self, prompt_tokens: float) -> float:
        x = first_step_features(prompt_tokens)
        return max(MIN_TPOT_S, self.first_step_fit.predict(x))

    # --- what happened --------------------------------------------------------------------

    def prefill_placed(self, key: object, prompt_tokens: int, decoding: float, now: float) -> None:
        features = prefill_features(prompt_tokens, decoding)
        estimate = self.service(prompt_tokens, decoding)
        solo = len(self.lane) == 0
        self.lane.add(key, estimate, now)
        self._pending[key] = _Pending(features, estimate, solo)
        self._rate.add(prompt_tokens, now)

    def prefill_finished(self, key: object, now: float) -> float | None:
        """The prefill of `key` finished at `now`: learn from it; its service time."""
        pending = self._pending.pop(key, None)
        measured = self.lane.finish(key, now)
        if pending is None or measured is None:
            return None
        target = _clipped(measured, pending.estimate)
        self.prefill_fit.update(pending.features, target)
        if pending.solo:
            # Alone on the engine, the measurement is this prompt's own prefill: the one
            # that says whether the engine still matches its profile.
            self.prefill_drift.add(measured, dot(self._baseline.prefill, pending.features))
        return measured

    def prefill_dropped(self, key: object) -> None:
        """A prefill that will not finish here (failed, cancelled)."""
        self._pending.pop(key, None)
        self.lane.remove(key)

    def observe_tpot(self, tpot: float, decoding: float, now: float) -> None:
        if not (math.isfinite(tpot) and tpot > 0):
            return
        x = tpot_features(decoding, self._rate.value(now))
        target = _clipped(tpot, self.tpot_fit.predict(x))
        self.tpot_fit.update(x, target)
        self.tpot_drift.add(tpot, max(MIN_TPOT_S, dot(self._baseline.tpot, x)))
        observed = self.tpot_observed
        self.tpot_observed = tpot if observed is None else observed + 0.1 * (tpot - observed)

    def observe_first_step(self, prompt_tokens: int, seconds: float) -> None:
        if not (math.isfinite(seconds) and seconds > 0):
            return
        x = first_step_features(prompt_tokens)
        self.first_step_fit.update(x, _clipped(seconds, self.first_step(prompt_tokens)))

    # --- report ---------------------------------------------------------------------------

    def view(self, now: float) -> dict[str, Any]:
        a, b, c, e = self.prefill_fit.theta
        t, u, v = self.tpot_fit.theta
        return {
            "prefill_s": {
                "base": a,
                "per_1k_tokens": b,
                "per_1k_tokens_squared": c,
                "per_100_decoding": e,
                "samples": self.prefill_fit.samples,
            },
            "tpot_s": {
                "base": t,
                "per_100_decoding": u,
                "per_10k_prefill_tokens_per_s": v,
                "samples": self.tpot_fit.samples,
            },
        }


def _clipped(measured: float, expected: float) -> float:
    if expected <= 0:
        return measured
    return min(expected * _CLIP, max(expected / _CLIP, measured))
