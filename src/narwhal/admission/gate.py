"""The async side of admission: waiting in the queue with a deadline, waking who may go.

The decisions are `Admission`'s (sans-IO); this class parks each queued request on a
future and resolves the futures the controller names, placed or unplaceable. A request
leaves the queue when it is placed, when its admission wait or original deadline expires
(504 terminal_expiry), when no eligible engine is left for it (`Unplaceable`) or when
its client goes away (the task is cancelled); in each case exactly what it held is
released. Times passed to the controller come from `clock` (time.monotonic); deadlines
are the event loop's clock, which is what asyncio's timers use.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from narwhal.admission.controller import Admission, Wakeups
from narwhal.admission.queue import Ticket, TicketState
from narwhal.errors import CapacityRejected, TerminalExpiry
from narwhal.observability.metrics import RouterMetrics
from narwhal.scheduler.registry import EngineEntry


class Unplaceable(Exception):
    """No eligible engine is left for this request (none at all, or every one failed it)."""


class AdmissionGate:
    def __init__(
        self,
        controller: Admission,
        metrics: RouterMetrics,
        *,
        wait_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.controller = controller
        self.wait_timeout_s = wait_timeout_s  # the admission wait (a reload may change it)
        self._metrics = metrics
        self._clock = clock
        self._waiters: dict[Ticket, asyncio.Future[None]] = {}
        c = controller
        # Read at scrape time: nothing to update on the hot path.
        metrics.retained.set_function(lambda: c.retained)
        metrics.queue_depth.set_function(lambda: len(c.queue))
        metrics.prefill_slots.set_function(lambda: c.prefill_in_use)
        metrics.decode_slots.set_function(lambda: c.decode_in_use)
        for entry in c.scheduler.registry.entries.values():
            self.watch_engine(entry)

    def watch_engine(self, entry: EngineEntry) -> None:
        """Export the engine's requests by phase (from the start, or once it is added)."""
        load = entry.load
        requests = self._metrics.engine_requests
        requests.labels(entry.name, "prefill").set_function(lambda: load.prefilling)
        requests.labels(entry.name, "decode").set_function(lambda: load.decoding)

    def unwatch_engine(self, name: str) -> None:
        """The engine left the fleet: its series go."""
        for phase in ("prefill", "decode"):
            self._metrics.engine_requests.remove(name, phase)

    def hold(self) -> None:
        """Count the request against the retention limit, or raise 429 (retention)."""
        try:
            self.controller.arrive()
        except CapacityRejected as rejection:
            self._metrics.rejected.labels(rejection.reason).inc()
            raise

    def unhold(self) -> None:
        self.controller.leave()

    async def admit(self, ticket: Ticket, deadline: float) -> None:
        """Return once the ticket is placed (`ticket.plan`); `deadline` is the request's
        (loop time). Raises 429 when the queue is full, 504 when the admission wait or the
        deadline expires first, and Unplaceable when no eligible engine is left."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            wakeups = self.controller.start(ticket, self._clock())
        except CapacityRejected as rejection:
            self._metrics.rejected.labels(rejection.reason).inc()
            raise
        await self._settle(ticket, wakeups, started, deadline)
        self._metrics.admission_wait.observe(loop.time() - started)

    async def retry(self, ticket: Ticket, failed: str, deadline: float) -> None:
        """Place a ticket whose attempt failed on engine `failed` again, elsewhere; the
        same waits and errors as `admit` (but never a full queue: it was admitted)."""
        wakeups = self.controller.retry(ticket, failed, self._clock())
        await self._settle(ticket, wakeups, asyncio.get_running_loop().time(), deadline)

    async def _settle(
        self, ticket: Ticket, wakeups: Wakeups, started: float, deadline: float
    ) -> None:
        self._wake(wakeups, ticket)
        if ticket in wakeups.unplaceable:
            raise Unplaceable()
        if ticket.state is TicketState.QUEUED:
            await self._wait(ticket, started, deadline)

    async def _wait(self, ticket: Ticket, started: float, deadline: float) -> None:
        wait_until = started + self.wait_timeout_s
        stage = "admission_wait" if wait_until < deadline else "deadline_before_headers"
        future = asyncio.get_running_loop().create_future()
        self._waiters[ticket] = future
        try:
            async with asyncio.timeout_at(min(wait_until, deadline)):
                await future
        except TimeoutError:
            if ticket.state is TicketState.QUEUED:
                self.controller.finish(ticket, self._clock())
                self._metrics.expired.labels(stage).inc()
                raise TerminalExpiry(
                    "The request expired waiting for admission."
                    if stage == "admission_wait"
                    else "The request deadline expired before the response started."
                ) from None
            if ticket.state is not TicketState.PREFILL:
                raise Unplaceable() from None
            # Placed in the same instant the wait expired: take the placement.
        finally:
            self._waiters.pop(ticket, None)
            if future.done() and not future.cancelled():
                future.exception()  # retrieved, whoever raised first

    def prefill_answered(self, ticket: Ticket) -> None:
        """A P/D pair's prefill engine answered: its slot there is free."""
        self._wake(self.controller.prefill_answered(ticket, self._clock()))

    def first_token(self, ticket: Ticket) -> None:
        """The first output is in hand: the prefill slot becomes a decode slot."""
        self._wake(self.controller.first_token(ticket, self._clock()))

    def release(self, ticket: Ticket) -> None:
        """The request is over: free whatever it holds (idempotent)."""
        self._wake(self.controller.finish(ticket, self._clock()))

    def refuse_waiting(self, error: Callable[[], Exception]) -> None:
        """Fail every queued request with `error()` (the router stopped admitting); each
        leaves the queue as its own handler unwinds and releases it."""
        for ticket, future in list(self._waiters.items()):
            if ticket.state is TicketState.QUEUED and not future.done():
                future.set_exception(error())

    def reconsider(self) -> None:
        """Engines came or went: place or fail the waiting requests accordingly."""
        self._wake(self.controller.reconsider(self._clock()))

    def _wake(self, wakeups: Wakeups, caller: Ticket | None = None) -> None:
        for ticket in wakeups.started:
            future = self._waiters.get(ticket)
            if future is not None and not future.done():
                future.set_result(None)
        for ticket in wakeups.unplaceable:
            if ticket is caller:
                continue
            future = self._waiters.get(ticket)
            if future is not None and not future.done():
                future.set_exception(Unplaceable())
