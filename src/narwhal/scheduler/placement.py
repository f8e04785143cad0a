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
    """What Narwhal has placed on one engine and is still in flight."""

    name: str
    prefilling: int = 0  # requests before their first token (or the prefill answer)
    decoding: int = 0  # requests from their first token to their last event
    prefill_tokens: int = 0  # prompt tokens of the requests still prefilling
    # Corrections from the engine's own metrics (the last good scrape), when it has them.
    engine_running: float = 0.0
    engine_waiting: float = 0.0

    @property
    def in_flight(self) -> int:
        return self.prefilling + self.decoding


class Scorer(Protocol):
    def cost(self, load: EngineLoad, prompt_tokens: int) -> float: ...


class InFlightScorer:
    """Cost = the larger of Narwhal's own count of running requests and the engine's, plus
    the engine's waiting requests, plus queued prefill work in units of a typical prompt.

    Narwhal's count is exact and current; the engine's scrape is up to one probe interval
    old but sees work from other routers and requests the engine queued itself. Taking the
    larger of the two running counts uses whichever knows more.
    """

    def __init__(self, prompt_tokens_per_request: float = 1024.0) -> None:
        self._unit = prompt_tokens_per_request

    def cost(self, load: EngineLoad, prompt_tokens: int) -> float:
        running = max(load.in_flight, load.engine_running)
        return running + load.engine_waiting + load.prefill_tokens / self._unit


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
