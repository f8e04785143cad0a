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

import math


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
