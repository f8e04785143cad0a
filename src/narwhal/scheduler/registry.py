"""The engine registry: who is in the fleet, who may take work, and what each is doing.

Placement eligibility (an engine may take a new request of a phase) is: healthy (the
fleet monitor's verdict, injected as a predicate), not drained, not in an active
maintenance wave, serving the configured model (every configured engine does), and of a
role that serves the phase. Drain and maintenance are operator decisions made at run
time through the admin routes; neither touches work already placed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from narwhal.config import EngineConfig
from narwhal.scheduler.placement import EngineLoad

Phase = Literal["both", "prefill", "decode"]


@dataclass(slots=True)
class EngineEntry:
    config: EngineConfig
    load: EngineLoad
    drained: bool = False


class EngineRegistry:
    def __init__(
        self,
        engines: Sequence[EngineConfig],
        healthy: Callable[[str], bool] = lambda name: True,
    ) -> None:
        self.entries: dict[str, EngineEntry] = {
            e.name: EngineEntry(e, EngineLoad(e.name)) for e in engines
        }
        self.active_waves: set[int] = set()
        self._healthy = healthy
        # Eligible engines by phase, computed once per change rather than per request.
        self._candidates: dict[Phase, list[EngineEntry]] = {}

    def get(self, name: str) -> EngineEntry | None:
        return self.entries.get(name)

    def set_health_predicate(self, healthy: Callable[[str], bool]) -> None:
        self._healthy = healthy
        self.invalidate()

    def invalidate(self) -> None:
        """Eligibility may have changed (health, drain, maintenance): recompute when asked."""
        self._candidates = {}

    def set_drained(self, name: str, drained: bool) -> bool:
        entry = self.entries.get(name)
        if entry is None:
            return False
        entry.drained = drained
        self.invalidate()
        return True

    def set_wave(self, wave: int, active: bool) -> None:
        if active:
            self.active_waves.add(wave)
        else:
            self.active_waves.discard(wave)
        self.invalidate()

    def state(self, entry: EngineEntry) -> str:
        """A word for operators: up, down, drained or maintenance."""
        if entry.config.wave is not None and entry.config.wave in self.active_waves:
            return "maintenance"
        if entry.drained:
            return "drained"
        return "up" if self._healthy(entry.config.name) else "down"

    def eligible(self, entry: EngineEntry) -> bool:
        return self.state(entry) == "up"

    def candidates(self, phase: Phase) -> list[EngineEntry]:
        """Eligible engines whose role serves `phase` (cached until `invalidate`)."""
        cached = self._candidates.get(phase)
        if cached is None:
            cached = self._candidates[phase] = [
                e for e in self.entries.values() if e.config.role == phase and self.eligible(e)
            ]
        return cached

    def whole_fleet_in_maintenance(self) -> bool:
        waves = {e.config.wave for e in self.entries.values()}
        return bool(self.entries) and None not in waves and waves <= self.active_waves
