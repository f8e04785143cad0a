"""The engine registry: who is in the fleet, who may take work, and each engine's view.

Each engine has one `EngineEntry`, the one place its state is read from: its
configuration, the work Narwhal has placed there (`load`, written only by admission),
the fleet monitor's live health and last good metrics scrape (written only by the
monitor), and its performance model (written only by what learns: the model book's
listener and the profiler).

Placement eligibility (an engine may take a new request of a phase) is: placeable by
the fleet monitor (healthy, metrics fresh, serving the model), ready by any other gate
the router adds (predictive admission: profiled), not drained, not in an active
maintenance wave, and of a role that serves the phase. Drain and maintenance are
operator decisions made at run time through the admin routes; neither touches work
already placed.

A configuration reload adds engines (`add`) and removes them: a removed engine is first
`retire`d (state `removing`: out of placement at once, its requests in flight finish
there), then taken out of the registry (`remove`) once nothing runs there. A request in
flight holds its engines' entries, so it finishes and releases on them whatever the
registry holds by then.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from narwhal.config import EngineConfig
from narwhal.protocol.dialects import DialectCapabilities, capabilities
from narwhal.scheduler.placement import EngineLoad, Phase

if TYPE_CHECKING:
    from narwhal.fleet.scrape import EngineScrape
    from narwhal.fleet.state import EngineHealth
    from narwhal.models.engine import EngineModel


@dataclass(slots=True, eq=False)
class EngineEntry:
    config: EngineConfig
    load: EngineLoad = field(default_factory=EngineLoad)
    health: EngineHealth | None = None  # the fleet monitor's live state; read, never written
    model: EngineModel | None = None  # performance model (predictive admission), the book's
    drained: bool = False
    retiring: bool = False  # removed from the configuration; its requests still finish

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def capabilities(self) -> DialectCapabilities:
        """What the engine can do: its dialect's, as the fleet monitor resolved them from
        what it reported (`narwhal.fleet.state.EngineHealth.capabilities`). Every request
        and probe reads this one object: the upstream body, the tracker's IDs, the
        exposure's nulls, the tokenize route, what /admin/engines reports."""
        health = self.health
        if health is not None and health.capabilities is not None:
            return health.capabilities
        return capabilities(self.config.dialect)

    @property
    def scrape(self) -> EngineScrape | None:
        """The engine's load as its own metrics last said (None: never read)."""
        return None if self.health is None else self.health.last_scrape

    def unplaced(self) -> tuple[float, float]:
        """(running, waiting): the requests the engine's last scrape showed beyond
        Narwhal's own there as it answered: another router's, or work sent to the engine
        directly. Compared with Narwhal's count at that moment, not now, a request of
        Narwhal's that finished since is not taken for someone else's. Narwhal's own are
        taken from the running count first (the engine may be running them already)."""
        scrape = self.scrape
        if scrape is None or self.health is None:
            return 0.0, 0.0
        own = float(self.health.own_at_scrape)
        running = scrape.running or 0.0
        waiting = scrape.waiting or 0.0
        beyond_running = running - own
        if beyond_running >= 0.0:
            return beyond_running, waiting
        return 0.0, max(0.0, waiting + beyond_running)

    @property
    def own_requests(self) -> int:
        """Narwhal's requests the engine holds now: in prefill (queued there or
        running) or decoding."""
        return self.load.prefilling + self.load.decoding


class EngineRegistry:
    def __init__(
        self,
        engines: Sequence[EngineConfig],
        healthy: Callable[[str], bool] = lambda name: True,
    ) -> None:
        self.entries: dict[str, EngineEntry] = {e.name: EngineEntry(e) for e in engines}
        self.active_waves: set[int] = set()
        self._healthy = healthy
        self._ready: Callable[[EngineEntry], bool] = lambda entry: True
        # Eligible engines by phase, computed once per change rather than per request.
        self._candidates: dict[Phase, list[EngineEntry]] = {}

    def get(self, name: str) -> EngineEntry | None:
        return self.entries.get(name)

    def set_health_predicate(self, healthy: Callable[[str], bool]) -> None:
        self._healthy = healthy
        self.invalidate()

    def set_ready_predicate(self, ready: Callable[[EngineEntry], bool]) -> None:
        """A further gate on placement (predictive admission: the engine is profiled);
        call `invalidate()` whenever its answer may have changed."""
        self._ready = ready
        self.invalidate()

    def invalidate(self) -> None:
        """Eligibility may have changed (health, drain, maintenance): recompute when asked."""
        self._candidates = {}

    def add(self, entry: EngineEntry) -> None:
        """A new engine (a reload): placeable once every predicate says so."""
        self.entries[entry.name] = entry
        self.invalidate()

    def retire(self, name: str) -> EngineEntry | None:
        """Take the engine out of placement for good; it stays listed until `remove`."""
        entry = self.entries.get(name)
        if entry is not None:
            entry.retiring = True
            self.invalidate()
        return entry

    def remove(self, name: str) -> EngineEntry | None:
        entry = self.entries.pop(name, None)
        self.invalidate()
        return entry

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
        """A word for operators: up, down, drained, maintenance, unprofiled or removing."""
        if entry.retiring:
            return "removing"
        if entry.config.wave is not None and entry.config.wave in self.active_waves:
            return "maintenance"
        if entry.drained:
            return "drained"
        if not self._healthy(entry.config.name):
            return "down"
        return "up" if self._ready(entry) else "unprofiled"

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

    def max_model_len(self) -> int | None:
        """The longest context every engine a request may be placed on takes: the smallest
        `max_model_len` the eligible engines' /v1/models gave (with none eligible, the
        smallest of any engine still listed); None while no engine has said."""
        eligible = [
            *self.candidates("both"),
            *self.candidates("prefill"),
            *self.candidates("decode"),
        ]
        known = _context_lengths(eligible)
        if not known:
            known = _context_lengths(e for e in self.entries.values() if not e.retiring)
        return min(known) if known else None

    def whole_fleet_in_maintenance(self) -> bool:
        engines = [e for e in self.entries.values() if not e.retiring]
        waves = {e.config.wave for e in engines}
        return bool(engines) and None not in waves and waves <= self.active_waves


def _context_lengths(entries: Iterable[EngineEntry]) -> list[int]:
    return [
        e.health.max_model_len
        for e in entries
        if e.health is not None and e.health.max_model_len is not None
    ]
