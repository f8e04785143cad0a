"""How one engine's TTFT projections turn out, and the bound admission uses (sans-IO).

Every request placed on an engine is projected there at placement (`raw`, seconds from
placement to its first token) and measured at its first token. The error is neither
purely multiplicative (a rate the model has wrong: long projections are off by more) nor
purely additive (a step in progress, a scheduling hiccup of the host: short projections
are off by a few milliseconds that would be a large ratio). So the error is followed as

    r = (measured + s) / (raw + s)          s = `additive_s` (a tenth of the budget)

which is a ratio for projections much longer than s and a difference for shorter ones.
Its distribution is kept in a decayed histogram (`narwhal.models.histogram`), so it
follows an engine that changes, and gives

    expected(raw) = (raw + s) * median(r) - s
    upper(raw)    = (raw + s) * q(r) - s,   q the `quantile` (0.99) of r

Before `_FIRM` samples the bound cannot be read from the histogram (its 99th percentile
of 20 samples is their maximum, and says little): it is the larger of the histogram's
value and a prior margin that fades as samples come (`prior` at none, 1 at `_FIRM`), so a
new engine is admitted cautiously and not forever.

The histogram's quantile is read lazily: it is recomputed after every `_REFRESH` samples,
so the bound costs O(1) per projection and O(buckets) every few requests.
"""

from __future__ import annotations

import math
from typing import Final

from narwhal.models.histogram import DecayedHistogram

_FIRM: Final = 200  # samples after which the histogram alone says the bound
_REFRESH: Final = 8  # samples between two readings of the histogram's quantiles
_HALF_LIFE: Final = 1500.0  # samples
_LOWEST: Final = 0.05
_HIGHEST: Final = 50.0


class Calibration:
    __slots__ = (
        "_histogram",
        "_median",
        "_since",
        "_upper",
        "additive_s",
        "prior",
        "quantile",
    )

    def __init__(self, *, additive_s: float, quantile: float = 0.995, prior: float = 1.3) -> None:
        if not (additive_s > 0 and 0.5 < quantile < 1 and prior >= 1):
            raise ValueError("need additive_s > 0, 0.5 < quantile < 1 and prior >= 1")
        self.additive_s = additive_s
        self.quantile = quantile
        self.prior = prior
        self._histogram = _histogram()
        self._median = 1.0
        self._upper = prior
        self._since = 0

    @property
    def samples(self) -> int:
        return self._histogram.samples

    def add(self, raw: float, measured: float) -> None:
        """A projection (seconds) and what it turned into (seconds, same origin)."""
        if not (math.isfinite(raw) and math.isfinite(measured)) or raw < 0 or measured < 0:
            return
        s = self.additive_s
        self._histogram.add((measured + s) / (raw + s))
        self._since += 1
        if self._since >= _REFRESH or self._histogram.samples <= _REFRESH:
            self._refresh()

    def _refresh(self) -> None:
        self._since = 0
        histogram = self._histogram
        median = histogram.quantile(0.5)
        upper = histogram.quantile(self.quantile)
        if median is None or upper is None:
            return
        self._median = median
        # A prior that fades linearly over the first _FIRM samples.
        firm = min(1.0, histogram.samples / _FIRM)
        prior = self.prior + (1.0 - self.prior) * firm
        self._upper = max(upper, prior, median)

    @property
    def factor(self) -> float:
        """The ratio `upper` applies (the bound's margin, for operators)."""
        return self._upper

    @property
    def bias(self) -> float:
        return self._median

    def expected(self, raw: float) -> float:
        s = self.additive_s
        return max(0.0, (raw + s) * self._median - s)

    def upper(self, raw: float, lateness: float = 1.0) -> float:
        """The bound: `lateness` (>= 1) widens it further while the engine's requests in
        flight are already later than their own bounds said (see `EngineModel`)."""
        s = self.additive_s
        return max(raw, (raw + s) * self._upper * max(1.0, lateness) - s)

    def reset(self) -> None:
        """A new engine behind the name (it restarted, it was re-profiled)."""
        self._histogram = _histogram()
        self._median = 1.0
        self._upper = self.prior
        self._since = 0


def _histogram() -> DecayedHistogram:
    return DecayedHistogram(_LOWEST, _HIGHEST, ratio=2 ** (1 / 16), half_life=_HALF_LIFE)
