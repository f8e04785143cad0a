"""Choosing an engine for a request (sans-IO).

A `Scorer` turns an engine's state into a cost; the scheduler picks the cheapest eligible
engine, breaking ties at random with the generator it is given, so tests are exact.
The default scorer counts the work Narwhal itself has placed on the engine; prediction
replaces it with a projected TTFT/TPOT without changing callers.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(slots=True)
class EngineLoad:
    """What Narwhal has in flight on one engine."""

    name: str
    in_flight: int = 0
    prefill_tokens: int = 0  # prompt tokens placed and not yet past their first token


class Scorer(Protocol):
    def cost(self, load: EngineLoad, prompt_tokens: int) -> float: ...


class InFlightScorer:
    """Cost = requests in flight, plus in-flight prefill work in units of a typical prompt."""

    def __init__(self, prompt_tokens_per_request: float = 1024.0) -> None:
        self._unit = prompt_tokens_per_request

    def cost(self, load: EngineLoad, prompt_tokens: int) -> float:
        return load.in_flight + load.prefill_tokens / self._unit


def choose(
    candidates: Sequence[EngineLoad],
    scorer: Scorer,
    prompt_tokens: int,
    rng: random.Random,
) -> EngineLoad | None:
    """The cheapest candidate (ties broken at random), or None when there is none."""
    best: list[EngineLoad] = []
    best_cost = 0.0
    for load in candidates:
        cost = scorer.cost(load, prompt_tokens)
        if not best or cost < best_cost:
            best, best_cost = [load], cost
        elif cost == best_cost:
            best.append(load)
    if not best:
        return None
    return best[0] if len(best) == 1 else rng.choice(best)
