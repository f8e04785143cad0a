"""A decayed histogram over geometric buckets, and an online quantile tracker (sans-IO).

`DecayedHistogram` keeps a distribution of positive values (output lengths) in fixed
memory: buckets whose edges grow by a constant ratio, so the relative resolution is the
same at 10 tokens and at 10,000, and weights that decay by a constant factor per sample,
so the distribution follows a workload that changes (a half-life of a few thousand
samples) instead of averaging over all history. Decay is applied lazily: each new sample
is added with a weight that grows by 1/decay per sample, and the weights are rescaled
before they could overflow, which keeps an update O(1).

`QuantileTracker` follows one quantile of a stream by stochastic approximation in log
space: each sample above the estimate moves it up by `step * q`, each one below moves
it down by `step * (1 - q)`, so it settles where a fraction q of samples fall below.
One float of state; it tracks a distribution that drifts.
"""

from __future__ import annotations

import math
from collections.abc import Iterator


class DecayedHistogram:
    __slots__ = (
        "_counts",
        "_decay",
        "_log_ratio",
        "_lowest",
        "_scale",
        "_total",
        "_values",
        "samples",
    )

    def __init__(
        self, lowest: float, highest: float, *, ratio: float = 2**0.25, half_life: float = 2000.0
    ) -> None:
        if not (0 < lowest < highest and ratio > 1):
            raise ValueError("need 0 < lowest < highest and ratio > 1")
        self._lowest = lowest
        self._log_ratio = math.log(ratio)
        size = math.ceil(math.log(highest / lowest) / self._log_ratio) + 1
        self._counts = [0.0] * size
        self._values = [self.representative(i) for i in range(size)]  # computed once
        self._decay = 0.5 ** (1.0 / half_life)
        self._scale = 1.0  # the weight the next sample gets (grows as older ones decay)
        self._total = 0.0
        self.samples = 0

    def __len__(self) -> int:
        return len(self._counts)

    def bucket(self, value: float) -> int:
        if value <= self._lowest:
            return 0
        index = int(math.log(value / self._lowest) / self._log_ratio) + 1
        return min(index, len(self._counts) - 1)

    def lower_edge(self, index: int) -> float:
        """The smallest value of bucket `index` (0 for the first, which holds all below)."""
        if index == 0:
            return 0.0
        return self._lowest * math.exp(self._log_ratio * (index - 1))

    def representative(self, index: int) -> float:
        """The value a bucket stands for: the geometric middle of its edges."""
        if index == 0:
            return self._lowest
        return self._lowest * math.exp(self._log_ratio * (index - 0.5))

    def add(self, value: float) -> None:
        if not math.isfinite(value) or value < 0:
            return
        self._counts[self.bucket(value)] += self._scale
        self._total += self._scale
        self.samples += 1
        self._scale /= self._decay
        if self._scale > 1e100:  # rescale before the weights could overflow
            factor = 1.0 / self._scale
            self._counts = [c * factor for c in self._counts]
            self._total *= factor
            self._scale = 1.0

    def weighted(self) -> Iterator[tuple[float, float]]:
        """(representative value, weight) of every non-empty bucket, in value order;
        the weights sum to 1."""
        total = self._total
        if total <= 0:
            return
        for value, count in zip(self._values, self._counts, strict=True):
            if count > 0:
                yield value, count / total

    def quantile(self, q: float) -> float | None:
        """The q-quantile (interpolated inside its bucket); None when empty."""
        total = self._total
        if total <= 0:
            return None
        target = q * total
        seen = 0.0
        for index, count in enumerate(self._counts):
            if count <= 0:
                continue
            if seen + count >= target:
                low = self.lower_edge(index)
                high = self.lower_edge(index + 1)
                return low + (high - low) * ((target - seen) / count)
            seen += count
        return self.representative(len(self._counts) - 1)


class QuantileTracker:
    __slots__ = ("_log", "_max", "_min", "_q", "_step", "samples")

    def __init__(
        self,
        q: float,
        *,
        initial: float = 1.0,
        step: float = 0.02,
        lowest: float = 1e-3,
        highest: float = 1e3,
    ) -> None:
        if not 0 < q < 1:
            raise ValueError("q must be in (0, 1)")
        self._q = q
        self._step = step
        self._log = math.log(initial)
        self._min = math.log(lowest)
        self._max = math.log(highest)
        self.samples = 0

    @property
    def value(self) -> float:
        return math.exp(self._log)

    def add(self, value: float) -> None:
        if not (math.isfinite(value) and value > 0):
            return
        if math.log(value) > self._log:
            self._log += self._step * self._q
        else:
            self._log -= self._step * (1.0 - self._q)
        self._log = min(self._max, max(self._min, self._log))
        self.samples += 1
