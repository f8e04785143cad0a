"""The async side of admission: waiting in the queue with a deadline, waking who may start.

The decisions are `Admission`'s (sans-IO); this class only parks each queued request on a
future and resolves the futures the controller names. A request leaves the queue when it
is granted a slot, when its admission wait or original deadline expires (504
terminal_expiry) or when its client goes away (the task is cancelled); in each case
exactly what it held is released.
"""

from __future__ import annotations

import asyncio

from narwhal.admission.controller import Admission
from narwhal.admission.queue import Ticket, TicketState
from narwhal.config import Config
from narwhal.errors import CapacityRejected, TerminalExpiry
from narwhal.metrics import RouterMetrics


class AdmissionGate:
    def __init__(self, config: Config, metrics: RouterMetrics) -> None:
        admission = config.admission
        self.controller = Admission(
            max_retained=config.serving.max_retained,
            queue_limit=admission.queue_limit,
            prefill_limit=admission.phase_concurrency.prefill,
            decode_limit=admission.phase_concurrency.decode,
        )
        self._wait_timeout = admission.wait_timeout_s
        self._metrics = metrics
        self._waiters: dict[Ticket, asyncio.Future[None]] = {}
        c = self.controller
        # Read at scrape time: nothing to update on the hot path.
        metrics.retained.set_function(lambda: c.retained)
        metrics.queue_depth.set_function(lambda: len(c.queue))
        metrics.prefill_slots.set_function(lambda: c.prefill_in_use)
        metrics.decode_slots.set_function(lambda: c.decode_in_use)

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
        """Return once the ticket holds a prefill slot; `deadline` is the request's (loop time).

        Raises 429 when the queue is full and 504 when the admission wait or the deadline
        expires first.
        """
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            granted = self.controller.request_prefill(ticket)
        except CapacityRejected as rejection:
            self._metrics.rejected.labels(rejection.reason).inc()
            raise
        if not granted:
            await self._wait(ticket, started, deadline)
        self._metrics.admission_wait.observe(loop.time() - started)

    async def _wait(self, ticket: Ticket, started: float, deadline: float) -> None:
        wait_until = started + self._wait_timeout
        stage = "admission_wait" if wait_until < deadline else "deadline_before_headers"
        future = asyncio.get_running_loop().create_future()
        self._waiters[ticket] = future
        try:
            async with asyncio.timeout_at(min(wait_until, deadline)):
                await future
        except TimeoutError:
            if ticket.state is TicketState.QUEUED:
                self.controller.finish(ticket)
                self._metrics.expired.labels(stage).inc()
                raise TerminalExpiry(
                    "The request expired waiting for admission."
                    if stage == "admission_wait"
                    else "The request deadline expired before the response started."
                ) from None
            # Granted in the same instant the wait expired: take the slot.
        finally:
            self._waiters.pop(ticket, None)

    def first_token(self, ticket: Ticket) -> None:
        """The first output is in hand: the prefill slot becomes a decode slot."""
        self._wake(self.controller.prefill_done(ticket))

    def release(self, ticket: Ticket) -> None:
        """The request is over: free whatever it holds (idempotent)."""
        self._wake(self.controller.finish(ticket))

    def _wake(self, tickets: list[Ticket]) -> None:
        for ticket in tickets:
            future = self._waiters.get(ticket)
            if future is not None and not future.done():
                future.set_result(None)
