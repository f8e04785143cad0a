"""An exponentially decaying rate (sans-IO): events (or amounts, such as prompt tokens)
per second, over about the last `tau_s` seconds, updated and read in O(1)."""

from __future__ import annotations

import math


class DecayingRate:
    __slots__ = ("_at", "_tau", "_value")

    def __init__(self, *, tau_s: float) -> None:
        self._tau = tau_s
        self._value = 0.0
        self._at = 0.0

    def add(self, amount: float, now: float) -> None:
        self._value = self.value(now) + amount / self._tau
        self._at = now

    def value(self, now: float) -> float:
        elapsed = now - self._at
        if elapsed <= 0:
            return self._value
        return self._value * math.exp(-elapsed / self._tau)
