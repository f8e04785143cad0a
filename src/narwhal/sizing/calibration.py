"""How far the text estimate is from the engines' own counts, learned per route.

The estimate is the simulator's tokenizer: exact for `narwhal sim` engines, a few tens of
per cent off for a real model's tokenizer, and off in the same direction for a given
model and workload. Two things are learned per route (chat, completion) from pairs of
(estimate, engine count):

- the factor that brings later estimates close (`ratio`, `apply`): a ratio of two
  exponentially weighted sums, engine counts over estimates, rather than an average of
  per-request ratios, so a 5-token prompt's ratio (mostly rounding) does not move it as
  much as a 5000-token prompt's;
- the interval the engines' count falls in (`bounds`): the central `COVERAGE` of the
  engine/estimate ratios of the last `WINDOW` prompts of at least `MIN_INTERVAL_TOKENS`
  estimated tokens. Until `MIN_SAMPLES` such prompts have been seen it is the wide
  `DEFAULT_BOUNDS`. Admission decides at once when its verdict is the same at both ends
  of the interval, and waits for an engine's count only when it is not.

Each pair is clamped to [1/4, 4] first, so one odd request (an image the estimate cannot
see) cannot drag the factor far; the factor and the bounds stay in that range too.
Constant memory; an observation costs a binary search and a shift of at most `WINDOW`
floats, reading the bounds two list lookups.
"""

from __future__ import annotations

import bisect
import collections
import math
from typing import Final

from narwhal.protocol.requests import Route

MIN_RATIO: Final = 0.25
MAX_RATIO: Final = 4.0
# Each new pair's weight: the factor follows a change of workload within ~50 requests.
_WEIGHT: Final = 0.05
# The bounds are learned from this many recent prompts, and trusted from MIN_SAMPLES on.
WINDOW: Final = 512
MIN_SAMPLES: Final = 32
# Share of the engines' counts the interval is to cover (what falls outside is split
# evenly over the two sides).
COVERAGE: Final = 0.99
# Shorter prompts' ratios are mostly rounding (3 tokens against 5); they would widen the
# interval for every prompt while a few tokens either way rarely change a decision.
MIN_INTERVAL_TOKENS: Final = 16
# Before enough samples: real models' tokenizers counted 0.36-0.94 of the estimate on
# English, markdown and code (5th-95th percentile, README), and tool definitions go
# uncounted by the estimate, so the upper side leaves room above it too.
DEFAULT_BOUNDS: Final = (0.3, 1.5)


class _Ratios:
    """The last `window` ratios, in arrival order and sorted, for their quantiles."""

    __slots__ = ("_order", "_sorted", "_window")

    def __init__(self, window: int) -> None:
        self._window = window
        self._order: collections.deque[float] = collections.deque()
        self._sorted: list[float] = []

    def __len__(self) -> int:
        return len(self._order)

    def add(self, ratio: float) -> None:
        if len(self._order) == self._window:
            oldest = self._order.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, oldest)]
        self._order.append(ratio)
        bisect.insort(self._sorted, ratio)

    def central(self, coverage: float) -> tuple[float, float]:
        """The smallest and largest ratio once the outer (1 - coverage) share is left
        out, half on each side, with the nearest ranks rounded outwards."""
        values = self._sorted
        tail = (1.0 - coverage) / 2.0 * (len(values) - 1)
        return values[math.floor(tail)], values[math.ceil(len(values) - 1 - tail)]


class EstimateCalibration:
    def __init__(
        self,
        weight: float = _WEIGHT,
        *,
        window: int = WINDOW,
        min_samples: int = MIN_SAMPLES,
        coverage: float = COVERAGE,
    ) -> None:
        if not 0 < weight <= 1:
            raise ValueError(f"weight must be in (0, 1], got {weight}")
        if not 1 <= min_samples <= window:
            raise ValueError(f"need 1 <= min_samples <= window, got {min_samples}, {window}")
        if not 0 < coverage <= 1:
            raise ValueError(f"coverage must be in (0, 1], got {coverage}")
        self._weight = weight
        self.min_samples = min_samples
        self._coverage = coverage
        # route -> [weighted engine counts, weighted estimates]; both 0 until a pair arrives.
        self._sums: dict[Route, list[float]] = {"chat": [0.0, 0.0], "completion": [0.0, 0.0]}
        self._ratios: dict[Route, _Ratios] = {
            "chat": _Ratios(window),
            "completion": _Ratios(window),
        }
        # The bounds, recomputed at each observation: read on every request.
        self._bounds: dict[Route, tuple[float, float]] = {
            "chat": DEFAULT_BOUNDS,
            "completion": DEFAULT_BOUNDS,
        }

    def observe(self, route: Route, estimated: int, engine_count: int) -> None:
        if estimated <= 0 or engine_count <= 0:
            return  # no information about the ratio
        self.seed(route, estimated, engine_count)
        engine = min(max(engine_count, MIN_RATIO * estimated), MAX_RATIO * estimated)
        if estimated >= MIN_INTERVAL_TOKENS:
            ratios = self._ratios[route]
            ratios.add(engine / estimated)
            if len(ratios) >= self.min_samples:
                self._bounds[route] = ratios.central(self._coverage)

    def seed(self, route: Route, estimated: int, engine_count: int) -> None:
        """A pair from text that is not a client's (the profiler's probes, counted by an
        engine before any request): it moves the factor as a request's would, so the
        first requests are sized in the engine's tokens, but not the bounds, which are
        about clients' prompts (probe texts are all alike: their ratios would make the
        interval look narrower than any workload's)."""
        if estimated <= 0 or engine_count <= 0:
            return
        engine = min(max(engine_count, MIN_RATIO * estimated), MAX_RATIO * estimated)
        sums = self._sums[route]
        keep = 1.0 - self._weight
        sums[0] = keep * sums[0] + self._weight * engine
        sums[1] = keep * sums[1] + self._weight * estimated

    def ratio(self, route: Route) -> float:
        engine, estimated = self._sums[route]
        if estimated <= 0:
            return 1.0
        return min(max(engine / estimated, MIN_RATIO), MAX_RATIO)

    def apply(self, route: Route, estimated: int) -> int:
        """The estimate corrected by the route's factor: at least 1 token."""
        return max(1, round(estimated * self.ratio(route)))

    def bounds(self, route: Route) -> tuple[float, float]:
        """(low, high): the engines' count is expected within [low, high] x the estimate
        for `COVERAGE` of prompts (`DEFAULT_BOUNDS` until `MIN_SAMPLES` prompts)."""
        return self._bounds[route]

    def samples(self, route: Route) -> int:
        """The prompts the bounds are learned from now (at most `WINDOW`)."""
        return len(self._ratios[route])

    def interval(self, route: Route, estimated: int) -> tuple[int, int, int]:
        """(tokens, low, high) for an estimate: the calibrated count and the bounds the
        engines' count is expected in, low <= tokens <= high, each at least 1 token."""
        low_ratio, high_ratio = self._bounds[route]
        tokens = self.apply(route, estimated)
        low = max(1, min(tokens, math.floor(estimated * low_ratio)))
        high = max(tokens, math.ceil(estimated * high_ratio))
        return tokens, low, high
