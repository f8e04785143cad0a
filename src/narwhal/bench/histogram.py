"""A histogram of durations in fixed logarithmic bins, for figures too many to keep.

Inter-token gaps run to one per output event of every request, far more values
than the report may hold for a long run, so they are counted here instead: the
memory is the same whatever the run's size. Bins are `BINS_PER_DECADE` to a
decade from `LOW_S` to `HIGH_S` (values outside go to the first or the last
bin); zeros (and negative values, which a clock cannot give) are counted apart
and stay exactly 0.

A percentile is computed as `stats.percentile` does over the sorted values
(linear between closest ranks), each value taken as its bin's geometric middle
clamped to the exact extremes of the values above 0: within half a bin, about 1.2%, of
the exact percentile. Count, mean, minimum and maximum (so p0 and p100) are exact.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import Counter
from collections.abc import Sequence
from functools import partial

BINS_PER_DECADE = 100
LOW_S = 1e-6
HIGH_S = 1e3
_BINS = round(math.log10(HIGH_S / LOW_S)) * BINS_PER_DECADE
# Bin i is [_EDGES[i], _EDGES[i + 1]).
_EDGES = [LOW_S * 10 ** (i / BINS_PER_DECADE) for i in range(_BINS + 1)]
# The bin of a value: how many inner edges are at or below it, found by a binary search
# in C (no Python-level arithmetic per value), clamped to the range by construction.
_bin_of = partial(bisect_right, _EDGES[1:_BINS])


def bin_index(value: float) -> int:
    """The bin a positive value falls in (clamped to the range)."""
    return _bin_of(value)


def bin_edges(index: int) -> tuple[float, float]:
    """A bin's lower and upper edges."""
    return _EDGES[index], _EDGES[index + 1]


class LogHistogram:
    """Counts of non-negative durations (seconds); see the module docstring."""

    __slots__ = ("_counts", "_least", "_sum", "count", "max", "min", "zeros")

    def __init__(self) -> None:
        self._counts = [0] * _BINS
        self._sum = 0.0
        self._least = math.nan  # the smallest value above 0
        self.count = 0
        self.zeros = 0  # values of 0 (or below)
        self.min = math.nan
        self.max = math.nan

    def add(self, value: float) -> None:
        if value > 0.0:
            self.add_all((value,))
        elif value <= 0.0:  # not NaN
            self.add_all((), zeros=1)

    def add_all(self, values: Sequence[float], zeros: int = 0) -> None:
        """Add positive `values` (others are skipped) and `zeros` values of 0.

        A request's gaps are added at once, binned and counted in C: this runs per
        request on the load generator's own CPU."""
        kept = [v for v in values if v > 0.0] if values and not min(values) > 0.0 else values
        if kept:
            counts = self._counts
            for index, n in Counter(map(_bin_of, kept)).items():
                counts[index] += n
            self._sum += math.fsum(kept)
            self.count += len(kept)
            low, high = min(kept), max(kept)
            if not low >= self._least:  # NaN at first
                self._least = low
            if not low >= self.min:
                self.min = low
            if not high <= self.max:
                self.max = high
        if zeros > 0:
            self.count += zeros
            self.zeros += zeros
            self.min = 0.0
            if not self.max >= 0.0:
                self.max = 0.0

    @property
    def mean(self) -> float:
        return self._sum / self.count if self.count else math.nan

    def _value_at(self, position: int) -> float:
        """The (approximate) value at a 0-based position among the sorted values; the
        first and the last are the exact extremes."""
        if position <= 0:
            return self.min
        if position >= self.count - 1:
            return self.max
        if position < self.zeros:
            return 0.0
        seen = self.zeros
        for index, n in enumerate(self._counts):
            seen += n
            if position < seen:
                low, high = bin_edges(index)
                return min(max(math.sqrt(low * high), self._least), self.max)
        return self.max

    def percentile(self, p: float) -> float:
        """The p-th percentile (0 <= p <= 100); NaN when empty."""
        if not self.count:
            return math.nan
        rank = (self.count - 1) * p / 100.0
        low = math.floor(rank)
        frac = rank - low
        value = self._value_at(low)
        if frac == 0.0:
            return value
        return value + (self._value_at(min(low + 1, self.count - 1)) - value) * frac

    def cumulative(self) -> list[tuple[float, float]]:
        """(upper edge, fraction of values at or below it) for each non-empty bin, the edge
        clamped to the maximum: the points of a CDF; the zeros are the fraction below the
        first point."""
        points: list[tuple[float, float]] = []
        if not self.count:
            return points
        seen = self.zeros
        for index, n in enumerate(self._counts):
            if n:
                seen += n
                points.append((min(bin_edges(index)[1], self.max), seen / self.count))
        return points
