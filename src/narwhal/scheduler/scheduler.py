"""Placement plans (sans-IO): one `both` engine, or a prefill engine and a decode engine.

Configuration decides the path: when the fleet has eligible prefill and decode engines,
requests take the disaggregated path (vLLM's P/D handshake); otherwise a `both` engine
serves the whole request. Within a phase the cheapest eligible engine by the scorer wins,
ties broken at random; engines at their own phase limit are skipped.
"""

from __future__ import annotations

import random
from collections.abc import Collection
from dataclasses import dataclass

from narwhal.scheduler.placement import InFlightScorer, Scorer, choose
from narwhal.scheduler.registry import EngineEntry, EngineRegistry, Phase


@dataclass(frozen=True, slots=True)
class Plan:
    """Where a request runs: `decode` always; `prefill` too for a disaggregated pair."""

    decode: EngineEntry
    prefill: EngineEntry | None = None


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
    ) -> None:
        self.registry = registry
        self.scorer = scorer or InFlightScorer()
        self._rng = rng or random.Random()
        self._round_robin = round_robin
        self._turn: dict[Phase, int] = {}

    def has_path(self) -> bool:
        """Whether any request could be placed now (ignoring per-engine limits)."""
        registry = self.registry
        if registry.candidates("prefill") and registry.candidates("decode"):
            return True
        return bool(registry.candidates("both"))

    def plan(self, prompt_tokens: int, exclude: Collection[str] = ()) -> Plan | None:
        """A placement, None when no engine is eligible, NoCapacity when all are busy."""
        registry = self.registry
        prefills = registry.candidates("prefill")
        decodes = registry.candidates("decode")
        if prefills and decodes:
            # A retry takes a new pair; a fleet with one prefill engine may reuse it.
            prefill = self._pick(prefills, "prefill", prompt_tokens, ())
            decode = self._pick(decodes, "decode", prompt_tokens, exclude)
            if prefill is not None and decode is not None:
                return Plan(decode=decode, prefill=prefill)
        boths = registry.candidates("both")
        if not boths:
            return None
        engine = self._pick(boths, "both", prompt_tokens, exclude)
        return None if engine is None else Plan(decode=engine)

    def _pick(
        self,
        entries: list[EngineEntry],
        phase: Phase,
        prompt_tokens: int,
        exclude: Collection[str],
    ) -> EngineEntry | None:
        # A retry goes to another placement, never back to an engine that just failed it.
        fresh = [e for e in entries if e.config.name not in exclude]
        if not fresh:
            return None
        open_ = [e for e in fresh if _has_room(e, phase)]
        if not open_:
            raise NoCapacity()
        if self._round_robin:
            turn = self._turn.get(phase, 0)
            self._turn[phase] = turn + 1
            return open_[turn % len(open_)]
        by_name = {e.config.name: e for e in open_}
        load = choose([e.load for e in open_], self.scorer, prompt_tokens, self._rng)
        return None if load is None else by_name[load.name]


def _has_room(entry: EngineEntry, phase: Phase) -> bool:
    limits = entry.config.phase_concurrency
    load = entry.load
    prefill_full = limits.prefill is not None and load.prefilling >= limits.prefill
    decode_full = limits.decode is not None and load.decoding >= limits.decode
    if phase == "prefill":
        return not prefill_full
    if phase == "decode":
        return not decode_full
    return not (prefill_full or decode_full)
