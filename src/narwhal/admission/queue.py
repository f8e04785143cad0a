"""Admission tickets and the admission queue (sans-IO): bounded, FIFO within a priority class.

Priority is a small integer (lower is served first) that callers may take from a request
header later; every caller today uses the default class, which makes the queue plain
FIFO. A ticket keeps its sequence number for life, so a retry that has to wait again
goes back to where its request first stood, ahead of later arrivals. A ticket that
leaves early (admission wait expired, client gone) is removed lazily.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from narwhal.scheduler.placement import PlacementRequest

if TYPE_CHECKING:
    from narwhal.protocol.tracker import OutputTracker
    from narwhal.scheduler.scheduler import Plan

DEFAULT_PRIORITY = 0


class TicketState(Enum):
    NEW = "new"  # holds nothing (not admitted yet, or between two attempts)
    QUEUED = "queued"
    PREFILL = "prefill"  # placed: holds a prefill slot until its first token
    DECODE = "decode"  # first token in hand: holds a decode slot until its last event
    DONE = "done"  # holds nothing, for good


_sequence = itertools.count()


@dataclass(eq=False, slots=True)
class Ticket:
    """One request's place in admission; identity is the object itself.

    `plan` is where it runs while it is placed (PREFILL or DECODE); `excluded` names
    the engines that failed it, which a retry must avoid.
    """

    request: PlacementRequest
    priority: int = DEFAULT_PRIORITY
    seq: int = field(default_factory=lambda: next(_sequence))
    state: TicketState = TicketState.NEW
    plan: Plan | None = None
    excluded: set[str] = field(default_factory=set)
    retrying: bool = False  # admitted already: a full queue does not turn it away
    prefill_released: bool = False  # a P/D pair's prefill engine is done with it
    # Predictive admission: the TTFT projected when the request was checked (seconds
    # from `checked_at`), compared with what it turns into at its first token.
    projected_ttft: float | None = None
    # and the bound admission held it to (its upper bound), compared likewise.
    projected_upper: float | None = None
    checked_at: float = 0.0
    output: OutputTracker | None = None  # the current attempt's output, as it arrives


class AdmissionQueue:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._heap: list[tuple[int, int, Ticket]] = []
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def push(self, ticket: Ticket) -> None:
        """Queue the ticket (the caller has checked the limit, or is re-queueing)."""
        ticket.state = TicketState.QUEUED
        heapq.heappush(self._heap, (ticket.priority, ticket.seq, ticket))
        self._size += 1

    def pop(self) -> Ticket | None:
        """The next ticket to serve, or None when the queue is empty."""
        while self._heap:
            _, _, ticket = heapq.heappop(self._heap)
            if ticket.state is TicketState.QUEUED:
                self._size -= 1
                return ticket
        return None

    def remove(self, ticket: Ticket) -> bool:
        """Take a queued ticket out (it stays in the heap until popped, marked gone)."""
        if ticket.state is not TicketState.QUEUED:
            return False
        ticket.state = TicketState.NEW
        self._size -= 1
        return True
