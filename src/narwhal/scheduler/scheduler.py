"""Placement plans (sans-IO): one `both` engine, or a prefill engine and a decode engine.

Configuration decides the path: when the fleet has eligible prefill and decode engines,
requests take the disaggregated path (vLLM's P/D handshake); otherwise a `both` engine
serves the whole request. Within a phase the cheapest eligible engine by the scorer wins,
ties broken at random; engines at their own phase limit are skipped, and when every
eligible engine is at its limit the request must wait (`NoCapacity`).

With a prefix cache (`fleet.policy: cache_aware`), the scorers price only the prompt
tokens an engine would not find cached (`prefix_cache`), and the plan says how many it
would: admission counts the rest as that engine's prefill work.

Per-engine limits (`engines[].phase_concurrency`): `prefill` caps the requests in
prefill on the engine; `decode` caps the requests that will decode there, counted from
their placement (a request in prefill holds its decode place already, as the global
decode limit counts it too), so an engine never gets more decode work than its limit.
"""

from __future__ import annotations

import random
from collections.abc import Collection
from dataclasses import dataclass

from narwhal.scheduler.placement import InFlightScorer, Phase, PlacementRequest, Scorer, cheapest
from narwhal.scheduler.prefix_cache import PrefixCache
from narwhal.scheduler.registry import EngineEntry, EngineRegistry


@dataclass(frozen=True, slots=True)
class Plan:
    """Where a request runs: `decode` always; `prefill` too for a disaggregated pair."""

    decode: EngineEntry
    prefill: EngineEntry | None = None
    # Of the prompt, the tokens the first engine is expected to find in its prefix cache
    # (cache-aware placement): its prefill work is the rest.
    cached_tokens: int = 0

    @property
    def first(self) -> EngineEntry:
        """The engine that works on the request first (its prefill)."""
        return self.prefill or self.decode

    @property
    def engine_names(self) -> tuple[str, ...]:
        """The engines it runs on, the prefill half first."""
        if self.prefill is None:
            return (self.decode.name,)
        return (self.prefill.name, self.decode.name)

    def describe(self) -> str:
        """For logs: "engine d0", or "prefill p0, decode d0"."""
        if self.prefill is None:
            return f"engine {self.decode.name}"
        return f"prefill {self.prefill.name}, decode {self.decode.name}"


class NoCapacity(Exception):
    """Eligible engines exist, but every one is at its own phase limit: wait for one."""


class Scheduler:
    def __init__(
        self,
        registry: EngineRegistry,
        scorer: Scorer | None = None,
        rng: random.Random | None = None,
        *,
        round_robin: bool = False,
        prefix: PrefixCache | None = None,
    ) -> None:
        self.registry = registry
        self.prefix = prefix
        self.scorer: Scorer = scorer or InFlightScorer(prefix=prefix)
        self._rng = rng or random.Random()
        self._round_robin = round_robin
        self._turn: dict[Phase, int] = {}

    def has_path(self) -> bool:
        """Whether any request could be placed now (ignoring per-engine limits)."""
        registry = self.registry
        if registry.candidates("prefill") and registry.candidates("decode"):
            return True
        return bool(registry.candidates("both"))

    def could_place(self, exclude: Collection[str] = ()) -> bool:
        """Whether an eligible placement avoiding `exclude` exists, room or not."""
        registry = self.registry
        if _any_left(registry.candidates("prefill"), exclude) and _any_left(
            registry.candidates("decode"), exclude
        ):
            return True
        return _any_left(registry.candidates("both"), exclude)

    def plan(self, request: PlacementRequest, exclude: Collection[str] = ()) -> Plan | None:
        """A placement avoiding the engines in `exclude` (they failed this request);
        None when no eligible engine is left, NoCapacity when all are at their limits.
        A plan returned is taken: the prefix index records the prompt on its first engine."""
        registry = self.registry
        prefills = registry.candidates("prefill")
        decodes = registry.candidates("decode")
        # Whether a pair is left at all is decided before whether it has room: a full
        # prefill engine must not make a request wait whose every decode engine failed it.
        if _any_left(prefills, exclude) and _any_left(decodes, exclude):
            prefill = self._pick(prefills, "prefill", request, exclude)
            decode = self._pick(decodes, "decode", request, exclude)
            if prefill is not None and decode is not None:
                return self._taken(request, decode, prefill)
        boths = registry.candidates("both")
        if not boths:
            return None
        engine = self._pick(boths, "both", request, exclude)
        return None if engine is None else self._taken(request, engine)

    def _taken(
        self, request: PlacementRequest, decode: EngineEntry, prefill: EngineEntry | None = None
    ) -> Plan:
        prefix = self.prefix
        if prefix is None or request.prefix is None:
            return Plan(decode=decode, prefill=prefill)
        first = prefill or decode
        cached = prefix.cached_tokens(first, request)
        prefix.placed(first, request, cached)
        return Plan(decode=decode, prefill=prefill, cached_tokens=cached)

    def _pick(
        self,
        entries: list[EngineEntry],
        phase: Phase,
        request: PlacementRequest,
        exclude: Collection[str],
    ) -> EngineEntry | None:
        # A retry goes to another placement, never back to an engine that failed it.
        fresh = [e for e in entries if e.name not in exclude] if exclude else entries
        if not fresh:
            return None
        open_ = [e for e in fresh if has_room(e, phase)]
        if not open_:
            raise NoCapacity()
        if self._round_robin:
            turn = self._turn.get(phase, 0)
            self._turn[phase] = turn + 1
            return open_[turn % len(open_)]
        if len(open_) == 1:
            return open_[0]
        scorer = self.scorer
        costs = [scorer.cost(e, request, phase) for e in open_]
        return cheapest(open_, costs, self._rng)


def _any_left(entries: list[EngineEntry], exclude: Collection[str]) -> bool:
    return any(e.name not in exclude for e in entries) if exclude else bool(entries)


def has_room(entry: EngineEntry, phase: Phase) -> bool:
    """Whether the engine's own limits admit one more request of `phase`."""
    limits = entry.config.phase_concurrency
    load = entry.load
    if phase != "decode" and limits.prefill is not None and load.prefilling >= limits.prefill:
        return False
    return not (
        phase != "prefill" and limits.decode is not None and load.decode_bound >= limits.decode
    )
