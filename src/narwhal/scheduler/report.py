"""What `GET /admin/engines` says about each engine: configuration, state, load, scores.

Everything is read from the registry's `EngineEntry` (the one view of an engine) and the
fleet monitor's report; nothing here decides anything. It lives beside the registry it
reads: the admin route gets it as a callable, and the api imports no scheduler.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from narwhal.scheduler.placement import PlacementRequest
from narwhal.scheduler.predictive import decoding_on
from narwhal.scheduler.registry import EngineEntry, EngineRegistry
from narwhal.scheduler.scheduler import Scheduler

if TYPE_CHECKING:
    from narwhal.fleet.monitor import FleetMonitor

# The scores are an engine's cost for this reference request (an empty prompt).
_REFERENCE = PlacementRequest.sized("chat", 0)


class EngineReport:
    def __init__(
        self,
        registry: EngineRegistry,
        scheduler: Scheduler,
        monitor: FleetMonitor | None = None,
        class_names: Callable[[], Sequence[str]] = lambda: (),
    ) -> None:
        """`class_names()`: the priority classes, highest first, to name the requests on
        each engine by class."""
        self._class_names = class_names
        self._registry = registry
        self._scheduler = scheduler
        self.monitor = monitor

    def __call__(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        return [self._engine(entry, now) for entry in self._registry.entries.values()]

    def _engine(self, entry: EngineEntry, now: float) -> dict[str, Any]:
        names = self._class_names()
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
            "token_accounting": entry.capabilities.token_accounting,
            "profile": _profile(entry, now),
            "profiling": _profiling(entry, now),
            "scores": {
                "cost": self._scheduler.scorer.cost(entry, _REFERENCE, engine.role),
                "prefilling": load.prefilling,
                "decoding": load.decoding,
                "decode_bound": load.decode_bound,
                "prefill_tokens": load.prefill_tokens,
                "decode_bound_by_class": {
                    name: load.by_class.get(rank, 0) for rank, name in enumerate(names)
                },
                **_model_scores(entry, now),
            },
            "monitoring": self.monitor.report(engine.name, now) if self.monitor else None,
            "prefix_cache": self._prefix_cache(entry),
        }

    def _prefix_cache(self, entry: EngineEntry) -> dict[str, Any] | None:
        """The engine's prefix index beside the engine's own hit ratio (cache_aware)."""
        prefix = self._scheduler.prefix
        if prefix is None:
            return None
        prefix.follow(entry)
        return prefix.report(entry.name)


def _profile(entry: EngineEntry, now: float) -> dict[str, Any] | None:
    model = entry.model
    if model is None or model.profile is None:
        return None
    return {**model.profile.view(now), "learned": model.view(now)}


def _profiling(entry: EngineEntry, now: float) -> dict[str, Any] | None:
    model = entry.model
    if model is None:
        return None  # admission open: nothing is profiled
    state = model.profiling
    return {
        "state": state.state,
        "reason": state.reason,
        "attempts": state.attempts,
        "reprofiles": state.reprofiles,
        "last_reprofile_age_s": _age(state.last_reprofile_at, now),
        "reprofile_wanted": state.reprofile_wanted,
        "last_reason": state.last_reason,
        "runs": state.probe_runs,
        "probe_tokens": state.probe_tokens,
        "idle_probes": model.idle_refusals.probes,
    }


def _model_scores(entry: EngineEntry, now: float) -> dict[str, Any]:
    """What the predictive models say of the engine now (nothing in open mode)."""
    model = entry.model
    if model is None:
        return {}
    decoding = decoding_on(entry)
    return {
        "backlog_s": model.backlog(now, decoding),
        "tpot_predicted_s": model.tpot(decoding + 1.0, now),
        "tpot_observed_s": model.tpot_observed,
        "decode_work_tokens": model.decoding.work(now),
        "drift": {
            "prefill": model.prefill_drift.score,
            "tpot": model.tpot_drift.score,
            "score": model.drift,
            "penalty": model.penalty,
            "drifted": model.drifted,
        },
    }


def _age(at: float | None, now: float) -> float | None:
    return None if at is None else round(max(0.0, now - at), 3)
