"""Projections from the engines' models, and the scorer that places by them (sans-IO).

For one request on one placement, in seconds from now:

    prefill part  = the steps until the engine has prefilled this prompt, the work ahead
                    of it included (`narwhal.models.lane`); with cache-aware placement
                    only the tokens it would not find in its prefix cache
    decode part   = (P/D) the decode engine's KV transfer and first step
    TTFT          = prefill part + decode part
    decode work   = expected output tokens x the decode engine's TPOT for the batch it
                    will decode in (requests there counted for as long as they are
                    expected to go on: decode correction)

`ProjectingScorer` is placement's cost in predictive mode: TTFT plus the decode work
(with cache-aware placement, plus the prefill work the placement adds there),
so an engine that would stream slowly is chosen only when it makes up for it in first
token; an engine whose TTFT would not fit the request's budget costs far more than any
that would; a drifting engine's cost is scaled up by its drift penalty, and one whose
TPOT would exceed `admission.tpot_target_s` by the square of its overrun.

`PrefillParts` carries the prefill parts the predictive check projected for a request
over every path to the scorer placing that request in the same decision, so each engine's
lane is walked once a decision instead of twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from narwhal.models.book import ModelBook
from narwhal.models.engine import EngineModel
from narwhal.scheduler.placement import CachedTokens, Phase, PlacementRequest
from narwhal.scheduler.registry import EngineEntry

_INFEASIBLE: Final = 1e3  # added to the cost of a placement that would miss the budget
_UNMODELLED: Final = 1e9


def decoding_on(entry: EngineEntry) -> float:
    """Sequences decoding on the engine: Narwhal's own, and any more its metrics show
    running (another router's work) beyond what Narwhal has there."""
    return entry.load.decoding + entry.unplaced()[0]


def prefill_part(entry: EngineEntry, model: EngineModel, prompt_tokens: int, now: float) -> float:
    """Seconds until the prompt's prefill would be done on the engine (its step-by-step
    lane), placed now."""
    sequences = max(entry.load.in_flight, _engine_running(entry))
    scrape = entry.scrape
    kv_usage = None if scrape is None else scrape.kv_usage
    return model.ttft(prompt_tokens, decoding_on(entry), now, sequences, kv_usage)


class PrefillParts:
    """The prefill parts projected for the request being decided, by engine and tokens.
    The predictive check projects every path; placement's scorer, placing that request in
    the same call to the decision core, reads them instead of projecting again (at the
    check's instant, microseconds earlier, on models nothing has changed since). Valid
    only within that call: the core forgets them once the decision is made, since a
    request queued is placed later, on models that have moved."""

    __slots__ = ("_parts", "_request")

    def __init__(self) -> None:
        self._request: PlacementRequest | None = None
        self._parts: dict[tuple[str, int], float] = {}

    def keep(self, request: PlacementRequest, engine: str, tokens: int, part: float) -> None:
        if request is not self._request:
            self._request = request
            self._parts = {}
        self._parts[engine, tokens] = part

    def get(self, request: PlacementRequest, engine: str, tokens: int) -> float | None:
        if request is not self._request:
            return None
        return self._parts.get((engine, tokens))

    def forget(self) -> None:
        self._request = None
        self._parts = {}


def uncached_tokens(
    prefix: CachedTokens | None, entry: EngineEntry, request: PlacementRequest
) -> int:
    """The prompt tokens the engine would have to prefill: those it would not find in its
    prefix cache (all of them without cache-aware placement)."""
    if prefix is None or request.prefix is None:
        return request.prompt_tokens
    return request.prompt_tokens - prefix.cached_tokens(entry, request)


def _engine_running(entry: EngineEntry) -> int:
    """Requests the engine runs: Narwhal's own now and what its metrics showed beyond
    them (another router's)."""
    return entry.own_requests + int(entry.unplaced()[0])


def decode_work(
    entry: EngineEntry, model: EngineModel, request: PlacementRequest, now: float
) -> float:
    """Seconds the request's expected output takes there: its tokens at the TPOT of the
    batch it will decode in, the others counted for as long as they are expected to go
    on (decode correction), plus what the engine runs that Narwhal did not place."""
    horizon = request.predicted_output
    beside = model.decoding.expected_batch(horizon, now)
    others = max(0.0, decoding_on(entry) - len(model.decoding))
    return horizon * model.tpot(beside + others + 1.0, now)


class ProjectingScorer:
    def __init__(
        self,
        book: ModelBook,
        *,
        tpot_target_s: float | None = None,
        prefix: CachedTokens | None = None,
        parts: PrefillParts | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`parts`: the check's projections of the request being decided (shared with
        the `PredictiveCheck`), None to project every placement here."""
        self._book = book
        self.tpot_target_s = tpot_target_s  # a reload may change it
        self._prefix = prefix
        self._parts = parts
        self._clock = clock

    def cost(self, entry: EngineEntry, request: PlacementRequest, phase: Phase) -> float:
        model = entry.model
        if model is None:
            return _UNMODELLED
        now = self._clock()
        cost = 0.0
        if phase != "decode":
            tokens = uncached_tokens(self._prefix, entry, request)
            parts = self._parts
            ttft = None if parts is None else parts.get(request, entry.name, tokens)
            if ttft is None:
                ttft = prefill_part(entry, model, tokens, now)
            cost += ttft
            if self._prefix is not None:
                # The prefill placed here delays every request that queues behind it:
                # recomputing a prefix that another engine holds spends the fleet's
                # capacity, which this request's own TTFT does not show. So the work
                # added counts once more, and a conversation leaves the engine holding its
                # history only for a backlog worth twice the prefill it would save.
                cost += model.solo(tokens)
            due = request.ttft_due
            if due is not None and model.upper(ttft, now) > due - now:
                cost += _INFEASIBLE
        if phase == "both" and self._prefix is not None:
            # Cache-aware: the best projected TTFT wins (with the work it adds). The
            # expected decode time would pull a conversation off the engine holding its
            # history whenever another decodes a few milliseconds a token faster; TPOT
            # counts only past admission.tpot_target_s.
            return cost * self._tpot_penalty(entry, model, now) * model.penalty
        if phase != "prefill":
            if phase == "decode":
                cost += model.first_step(request.prompt_tokens)
            cost += decode_work(entry, model, request, now) * self._tpot_penalty(entry, model, now)
        return cost * model.penalty

    def _tpot_penalty(self, entry: EngineEntry, model: EngineModel, now: float) -> float:
        target = self.tpot_target_s
        if target is None:
            return 1.0
        over = model.tpot(decoding_on(entry) + 1.0, now) / target
        return over * over if over > 1.0 else 1.0
