"""Admission decisions as a synchronous state machine (sans-IO).

    arrive()            retention limit: hold one more request, or 429 (retention)
    request_prefill(t)  start now, or wait in the queue, or 429 (queue full)
    prefill_done(t)     first token in hand: the prefill slot becomes a decode slot
    finish(t)           the request ends or leaves the queue: whatever it held is released

Every call that frees capacity returns the queued tickets that may start now, in queue
order; the caller wakes them. A request may start when a prefill slot is free and the
decode phase has room for it too (requests in prefill count against the decode limit,
since each of them will need a decode slot at its first token).

The predictive check (projected TTFT against the budget) slots in between arrive() and
request_prefill(), without changing either.
"""

from __future__ import annotations

from narwhal.admission.queue import AdmissionQueue, Ticket, TicketState
from narwhal.errors import CapacityRejected


class Admission:
    def __init__(
        self, *, max_retained: int, queue_limit: int, prefill_limit: int, decode_limit: int
    ) -> None:
        self.max_retained = max_retained
        self.prefill_limit = prefill_limit
        self.decode_limit = decode_limit
        self.queue = AdmissionQueue(queue_limit)
        self.retained = 0
        self.prefill_in_use = 0
        self.decode_in_use = 0

    def arrive(self) -> None:
        """Hold one more request, or raise 429 when the retention limit is full."""
        if self.retained >= self.max_retained:
            raise CapacityRejected(
                f"The router holds its limit of {self.max_retained} requests; retry shortly.",
                reason="retention",
            )
        self.retained += 1

    def leave(self) -> None:
        """A held request is gone (paired with every successful arrive())."""
        self.retained -= 1

    def request_prefill(self, ticket: Ticket) -> bool:
        """True: start now. False: queued. Raises 429 when the queue is full."""
        if not len(self.queue) and self._room():
            self._start(ticket)
            return True
        if not self.queue.has_room():
            raise CapacityRejected(
                f"The admission queue is full ({self.queue.limit} waiting); retry shortly.",
                reason="queue",
            )
        self.queue.push(ticket)
        return False

    def prefill_done(self, ticket: Ticket) -> list[Ticket]:
        if ticket.state is not TicketState.PREFILL:
            return []
        ticket.state = TicketState.DECODE
        self.prefill_in_use -= 1
        self.decode_in_use += 1
        return self._wake()

    def finish(self, ticket: Ticket) -> list[Ticket]:
        """Release whatever the ticket holds (a queue place, a slot); idempotent."""
        state = ticket.state
        if state is TicketState.QUEUED:
            self.queue.remove(ticket)
            return []
        ticket.state = TicketState.DONE
        if state is TicketState.PREFILL:
            self.prefill_in_use -= 1
        elif state is TicketState.DECODE:
            self.decode_in_use -= 1
        else:
            return []
        return self._wake()

    def _room(self) -> bool:
        return (
            self.prefill_in_use < self.prefill_limit
            and self.prefill_in_use + self.decode_in_use < self.decode_limit
        )

    def _start(self, ticket: Ticket) -> None:
        ticket.state = TicketState.PREFILL
        self.prefill_in_use += 1

    def _wake(self) -> list[Ticket]:
        started: list[Ticket] = []
        while self._room():
            ticket = self.queue.pop()
            if ticket is None:
                break
            self._start(ticket)
            started.append(ticket)
        return started
