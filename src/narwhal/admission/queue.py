"""The admission queue (sans-IO): bounded, FIFO within a priority class.

Priority is a small integer (lower is served first) that callers may take from a request
header later; every caller today uses the default class, which makes the queue plain
FIFO. A ticket that leaves early (admission wait expired, client gone) is removed lazily.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from enum import Enum

DEFAULT_PRIORITY = 0


class TicketState(Enum):
    NEW = "new"
    QUEUED = "queued"
    PREFILL = "prefill"  # holds a prefill slot (dispatched, first token not yet in hand)
    DECODE = "decode"  # holds a decode slot (first token in hand, until the last event)
    DONE = "done"  # holds nothing


_sequence = itertools.count()


@dataclass(eq=False, slots=True)
class Ticket:
    """One admitted request's place in admission; identity is the object itself."""

    prompt_tokens: int
    priority: int = DEFAULT_PRIORITY
    seq: int = field(default_factory=lambda: next(_sequence))
    state: TicketState = TicketState.NEW


class AdmissionQueue:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._heap: list[tuple[int, int, Ticket]] = []
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def has_room(self) -> bool:
        return self._size < self.limit

    def push(self, ticket: Ticket) -> None:
        assert self.has_room(), "push() on a full queue"
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
        ticket.state = TicketState.DONE
        self._size -= 1
        return True
