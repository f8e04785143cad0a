"""Reloading the configuration file while the router runs: SIGHUP and `POST /admin/reload`.

The file is read and checked off the event loop, as `narwhal serve` reads it at start-up
(every problem in the file, the secrets it names; the messages `check-config` prints),
then compared with the running configuration (`config_changes`), and a key that cannot
change live is a problem too: a file with other problems is still compared, key by key as
far as each can be read, so that one refusal names everything to fix (the command line's
flags apply to it as they do at start-up). A reload with any problem changes nothing: the running
configuration stays, each problem is logged as one ERROR line, and `POST /admin/reload`
answers 400 with them. Otherwise the router applies the new configuration
(`Router.reload`) and one INFO line says what changed. No request is dropped: a stream
in flight keeps the engine, client and connection it has. Reloads run one at a time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

from narwhal.config import Config, ConfigError, config_as_written, load_config
from narwhal.errors import InvalidRequest
from narwhal.ops.config_changes import compare

log = logging.getLogger("narwhal.reload")

# The configuration file read again and checked, given the running configuration
# (blocking; ConfigError with every problem).
Source = Callable[[Config], Config]


def file_source(path: str, flags: Callable[[Config], Config]) -> Source:
    """The file at `path` as it is now, with the command line's `flags` applied. When the
    file has problems, the restart-only keys it changes (as far as each can be read) are
    among them: the refusal names everything a restart or an edit must fix."""

    def source(running: Config) -> Config:
        try:
            return flags(load_config(path))
        except ConfigError as e:
            try:
                written = flags(config_as_written(path, running))
            except ConfigError:  # a flag's value conflicts with what the file says
                raise e from None
            restart = compare(running, written).restart
            raise ConfigError(*e.problems, *restart) from None

    return source


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
        source: Source | None,
        running: Callable[[], Config],
        apply: Callable[[Config], Awaitable[list[str]]],
    ) -> None:
        """`source(running)`: the configuration file read and checked, None when the router
        runs without one (the embedded default); `running()`: the configuration served now;
        `apply(config)`: what changed, or ConfigError when it cannot change live."""
        self._source = source
        self._running = running
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
                config = await asyncio.to_thread(self._source, self._running())
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
