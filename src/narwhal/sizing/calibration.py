"""How far the text estimate is from the engines' own counts, learned per route.

The estimate is the simulator's tokenizer: exact for `narwhal sim` engines, a few tens of
per cent off for a real model's tokenizer, and off in the same direction for a given
model and workload. So one factor per route (chat, completion), learned from pairs of
(estimate, engine count), brings later estimates close.

The factor is a ratio of two exponentially weighted sums, engine counts over estimates,
rather than an average of per-request ratios: a 5-token prompt's ratio is mostly rounding
and should not move the factor as much as a 5000-token prompt's. Each pair is clamped to
[1/4, 4] first, so one odd request (an image the estimate cannot see) cannot drag the
factor far; the factor stays in that range too. Constant time and memory per observation.
"""

from __future__ import annotations

from typing import Final

from narwhal.protocol.requests import Route

MIN_RATIO: Final = 0.25
MAX_RATIO: Final = 4.0
# Each new pair's weight: the factor follows a change of workload within ~50 requests.
_WEIGHT: Final = 0.05
EXACT_AFTER: Final = 32


class EstimateCalibration:
    def __init__(self, weight: float = _WEIGHT) -> None:
        if not 0 < weight <= 1:
            raise ValueError(f"weight must be in (0, 1], got {weight}")
        self._weight = weight
        # route -> [weighted engine counts, weighted estimates]; both 0 until a pair arrives.
        self._sums: dict[Route, list[float]] = {"chat": [0.0, 0.0], "completion": [0.0, 0.0]}
        # Pairs in a row where the estimate was the engine's count exactly, per route.
        self._exact: dict[Route, int] = {"chat": 0, "completion": 0}

    def observe(self, route: Route, estimated: int, engine_count: int) -> None:
        if estimated <= 0 or engine_count <= 0:
            return  # no information about the ratio
        self._exact[route] = self._exact[route] + 1 if estimated == engine_count else 0
        engine = min(max(engine_count, MIN_RATIO * estimated), MAX_RATIO * estimated)
        sums = self._sums[route]
        keep = 1.0 - self._weight
        sums[0] = keep * sums[0] + self._weight * engine
        sums[1] = keep * sums[1] + self._weight * estimated

    def exact(self, route: Route) -> bool:
        """Whether the estimate has been the engines' own count, exactly, for the last
        `EXACT_AFTER` prompts of the route (the engines run the simulator's tokenizer,
        or one that counts the same): then asking them is a round trip for nothing."""
        return self._exact[route] >= EXACT_AFTER

    def ratio(self, route: Route) -> float:
        engine, estimated = self._sums[route]
        if estimated <= 0:
            return 1.0
        return min(max(engine / estimated, MIN_RATIO), MAX_RATIO)

    def apply(self, route: Route, estimated: int) -> int:
        """The estimate corrected by the route's factor: at least 1 token."""
        return max(1, round(estimated * self.ratio(route)))
