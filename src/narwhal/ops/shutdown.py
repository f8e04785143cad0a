"""The shutdown sequence SIGTERM starts, in steps a load balancer or Kubernetes can follow.

1. Shutting down. `/ready` answers 503 `shutting_down`, and so does every new completion
   request (503 `router_unavailable`, Retry-After: 1); the requests waiting in the
   admission queue get that 503 at once (they were not placed: another router can take
   them sooner than this one's drain would). Every response not yet started carries
   `Connection: close`. The listener stays open for `serving.shutdown_delay_s`, so the
   endpoints controller has time to see /ready fail and stop sending here, and a request
   that comes meanwhile gets its 503 rather than a refused connection. With high
   availability the router resigns its leadership at once, so a standby takes over.
2. Draining. The listener closes (new connections are refused) and so do idle kept-alive
   connections; requests already placed run on, for up to `serving.drain_timeout_s`.
3. The drain deadline. Whatever still runs is ended (`drain.py`): a stream with one
   OpenAI-shaped error event and no `[DONE]` (counted `expired`, stage `shutdown`), a
   request whose response has not started with a 503 body. Each still ends in exactly
   one outcome.
4. Exit, once the last request has ended: the engines' clients and probes close, and a
   last log line gives the outcome counts.

SIGINT starts the same sequence. Each further SIGTERM or SIGINT moves on to the next step
at once: during the delay it ends the delay, during the drain it brings the drain
deadline to now. Both settings are read when the sequence starts, so a reload may change
them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final, Protocol

from narwhal.api.server import ClientRunner
from narwhal.config import Config
from narwhal.observability.metrics import OUTCOMES, RouterMetrics
from narwhal.ops.drain import LAST_WRITE_GRACE_S, Drain


class Router(Protocol):
    """What shuts down: a router, its decision process or one of its relay workers."""

    config: Config
    drain: Drain
    metrics: RouterMetrics

    async def stop_admitting(self) -> None: ...


log = logging.getLogger("narwhal.shutdown")
# After the drain deadline, how long aiohttp waits for handlers before it cancels them:
# time for the last writes (`LAST_WRITE_GRACE_S`) and a little more.
_CANCEL_AFTER_S: Final = LAST_WRITE_GRACE_S + 1.0


class Shutdown:
    def __init__(self, router: Router, runner: ClientRunner) -> None:
        self._router = router
        self._runner = runner
        self._signals: asyncio.Queue[None] = asyncio.Queue()
        self._deadline: asyncio.TimerHandle | None = None
        self._hurry: asyncio.Task[None] | None = None

    def signal(self) -> None:
        """A SIGTERM or SIGINT (the signal handler)."""
        self._signals.put_nowait(None)

    async def requested(self) -> None:
        """Return at the first signal."""
        await self._signals.get()

    async def hold_listener(self) -> None:
        """Step 1: refuse new work, listener open, until the delay is over."""
        router = self._router
        delay = router.config.serving.shutdown_delay_s
        await router.stop_admitting()
        if delay <= 0:
            return
        log.info(
            "shutting down: /ready answers 503 shutting_down; the listener stays open for "
            "%g s (serving.shutdown_delay_s)",
            delay,
        )
        try:
            async with asyncio.timeout(delay):
                await self._signals.get()
            log.info("shutting down: another signal; the delay ends now")
        except TimeoutError:
            pass

    def start_draining(self) -> None:
        """Steps 2 and 3: arm the drain deadline; `ClientRunner.cleanup()` then closes the
        listener and waits for the requests in flight."""
        router = self._router
        drain_s = router.config.serving.drain_timeout_s
        loop = asyncio.get_running_loop()
        self._deadline = loop.call_later(drain_s, router.drain.cut)
        self._hurry = asyncio.create_task(self._cut_on_signal(), name="narwhal-shutdown")
        self._runner.set_shutdown_timeout(drain_s + _CANCEL_AFTER_S)
        log.info(
            "shutting down: the listener is closed; requests in flight have %g s to finish "
            "(serving.drain_timeout_s)",
            drain_s,
        )

    async def finished(self) -> None:
        """Step 4, after the runner's cleanup: say how the requests ended."""
        if self._deadline is not None:
            self._deadline.cancel()
        if self._hurry is not None:
            self._hurry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._hurry
        log.info("shut down: %s", outcome_summary(self._router))

    async def _cut_on_signal(self) -> None:
        await self._signals.get()
        log.info("shutting down: another signal; the drain deadline is now")
        self._router.drain.cut()


def outcome_summary(router: Router) -> str:
    """ "offered 12; completed 10, expired 1, unavailable 1" (outcomes that happened)."""
    registry = router.metrics.registry
    offered = registry.get_sample_value("narwhal_offered_total") or 0
    counts = {
        o: registry.get_sample_value("narwhal_outcomes_total", {"outcome": o}) or 0
        for o in OUTCOMES
    }
    ended = ", ".join(f"{o} {int(n)}" for o, n in counts.items() if n) or "none"
    return f"offered {int(offered)}; outcomes: {ended}"
