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

    def get(self, name: str) -> EngineEntry | None:
        return self.entries.get(name)

    def set_health_predicate(self, healthy: Callable[[str], bool]) -> None:
        self._healthy = healthy

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
        """Eligible engines whose role serves `phase`."""
        return [e for e in self.entries.values() if e.config.role == phase and self.eligible(e)]

    def whole_fleet_in_maintenance(self) -> bool:
        waves = {e.config.wave for e in self.entries.values()}
        return bool(self.entries) and None not in waves and waves <= self.active_waves
