"""Which engines are in the fleet while the router runs: the engine side of a reload.

Several components keep something per engine: the registry's entry (what placement reads),
the engine client, the fleet monitor's probes, and with predictive admission the
performance model and the profiler's runs, with cache-aware placement the prefix index,
and the engine's request gauges. `FleetMembership` adds and removes an engine in all of
them, in the order that keeps every reader consistent:

- added: client, probes (the first round starts at once), model, index, then the
  registry entry. It is placeable only once the monitor has seen it healthy and serving
  the model and, in predictive mode, once profiled: the same gates as at start-up.
- removed: retired at once (out of placement, state `removing` in /admin/engines); its
  requests in flight finish there, on the entry, client and connection they hold; once
  none is left, everything the engine had is released.
- replaced (same name, new URL, dialect or role): the old one leaves at once (its
  requests in flight hold what they need), the new one is added; an operator's drain
  stays with the name.
- updated in place (wave, limits, credentials, forwarding): the entry, the probes and
  the model take the new values; a new client carries the new key, the old one finishes
  the requests that hold it.

Drains and maintenance waves are operator state, not configuration: they stay as they
are (a removed engine's drain goes with it; with high availability it is in etcd and
applies again if the engine comes back).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, MutableMapping
from typing import Final

from narwhal.config import Config, EngineConfig
from narwhal.dispatch.gate import AdmissionGate
from narwhal.engines.client import EngineClient
from narwhal.engines.upstream import UpstreamPool
from narwhal.fleet.monitor import FleetMonitor
from narwhal.models.book import ModelBook
from narwhal.ops.config_changes import EngineChanges
from narwhal.profiling.runs import Profiler
from narwhal.scheduler.prefix_cache import PrefixCache
from narwhal.scheduler.registry import EngineEntry, EngineRegistry

log = logging.getLogger("narwhal.membership")
# How often a removed engine is looked at, until its last request has ended.
_RETIRE_CHECK_S: Final = 0.1


class FleetMembership:
    def __init__(
        self,
        *,
        registry: EngineRegistry,
        clients: MutableMapping[str, EngineClient],
        pool: UpstreamPool,
        monitor: FleetMonitor,
        gate: AdmissionGate,
        book: ModelBook | None = None,
        prefix: PrefixCache | None = None,
        profiler: Profiler | None = None,
        changed: Callable[[], None],
    ) -> None:
        """`changed()`: placement may have changed."""
        self._registry = registry
        self._clients = clients
        self._pool = pool
        self._monitor = monitor
        self._gate = gate
        self._book = book
        self._prefix = prefix
        self._profiler = profiler
        self._changed = changed
        self._retiring: dict[str, EngineEntry] = {}
        self._reaper: asyncio.Task[None] | None = None

    def apply(self, running: Config, new: Config, changes: EngineChanges) -> None:
        """Make the fleet `new`'s (`changes`: `config_changes.compare`'s engine part)."""
        for name in changes.removed:
            self._retire(name)
        for engine in changes.replaced:
            drained = self._leave(engine.name)
            self._join(engine, new, drained=drained)
        for engine in changes.updated:
            self._update(engine, new)
        for engine in changes.added:
            self._join(engine, new)
        # fleet.forward_client_authorization decides for every engine without its own.
        was = {e.name: running.forwards_client_authorization(e) for e in running.engines}
        touched = {e.name for e in (*changes.replaced, *changes.updated, *changes.added)}
        for engine in new.engines:
            forwards = new.forwards_client_authorization(engine)
            if engine.name not in touched and was.get(engine.name) != forwards:
                self._clients[engine.name] = self._client(engine, new)
        self._changed()

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper

    def _join(self, engine: EngineConfig, config: Config, *, drained: bool = False) -> None:
        name = engine.name
        if name in self._retiring:  # removed by an earlier reload and back already
            self._leave(name)
        self._clients[name] = self._client(engine, config)
        entry = EngineEntry(engine, drained=drained)
        entry.health = self._monitor.add(engine)
        if self._book is not None:
            entry.model = self._book.add(
                name,
                step_budget=engine.max_num_batched_tokens,
                max_sequences=engine.max_num_seqs,
            )
        if self._prefix is not None:
            self._prefix.add(name)
        self._registry.add(entry)
        self._gate.watch_engine(entry)

    def _retire(self, name: str) -> None:
        entry = self._registry.retire(name)
        if entry is None:
            return
        if _idle(entry):
            self._leave(name)
            return
        self._retiring[name] = entry
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.create_task(self._reap(), name="narwhal-retire-engines")

    def _leave(self, name: str) -> bool:
        """Release everything the engine had, at once; whether it was drained."""
        self._retiring.pop(name, None)
        entry = self._registry.remove(name)
        if self._profiler is not None:
            self._profiler.forget(name)
        self._monitor.remove(name)
        if self._book is not None:
            self._book.remove(name)
        if self._prefix is not None:
            self._prefix.remove(name)
        self._clients.pop(name, None)
        self._gate.unwatch_engine(name)
        return entry is not None and entry.drained

    def _update(self, engine: EngineConfig, config: Config) -> None:
        entry = self._registry.get(engine.name)
        if entry is None:
            return
        entry.config = engine
        self._monitor.update(engine)
        if entry.model is not None:
            entry.model.step_budget = engine.max_num_batched_tokens
            entry.model.max_sequences = engine.max_num_seqs
        self._clients[engine.name] = self._client(engine, config)
        self._registry.invalidate()

    def _client(self, engine: EngineConfig, config: Config) -> EngineClient:
        return EngineClient.configured(engine, self._pool, config)

    async def _reap(self) -> None:
        """Release each removed engine once its last request has ended."""
        while self._retiring:
            await asyncio.sleep(_RETIRE_CHECK_S)
            for name, entry in list(self._retiring.items()):
                if _idle(entry) and self._registry.get(name) is entry:
                    log.info("engine %s: its last request ended; it is out of the fleet", name)
                    self._leave(name)
                    self._changed()


def _idle(entry: EngineEntry) -> bool:
    load = entry.load
    return load.prefilling == 0 and load.decode_bound == 0
