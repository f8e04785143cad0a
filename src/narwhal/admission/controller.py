"""Admission decisions as a synchronous state machine (sans-IO), placement included.

    arrive()                 retention limit: hold one more request, or 429 (retention)
    start(t, now)            placed now, queued, 429 (queue full) or unplaceable
    prefill_answered(t, now) a P/D pair's prefill engine is done with it
    first_token(t, now)      the prefill slot becomes a decode slot
    retry(t, failed, now)    the attempt failed before headers: placed again elsewhere
    finish(t, now)           the request ends or leaves the queue: all it held is released
    reconsider(now)          eligibility changed (health, drain, maintenance, profiles)

A request starts when the router has a global prefill slot for it, the decode phase has
room too (requests in prefill count against the decode limit, since each will need a
decode slot at its first token), and the scheduler finds an engine (or a P/D pair) with
room under its own limits. Otherwise it waits in the one admission queue, under
`queue_limit` and the admission wait, whatever it is waiting for: a global slot or an
engine's. There is no second queue: engine limits are checked here, not by the caller.

Priority classes (`classes.py`): a ticket's class orders the queue (`queue.py`), and the
prefill slots reserved for the classes above it (`admission.reserved_prefill`) and not in
use by them are not its to take.

Every call that frees capacity returns a `Wakeups`: the queued tickets that were placed
(in queue order) and those that can no longer be placed anywhere (every eligible engine
failed them, or none is left); the caller wakes them. A waking pass stops at the first
ticket that finds no room, unless that ticket is a retry confined to fewer engines than
the others, so a newcomer never overtakes a request that could use the same engines.

The controller moves each ticket through its phases and keeps both the global counts
and every engine's `EngineLoad` in step; nothing else writes them. A `PlacementListener`
(the performance models) hears of each transition with its time, in the same call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from narwhal.admission.queue import AdmissionQueue, Ticket, TicketState
from narwhal.errors import CapacityRejected
from narwhal.scheduler.scheduler import NoCapacity, Plan, Scheduler


class PlacementListener(Protocol):
    def placed(self, ticket: Ticket, plan: Plan, now: float) -> None: ...

    def prefill_answered(self, ticket: Ticket, plan: Plan, now: float) -> None: ...

    def first_token(self, ticket: Ticket, plan: Plan, now: float) -> None: ...

    def released(self, ticket: Ticket, plan: Plan, now: float, *, decoded: bool) -> None:
        """The placement ended: request finished or failed (`decoded`: past its first
        token), or an attempt is retried elsewhere."""
        ...


@dataclass(slots=True)
class Wakeups:
    started: list[Ticket] = field(default_factory=list)
    unplaceable: list[Ticket] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.started or self.unplaceable)


class Admission:
    def __init__(
        self,
        scheduler: Scheduler,
        *,
        max_retained: int,
        queue_limit: int,
        prefill_limit: int,
        decode_limit: int,
        listener: PlacementListener | None = None,
        reserved_prefill: Callable[[int], int] | None = None,
        weight: Callable[[str], float] | None = None,
        aging_s: float | None = None,
    ) -> None:
        """`reserved_prefill(rank)`: the prefill slots reserved for that class (kept free
        for it, from the classes below, while it does not use them); `weight`,
        `aging_s`: the queue's (`queue.py`)."""
        self.scheduler = scheduler
        self.max_retained = max_retained
        self.prefill_limit = prefill_limit
        self.decode_limit = decode_limit
        self.reserved_prefill = reserved_prefill or (lambda rank: 0)
        self.queue = AdmissionQueue(queue_limit, weight=weight, aging_s=aging_s)
        self.listener = listener
        self.retained = 0
        self.prefill_in_use = 0
        self._prefill_by_class: dict[int, int] = {}  # prefill slots in use, by class rank
        self.decode_in_use = 0

    # --- retention -----------------------------------------------------------------------

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

    # --- placement ------------------------------------------------------------------------

    def start(self, ticket: Ticket, now: float) -> Wakeups:
        """Place the ticket now, or queue it. Afterwards `ticket.state` is PREFILL
        (placed, `ticket.plan` set), QUEUED, or NEW with the ticket among the result's
        `unplaceable` (no eligible engine is left for it). The result also names every
        other ticket this call placed. Raises 429 when the queue is full; a retry is
        queued regardless, since it was admitted already."""
        if not len(self.queue):
            placed = self._place(ticket, now)
            if placed is True:
                return Wakeups(started=[ticket])
            if placed is None:
                return Wakeups(unplaceable=[ticket])
        elif not self.scheduler.could_place(ticket.excluded):
            return Wakeups(unplaceable=[ticket])
        self.queue.push(ticket, now)
        # Those ahead could not be placed; the newcomer may, if they wait on engines it
        # does not need (retries confined to fewer engines). Nothing else can start in
        # this pass: no capacity was freed.
        wakeups = self._wake(now) if len(self.queue) > 1 else Wakeups()
        if (
            ticket.state is TicketState.QUEUED
            and not ticket.retrying
            and len(self.queue) > self.queue.limit
        ):
            self.queue.remove(ticket)
            raise CapacityRejected(
                f"The admission queue is full ({self.queue.limit} waiting); retry shortly.",
                reason="queue",
            )
        return wakeups

    def prefill_answered(self, ticket: Ticket, now: float) -> Wakeups:
        """A disaggregated pair's prefill engine answered: its prefill slot is free (the
        request keeps the router's prefill slot until its first token)."""
        plan = ticket.plan
        if (
            ticket.state is not TicketState.PREFILL
            or plan is None
            or plan.prefill is None
            or ticket.prefill_released
        ):
            return Wakeups()
        self._release_prefill_engine(ticket, plan)
        if self.listener is not None:
            self.listener.prefill_answered(ticket, plan, now)
        return self._wake(now)

    def first_token(self, ticket: Ticket, now: float) -> Wakeups:
        """The first output is in hand: the prefill slot becomes a decode slot."""
        plan = ticket.plan
        if ticket.state is not TicketState.PREFILL or plan is None:
            return Wakeups()
        self._release_prefill_engine(ticket, plan)
        ticket.state = TicketState.DECODE
        self._prefill_slot(ticket, -1)
        self.decode_in_use += 1
        plan.decode.load.decoding += 1
        if self.listener is not None:
            self.listener.first_token(ticket, plan, now)
        return self._wake(now)

    def retry(self, ticket: Ticket, failed: str, now: float) -> Wakeups:
        """The current attempt failed on engine `failed` before headers: give back the
        placement and place the ticket again (or queue it), never on an engine that
        failed it; see `start` for the result."""
        released = self._release(ticket, now)
        ticket.excluded.add(failed)
        ticket.retrying = True
        wakeups = self._wake(now) if released else Wakeups()
        again = self.start(ticket, now)
        wakeups.started += again.started
        wakeups.unplaceable += again.unplaceable
        return wakeups

    def finish(self, ticket: Ticket, now: float) -> Wakeups:
        """Release whatever the ticket holds (a queue place, a placement); idempotent."""
        if ticket.state is TicketState.QUEUED:
            self.queue.remove(ticket)
            ticket.state = TicketState.DONE
            return Wakeups()
        released = self._release(ticket, now)
        ticket.state = TicketState.DONE
        return self._wake(now) if released else Wakeups()

    def reconsider(self, now: float) -> Wakeups:
        """Engines came or went: place who can be placed, fail who no longer can be."""
        return self._wake(now)

    # --- internals ------------------------------------------------------------------------

    def _room(self, ticket: Ticket) -> bool:
        return (
            self.prefill_in_use < self.prefill_limit - self._held_for_above(ticket.priority)
            and self.prefill_in_use + self.decode_in_use < self.decode_limit
        )

    def _held_for_above(self, rank: int) -> int:
        """The prefill slots reserved for the classes above `rank` that they are not
        using: kept free for them."""
        by_class = self._prefill_by_class
        return sum(
            max(0, self.reserved_prefill(above) - by_class.get(above, 0)) for above in range(rank)
        )

    def _prefill_slot(self, ticket: Ticket, change: int) -> None:
        self.prefill_in_use += change
        by_class = self._prefill_by_class
        by_class[ticket.priority] = by_class.get(ticket.priority, 0) + change

    def _place(self, ticket: Ticket, now: float) -> bool | None:
        """True: placed. False: no room now. None: no eligible engine is left for it."""
        if not self._room(ticket):
            return False if self.scheduler.could_place(ticket.excluded) else None
        try:
            plan = self.scheduler.plan(ticket.request, ticket.excluded)
        except NoCapacity:
            return False
        if plan is None:
            return None
        ticket.plan = plan
        ticket.state = TicketState.PREFILL
        ticket.prefill_released = False
        self._prefill_slot(ticket, 1)
        first = plan.first.load
        first.prefilling += 1
        first.prefill_tokens += ticket.request.prompt_tokens - plan.cached_tokens
        decode = plan.decode.load
        decode.decode_bound += 1
        decode.by_class[ticket.priority] = decode.by_class.get(ticket.priority, 0) + 1
        if self.listener is not None:
            self.listener.placed(ticket, plan, now)
        return True

    def _release_prefill_engine(self, ticket: Ticket, plan: Plan) -> None:
        if ticket.prefill_released:
            return
        ticket.prefill_released = True
        first = plan.first.load
        first.prefilling -= 1
        first.prefill_tokens -= ticket.request.prompt_tokens - plan.cached_tokens

    def _release(self, ticket: Ticket, now: float) -> bool:
        """Give back the ticket's placement, if it holds one; True when it did."""
        plan = ticket.plan
        state = ticket.state
        if plan is None or state not in (TicketState.PREFILL, TicketState.DECODE):
            return False
        self._release_prefill_engine(ticket, plan)
        decode = plan.decode.load
        decode.decode_bound -= 1
        decode.by_class[ticket.priority] -= 1
        if state is TicketState.PREFILL:
            self._prefill_slot(ticket, -1)
        else:
            self.decode_in_use -= 1
            decode.decoding -= 1
        ticket.plan = None
        ticket.state = TicketState.NEW
        if self.listener is not None:
            self.listener.released(ticket, plan, now, decoded=state is TicketState.DECODE)
        return True

    def _wake(self, now: float) -> Wakeups:
        wakeups = Wakeups()
        waiting: list[Ticket] = []  # popped, no room for them: back in the queue after
        queue = self.queue
        while len(queue):
            ticket = queue.pop(now)
            if ticket is None:
                break
            placed = self._place(ticket, now)
            if placed is True:
                wakeups.started.append(ticket)
            elif placed is None:
                ticket.state = TicketState.NEW
                wakeups.unplaceable.append(ticket)
            else:
                waiting.append(ticket)
                if not ticket.excluded and not self._held_for_above(ticket.priority):
                    # Everyone behind it could use no more engines or slots than it could
                    # (a class kept from reserved slots is not: a higher one risen less
                    # far with age may be behind it).
                    break
        for ticket in waiting:
            queue.push(ticket, now)
        return wakeups
