"""Drains and maintenance waves, as the operator set them through the admin routes.

Without high availability they live in this router's memory, as they always have. With
`ha.backend: etcd` they live in etcd under the fleet's key, one key per drained engine
(`<key>/drained/<engine>`) and per wave in maintenance (`<key>/maintenance/<wave>`), so
that the standby which takes over drains the same engines. A change made through any
router's admin routes is written to etcd first and applied locally once etcd has it; the
active router reads the whole set back on winning and at every lease renewal, so a
change made through another router reaches it within one renewal interval.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from narwhal.errors import NarwhalError
from narwhal.ha.etcd import EtcdClient, EtcdError, EtcdUnavailable
from narwhal.scheduler.registry import EngineRegistry

log = logging.getLogger("narwhal.operator_state")


class OperatorStateUnavailable(NarwhalError):
    status = 503
    error_type = "server_error"
    code = "operator_state_unavailable"
    default_retry_after = 1


class OperatorState:
    def __init__(self, registry: EngineRegistry, changed: Callable[[], None]) -> None:
        """`changed()`: placement may have changed."""
        self._registry = registry
        self._changed = changed
        self._store: EtcdClient | None = None
        self._prefix = self._drained_prefix = self._waves_prefix = ""

    def share(self, store: EtcdClient, key: str) -> None:
        """From now on, keep the state in etcd under the fleet's `key`."""
        self._store = store
        self._prefix = f"{key}/"
        self._drained_prefix = f"{key}/drained/"
        self._waves_prefix = f"{key}/maintenance/"

    async def set_drained(self, name: str, drained: bool) -> bool:
        """Drain or undrain engine `name`; False when there is no such engine."""
        if self._registry.get(name) is None:
            return False
        key = self._drained_prefix + name
        await self._write(key, drained)
        self._registry.set_drained(name, drained)
        self._changed()
        return True

    async def set_wave(self, wave: int, active: bool) -> set[int]:
        await self._write(self._waves_prefix + str(wave), active)
        self._registry.set_wave(wave, active)
        self._changed()
        return set(self._registry.active_waves)

    async def load(self) -> None:
        """Adopt the shared state from etcd (a no-op without it). Raises EtcdUnavailable or
        EtcdError when etcd cannot be read, leaving the local state as it was."""
        if self._store is None:
            return
        drained: set[str] = set()
        waves: set[int] = set()
        for kv in await self._store.get_prefix(self._prefix):
            if kv.key.startswith(self._drained_prefix):
                drained.add(kv.key[len(self._drained_prefix) :])
            elif kv.key.startswith(self._waves_prefix):
                try:
                    waves.add(int(kv.key[len(self._waves_prefix) :]))
                except ValueError:
                    log.warning("operator state: ignoring key %s (not a wave number)", kv.key)
        registry = self._registry
        changed = False
        for name, entry in registry.entries.items():
            if entry.drained != (name in drained):
                changed = True
                registry.set_drained(name, name in drained)
        for wave in registry.active_waves ^ waves:
            changed = True
            registry.set_wave(wave, wave in waves)
        if changed:
            log.info(
                "operator state from etcd: drained %s, maintenance waves %s",
                sorted(drained) or "none",
                sorted(waves) or "none",
            )
            self._changed()

    async def _write(self, key: str, present: bool) -> None:
        if self._store is None:
            return
        try:
            if present:
                await self._store.put(key, b"1")
            else:
                await self._store.delete(key)
        except (EtcdUnavailable, EtcdError) as e:
            raise OperatorStateUnavailable(
                f"The change could not be saved to etcd, so it was not applied: {e}"
            ) from None
