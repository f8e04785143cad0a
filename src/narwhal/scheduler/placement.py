"""What placement decides on: the request's size, each engine's load, a scorer (sans-IO).

A `PlacementRequest` is what the scheduler knows of a request: its sized prompt, the
client's output cap and the output length Narwhal expects. `EngineLoad` is the work
Narwhal itself has on an engine, in each phase; the engine's own view (its last metrics
scrape) and its performance model live beside it on the registry's `EngineEntry`.

A `Scorer` turns an engine's state into a cost for one phase of one request; the
scheduler picks the cheapest eligible engine, breaking ties at random with the generator
it is given, so tests are exact. `InFlightScorer` counts requests; the predictive scorer
(`narwhal.models.scoring`) projects seconds instead, without changing any caller.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar

from narwhal.config import DEFAULT_TENANT
from narwhal.protocol.requests import Route

if TYPE_CHECKING:
    from narwhal.protocol.tracker import OutputTracker
    from narwhal.scheduler.prefix_index import PromptBlocks
    from narwhal.scheduler.registry import EngineEntry

Phase = Literal["both", "prefill", "decode"]


@dataclass(frozen=True, slots=True)
class PlacementRequest:
    """One request as placement sees it (sized once, at arrival)."""

    route: Route
    prompt_tokens: int
    max_tokens: int | None  # the client's output cap, when it set one
    predicted_output: float  # output tokens expected (learned), within the cap
    ttft_due: float | None = None  # monotonic time the first token is due (predictive)
    prefix: PromptBlocks | None = None  # its prompt's blocks (cache-aware placement)
    priority: int = 0  # its class's rank (admission.classes; 0: the highest)
    tenant: str = DEFAULT_TENANT  # whose it is (its fair share, admission/tenants.py)

    @classmethod
    def sized(
        cls, route: Route, prompt_tokens: int, max_tokens: int | None = None
    ) -> PlacementRequest:
        """A request whose output length is not predicted (tests, open mode before any
        learning): the cap, or one token."""
        return cls(route, prompt_tokens, max_tokens, float(max_tokens or 1))


@dataclass(frozen=True, slots=True)
class OutputSummary:
    """What an attempt produced, as learning needs it: its output tokens, whether they
    were counted exactly (token IDs or the engine's usage, not events), whether the output
    ended with a finish, and its time per output token (None under two tokens)."""

    tokens: int
    exact: bool
    complete: bool
    tpot: float | None

    @classmethod
    def of(cls, tracker: OutputTracker) -> OutputSummary:
        """What the attempt `tracker` counted came to."""
        tokens, source = tracker.output_tokens()
        return cls(tokens, source != "events", tracker.finished, tracker.time_per_output_token())


@dataclass(slots=True)
class EngineLoad:
    """What Narwhal has placed on one engine and is still in flight.

    Written only by admission (`narwhal.admission.controller`), which moves a request
    through its phases once: placed (`prefilling` here, or on its prefill engine, and
    `decode_bound` here), prefill done, first token (`decoding`), finished.
    """

    prefilling: int = 0  # requests whose prefill runs here and has not finished
    prefill_tokens: int = 0  # their prompt tokens
    decode_bound: int = 0  # requests that decode here, in prefill (here or elsewhere) or decoding
    decoding: int = 0  # of those, the ones past their first token
    # The decode-bound requests by class rank (their shares of the engine, /admin/engines).
    by_class: dict[int, int] = field(default_factory=dict)

    @property
    def in_flight(self) -> int:
        """Requests this engine works on or will work on, each counted once (a `both`
        engine's requests in prefill are in both counts; a prefill engine has no decode
        work and a decode engine no prefill work)."""
        return max(self.prefilling, self.decode_bound)


class CachedTokens(Protocol):
    def cached_tokens(self, entry: EngineEntry, request: PlacementRequest) -> int:
        """The request's prompt tokens the engine would find in its prefix cache."""
        ...


class Scorer(Protocol):
    def cost(self, entry: EngineEntry, request: PlacementRequest, phase: Phase) -> float:
        """Lower is better; compared only between engines of one phase."""
        ...


class InFlightScorer:
    """Cost = Narwhal's requests on the engine, plus the engine's running and waiting
    requests that are not Narwhal's, plus queued prefill work in units of a typical prompt.

    Narwhal's count is exact and current; the engine's scrape is up to one probe interval
    old but sees work from other routers. Only what the scrape showed beyond Narwhal's own
    requests at that moment is added (`EngineEntry.unplaced`): read against today's
    count, a request of Narwhal's that finished since the scrape would still count, and
    a conversation would leave the engine holding its history whenever the scrape caught
    its previous turn running.

    With a prefix cache (`fleet.policy: cache_aware` without predictive admission, so
    without models to price it in seconds), the prompt tokens the engine would find
    cached are prefill work it is spared, in the same unit: a long cached prefix
    outweighs a few more requests running there, not a queue of them.
    """

    def __init__(
        self, prompt_tokens_per_request: float = 1024.0, prefix: CachedTokens | None = None
    ) -> None:
        self._unit = prompt_tokens_per_request
        self._prefix = prefix

    def cost(self, entry: EngineEntry, request: PlacementRequest, phase: Phase) -> float:
        load = entry.load
        running, waiting = entry.unplaced()
        cost = entry.own_requests + running + waiting + load.prefill_tokens / self._unit
        if self._prefix is not None and phase != "decode":
            cost -= self._prefix.cached_tokens(entry, request) / self._unit
        return cost


T = TypeVar("T")


def cheapest(candidates: Sequence[T], costs: Sequence[float], rng: random.Random) -> T | None:
    """The candidate of least cost (ties broken at random), or None when there is none."""
    best: list[T] = []
    best_cost = 0.0
    for candidate, cost in zip(candidates, costs, strict=True):
        if not best or cost < best_cost:
            best, best_cost = [candidate], cost
        elif cost == best_cost:
            best.append(candidate)
    if not best:
        return None
    return best[0] if len(best) == 1 else rng.choice(best)
