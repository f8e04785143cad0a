"""Output-length learning (sans-IO): how many tokens requests like this one generate.

Validated output lengths (from token IDs; for `token_accounting: unavailable` engines,
from usage when the engine reported it) are learned per route and prompt-size class,
each class a `DecayedHistogram` of lengths: memory is fixed (routes x classes x
buckets), an update is O(1) and a prediction O(buckets).

What the rest of Narwhal asks:
- `predict(route, prompt, cap)`: the expected output, E[min(L, cap)], for placement (the
  decode work a request brings) before it starts;
- `remaining(route, prompt, produced, cap)`: decode correction, the expected tokens still
  to come for a request that has produced `produced`, E[min(L, cap) - k | L > k]. A
  request past its predicted length is not assumed to end at once: the expectation is
  taken over the lengths longer than what it has produced, and past every length seen,
  a request is expected to go on for half again what it has produced (the longer
  something has run, the longer it is likely to run), within its cap.

A class with too few samples borrows from the route's classes together, and before any
sample the guess is `DEFAULT_OUTPUT`, within the cap.
"""

from __future__ import annotations

from typing import Final

from narwhal.models.histogram import DecayedHistogram
from narwhal.protocol.requests import Route

DEFAULT_OUTPUT: Final = 256.0  # tokens, before anything is learned
# Prompt-size classes: upper bounds in tokens (the last class is everything above).
PROMPT_CLASSES: Final = (256, 1024, 4096, 16384)
MIN_SAMPLES: Final = 20  # fewer than this in a class: use the whole route's histogram
_HIGHEST: Final = 1 << 20


def prompt_class(prompt_tokens: int) -> int:
    for index, bound in enumerate(PROMPT_CLASSES):
        if prompt_tokens < bound:
            return index
    return len(PROMPT_CLASSES)


class OutputLengths:
    def __init__(self, *, half_life: float = 2000.0) -> None:
        self._classes: dict[Route, list[DecayedHistogram]] = {
            route: [
                DecayedHistogram(1.0, _HIGHEST, half_life=half_life)
                for _ in range(len(PROMPT_CLASSES) + 1)
            ]
            for route in ("chat", "completion")
        }
        self._routes: dict[Route, DecayedHistogram] = {
            route: DecayedHistogram(1.0, _HIGHEST, half_life=half_life)
            for route in ("chat", "completion")
        }

    def observe(self, route: Route, prompt_tokens: int, length: int) -> None:
        if length < 0:
            return
        self._classes[route][prompt_class(prompt_tokens)].add(float(length))
        self._routes[route].add(float(length))

    def _histogram(self, route: Route, prompt_tokens: int) -> DecayedHistogram | None:
        own = self._classes[route][prompt_class(prompt_tokens)]
        if own.samples >= MIN_SAMPLES:
            return own
        whole = self._routes[route]
        return whole if whole.samples else None

    def predict(self, route: Route, prompt_tokens: int, cap: int | None) -> float:
        """Expected output tokens, E[min(L, cap)] (at least 1)."""
        histogram = self._histogram(route, prompt_tokens)
        if histogram is None:
            return max(1.0, min(DEFAULT_OUTPUT, cap or DEFAULT_OUTPUT))
        limit = float(cap) if cap else float("inf")
        expected = sum(min(value, limit) * weight for value, weight in histogram.weighted())
        return max(1.0, expected)

    def variation(self) -> float:
        """The lengths' coefficient of variation (standard deviation over mean), over
        both routes: how far one request's output is from its expectation, relatively.
        Before any sample: 1 (as wide as the mean itself)."""
        samples = [h for h in self._routes.values() if h.samples]
        if not samples:
            return 1.0
        histogram = max(samples, key=lambda h: h.samples)
        mean = square = 0.0
        for value, weight in histogram.weighted():
            mean += value * weight
            square += value * value * weight
        if mean <= 0:
            return 1.0
        return float(max(0.0, square - mean * mean) ** 0.5 / mean)

    def remaining(self, route: Route, prompt_tokens: int, produced: int, cap: int | None) -> float:
        """Expected tokens still to come after `produced` (at least 1 while under the cap)."""
        room = float(cap - produced) if cap else float("inf")
        if room <= 0:
            return 0.0
        histogram = self._histogram(route, prompt_tokens)
        if histogram is None:
            return max(1.0, min(room, max(DEFAULT_OUTPUT - produced, produced * 0.5)))
        mass = 0.0
        total = 0.0
        for value, weight in histogram.weighted():
            if value > produced:
                mass += weight
                total += weight * min(value - produced, room)
        if mass <= 0.0:
            return max(1.0, min(room, produced * 0.5))  # past everything seen
        return max(1.0, total / mass)
