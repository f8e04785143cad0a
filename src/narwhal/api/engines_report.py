"""What `GET /admin/engines` says about each engine: configuration, state, load, scores.

Everything is read from the registry's `EngineEntry` (the one view of an engine) and the
fleet monitor's report; nothing here decides anything.
"""

from __future__ import annotations

import time
from typing import Any

from narwhal.fleet.monitor import FleetMonitor
from narwhal.protocol.dialects import token_accounting
from narwhal.scheduler.placement import PlacementRequest
from narwhal.scheduler.registry import EngineEntry, EngineRegistry
from narwhal.scheduler.scheduler import Scheduler

# The scores are an engine's cost for this reference request (an empty prompt).
_REFERENCE = PlacementRequest.sized("chat", 0)


class EngineReport:
    def __init__(self, registry: EngineRegistry, scheduler: Scheduler) -> None:
        self._registry = registry
        self._scheduler = scheduler
        self.monitor: FleetMonitor | None = None  # set once the monitor runs

    def __call__(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        return [self._engine(entry, now) for entry in self._registry.entries.values()]

    def _engine(self, entry: EngineEntry, now: float) -> dict[str, Any]:
        engine = entry.config
        load = entry.load
        registry = self._registry
        return {
            "name": engine.name,
            "url": engine.url,
            "dialect": engine.dialect,
            "role": engine.role,
            "wave": engine.wave,
            "state": registry.state(entry),
            "eligible": registry.eligible(entry),
            "token_accounting": token_accounting(engine.dialect),
            "profile": None,
            "scores": {
                "cost": self._scheduler.scorer.cost(entry, _REFERENCE, engine.role),
                "prefilling": load.prefilling,
                "decoding": load.decoding,
                "decode_bound": load.decode_bound,
                "prefill_tokens": load.prefill_tokens,
            },
            "monitoring": self.monitor.report(engine.name, now) if self.monitor else None,
        }
