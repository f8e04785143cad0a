"""Drift scoring (sans-IO): how far an engine has moved from its profile.

Each quantity (prefill time, TPOT) keeps an exponentially weighted mean of the log of
observed / what the profile predicts for the same conditions. Logs make "twice as slow"
and "half as fast" the same size and keep one absurd sample (a 10-minute stall, a clock
step) from dominating: each residual is clipped to a factor of `clip` either way before
it is averaged, so a score stays finite and comes back once samples are normal again.

The score is the mean, with a sign: positive when the engine is slower than its profile.
It counts only after `min_samples`, so two odd requests do not take an engine down.
"""

from __future__ import annotations

import collections
import math
from typing import Final

# Drift beyond this (log ratio: 0.3 is about 1.35x slower or faster) re-profiles.
DRIFT_THRESHOLD: Final = 0.3
# Solo prefills whose prompt lengths are kept for the next profile's probe sizes, and how
# many it takes to name one (`DriftWatch.probe_size_hint`).
_HINT_SAMPLES: Final = 64
_HINT_MIN: Final = 8


class DriftScore:
    __slots__ = ("_alpha", "_clip", "_min_samples", "samples", "value")

    def __init__(self, *, alpha: float = 0.1, min_samples: int = 8, clip: float = 10.0) -> None:
        self._alpha = alpha
        self._min_samples = min_samples
        self._clip = math.log(clip)
        self.value = 0.0
        self.samples = 0

    def add(self, observed: float, expected: float) -> None:
        if not (math.isfinite(observed) and math.isfinite(expected)):
            return
        if observed <= 0 or expected <= 0:
            return
        residual = max(-self._clip, min(self._clip, math.log(observed / expected)))
        self.samples += 1
        # The first samples average plainly, so the score does not start at a bias of 0.
        alpha = max(self._alpha, 1.0 / self.samples)
        self.value += alpha * (residual - self.value)

    @property
    def score(self) -> float:
        """The drift, once enough samples say so; 0 before."""
        return self.value if self.samples >= self._min_samples else 0.0

    def reset(self) -> None:
        self.value = 0.0
        self.samples = 0


class DriftWatch:
    """One engine's drift from its baseline: prefill (solo prefills) and TPOT scores, and
    the prompt lengths the prefill score was measured on."""

    __slots__ = ("_solo_prompts", "prefill", "tpot")

    def __init__(self) -> None:
        self.prefill = DriftScore()
        self.tpot = DriftScore()
        self._solo_prompts: collections.deque[int] = collections.deque(maxlen=_HINT_SAMPLES)

    def solo_prefill(self, prompt_tokens: int, observed: float, expected: float) -> None:
        self.prefill.add(observed, expected)
        self._solo_prompts.append(prompt_tokens)

    def reset(self) -> None:
        """Scores from nothing (a new baseline); the prompt lengths seen stay."""
        self.prefill.reset()
        self.tpot.reset()

    @property
    def score(self) -> float:
        """How much slower than its baseline the engine runs now (log ratio; > 0 slower)."""
        return max(self.prefill.score, self.tpot.score)

    @property
    def drifted(self) -> bool:
        return abs(self.prefill.score) > DRIFT_THRESHOLD or abs(self.tpot.score) > DRIFT_THRESHOLD

    def probe_size_hint(self) -> int | None:
        """A probe length for the next profile: the 90th percentile of the prompts the
        drift was measured on (the last solo prefills), so the fit measures prompts of
        their length rather than extrapolating from shorter ones (a line through
        64-2,048-token probes misses the attention's quadratic share at 3,000: drift, a
        re-profile that measures the same, drift again). None while fewer than _HINT_MIN
        have been seen."""
        if len(self._solo_prompts) < _HINT_MIN:
            return None
        lengths = sorted(self._solo_prompts)
        return lengths[int(0.9 * (len(lengths) - 1))]
