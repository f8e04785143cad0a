"""The drain deadline of a shutdown, shared by every request in flight.

After SIGTERM the router lets admitted requests finish for `serving.drain_timeout_s`
(`shutdown.py`). Each request keeps its own deadline; what runs against it (a stream
being relayed, an attempt waiting for its engine's answer) does so under
`drain.timeout_at(deadline)`, an `asyncio.timeout_at` the drain knows of. `cut()`, at the
drain deadline, brings every one of them forward to that instant, so each request ends
the way its own deadline would have ended it, through the same code: a stream whose
headers went out gets one error event and no `[DONE]` (relayed events are written whole
from the engine connection's callback, so the timeout falls between two of them, never
inside one); a request without headers yet gets its status. `cut_short(deadline)` tells
the two causes apart, so the client hears that the router is shutting down rather than
that its own deadline passed. Subscribers hear of the cut too (the admission queue's
waiters are refused then).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from types import TracebackType
from typing import Final

log = logging.getLogger("narwhal.drain")
# After the cut, how long the last write of a request (a stream's error event) may wait for
# a client that is not reading, before its connection is aborted instead.
LAST_WRITE_GRACE_S: Final = 1.0


class Drain:
    def __init__(self) -> None:
        self.cut_at: float | None = None  # loop time of the cut, once it happened
        self._live: set[asyncio.Timeout] = set()
        self._subscribers: list[Callable[[], None]] = []

    def timeout_at(self, deadline: float) -> DrainTimeout:
        """`asyncio.timeout_at(deadline)` (loop time) that the cut brings forward."""
        return DrainTimeout(self, deadline)

    def cut_short(self, deadline: float) -> bool:
        """Whether the cut came before `deadline`: a timeout then was the drain's."""
        return self.cut_at is not None and self.cut_at < deadline

    def last_write_by(self, deadline: float) -> float:
        """The deadline for a request's last write: its own, or shortly after the cut."""
        if self.cut_at is None:
            return deadline
        return min(deadline, self.cut_at + LAST_WRITE_GRACE_S)

    def subscribe(self, callback: Callable[[], None]) -> None:
        """Call `callback()` once, at the cut."""
        self._subscribers.append(callback)

    def cut(self) -> None:
        """The drain deadline is now: every request still running ends (idempotent)."""
        if self.cut_at is not None:
            return
        now = self.cut_at = asyncio.get_running_loop().time()
        running = len(self._live)
        for timeout in list(self._live):
            when = timeout.when()
            if when is not None and when <= now:
                continue  # expiring already: its own deadline came first
            timeout.reschedule(now)
        if running:
            log.warning("drain deadline: ending %d request(s) still running", running)
        for callback in list(self._subscribers):
            try:
                callback()
            except Exception:
                log.exception("drain: subscriber raised")


class DrainTimeout:
    """One request's timeout, known to the drain while it runs."""

    __slots__ = ("_drain", "_timeout")

    def __init__(self, drain: Drain, deadline: float) -> None:
        self._drain = drain
        cut_at = drain.cut_at
        self._timeout = asyncio.timeout_at(deadline if cut_at is None else min(deadline, cut_at))

    async def __aenter__(self) -> DrainTimeout:
        await self._timeout.__aenter__()
        self._drain._live.add(self._timeout)
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._drain._live.discard(self._timeout)
        await self._timeout.__aexit__(kind, error, traceback)
