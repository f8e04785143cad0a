"""Reloading the configuration file while the router runs: SIGHUP and `POST /admin/reload`.

The file is read and checked off the event loop, as `narwhal serve` reads it at start-up
(every problem in the file, the secrets it names; the messages `check-config` prints),
then compared with the running configuration (`config_changes`), and a key that cannot
change live is a problem too. A reload with any problem changes nothing: the running
configuration stays, each problem is logged as one ERROR line, and `POST /admin/reload`
answers 400 with them. Otherwise the router applies the new configuration
(`Router.reload`) and one INFO line says what changed. No request is dropped: a stream
in flight keeps the engine, client and connection it has. Reloads run one at a time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

from narwhal.config import Config, ConfigError
from narwhal.errors import InvalidRequest

log = logging.getLogger("narwhal.reload")


class ReloadRefused(InvalidRequest):
    """The configuration was not reloaded; `problems` says why, one line each."""

    code = "invalid_configuration"

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems = tuple(problems)
        super().__init__(
            "The configuration was not reloaded; the running one stays: " + "; ".join(self.problems)
        )


class ConfigReloader:
    def __init__(
        self,
        source: Callable[[], Config] | None,
        apply: Callable[[Config], Awaitable[list[str]]],
    ) -> None:
        """`source()`: the configuration file read and checked (blocking; ConfigError with
        every problem), None when the router runs without one (the embedded default);
        `apply(config)`: what changed, or ConfigError when it cannot change live."""
        self._source = source
        self._apply = apply
        self._lock = asyncio.Lock()
        self._signalled: set[asyncio.Task[None]] = set()

    async def reload(self, trigger: str = "POST /admin/reload") -> list[str]:
        """Re-read the file and apply it; what changed. ReloadRefused: nothing did."""
        async with self._lock:
            try:
                if self._source is None:
                    raise ConfigError(
                        "narwhal serve runs the embedded default: there is no configuration "
                        "file to re-read (start it with --config FILE)"
                    )
                config = await asyncio.to_thread(self._source)
                changes = await self._apply(config)
            except ConfigError as e:
                for problem in e.problems:
                    log.error("configuration not reloaded (%s): %s", trigger, problem)
                raise ReloadRefused(e.problems) from None
            log.info(
                "configuration reloaded (%s): %s", trigger, "; ".join(changes) or "nothing changed"
            )
            return changes

    def signalled(self) -> None:
        """SIGHUP: reload in the background (the log says how it went)."""
        task = asyncio.create_task(self._quietly("SIGHUP"), name="narwhal-reload")
        self._signalled.add(task)
        task.add_done_callback(self._signalled.discard)

    async def _quietly(self, trigger: str) -> None:
        try:
            await self.reload(trigger)
        except ReloadRefused:
            pass  # logged already
        except Exception:
            log.exception("configuration reload (%s) failed", trigger)
