"""Admission tickets and the admission queue (sans-IO): bounded, by class, fair by tenant.

The queue serves the highest class first (`priority`: its rank in admission.classes, 0
the highest). Within a class, tenants share by weight in tokens of work: start-time fair
queueing, each ticket tagged as it first queues with a virtual start (the class's virtual
time, or its tenant's last finish there, whichever is later) and finish (start plus its
work, prompt and predicted output tokens, over its tenant's weight); the lowest start
goes first, and the class's virtual time follows the tags served. Within one tenant and
class, the earliest deadline goes first. The starvation guard: a ticket waiting rises
one class for every `aging_s` seconds it has waited (computed when the queue is served,
so the rise costs nothing while it waits).

A ticket keeps its tags and sequence number for life, so a retry that has to wait again
goes back to where its request first stood, ahead of later arrivals. A ticket that
leaves early (admission wait expired, client gone) is removed lazily. Serving takes a
scan of the lanes (one per class and tenant that has queued tickets: a few, bounded by
the configuration) and a heap operation.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from narwhal.scheduler.placement import PlacementRequest

if TYPE_CHECKING:
    from narwhal.scheduler.placement import OutputSummary
    from narwhal.scheduler.scheduler import Plan

Lane = tuple[int, str]  # (class rank, tenant)


class TicketState(Enum):
    NEW = "new"  # holds nothing (not admitted yet, or between two attempts)
    QUEUED = "queued"
    PREFILL = "prefill"  # placed: holds a prefill slot until its first token
    DECODE = "decode"  # first token in hand: holds a decode slot until its last event
    DONE = "done"  # holds nothing, for good


_sequence = itertools.count()


@dataclass(eq=False, slots=True)
class Ticket:
    """One request's place in admission, inside the decision core (`narwhal.decision`),
    which knows it by its request id; identity is the object itself.

    `plan` is where it runs while it is placed (PREFILL or DECODE); `excluded` names
    the engines that failed it, which a retry must avoid.
    """

    request: PlacementRequest
    deadline: float = math.inf  # monotonic: the request's own deadline
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
    # What the attempt that just ended produced, while learning hears of its end.
    output: OutputSummary | None = None
    # Fair queueing: its virtual start in its class, set when it first queues.
    start_tag: float | None = None
    queued_at: float = 0.0  # when it first queued (the starvation guard's clock)
    request_id: str = ""  # the request's id at the seam

    @property
    def priority(self) -> int:
        """Its class's rank (0: the highest), as its request says."""
        return self.request.priority

    @property
    def tenant(self) -> str:
        return self.request.tenant


class AdmissionQueue:
    def __init__(
        self,
        limit: int,
        *,
        weight: Callable[[str], float] | None = None,
        aging_s: float | None = None,
    ) -> None:
        """`weight(tenant)`: its share within a class (default: all equal); `aging_s`:
        the starvation guard's step (None: a ticket never rises)."""
        self.limit = limit
        self.weight = weight or (lambda tenant: 1.0)
        self.aging_s = aging_s
        self._lanes: dict[Lane, list[tuple[float, int, Ticket]]] = {}
        self._virtual: dict[int, float] = {}  # each class's virtual time
        self._last_finish: dict[Lane, float] = {}
        self._by_class: dict[int, int] = {}
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def ahead(self, priority: int) -> int:
        """How many queued tickets are of this class or a higher one."""
        return sum(n for rank, n in self._by_class.items() if rank <= priority)

    def by_tenant(self) -> dict[str, dict[int, int]]:
        """Queued tickets by tenant, then class rank."""
        counts: dict[str, dict[int, int]] = {}
        for (rank, tenant), lane in self._lanes.items():
            n = sum(1 for _, _, t in lane if t.state is TicketState.QUEUED)
            if n:
                counts.setdefault(tenant, {})[rank] = n
        return counts

    def push(self, ticket: Ticket, now: float = 0.0) -> None:
        """Queue the ticket (the caller has checked the limit, or is re-queueing)."""
        ticket.state = TicketState.QUEUED
        lane: Lane = (ticket.priority, ticket.tenant)
        if ticket.start_tag is None:
            virtual = self._virtual.get(ticket.priority, 0.0)
            start = max(virtual, self._last_finish.get(lane, 0.0))
            work = ticket.request.prompt_tokens + ticket.request.predicted_output
            ticket.start_tag = start
            ticket.queued_at = now
            self._last_finish[lane] = start + max(1.0, work) / self.weight(ticket.tenant)
        heapq.heappush(self._lanes.setdefault(lane, []), (ticket.deadline, ticket.seq, ticket))
        self._by_class[ticket.priority] = self._by_class.get(ticket.priority, 0) + 1
        self._size += 1

    def pop(self, now: float = 0.0) -> Ticket | None:
        """The next ticket to serve, or None when the queue is empty."""
        best: tuple[int, float, int] | None = None
        chosen: Lane | None = None
        for key in list(self._lanes):
            head = self._head(key)
            if head is None:
                continue
            rank = head.priority
            if self.aging_s is not None:
                rank = max(0, rank - int((now - head.queued_at) / self.aging_s))
            order = (rank, head.start_tag or 0.0, head.seq)
            if best is None or order < best:
                best, chosen = order, key
        if chosen is None:
            return None
        _, _, ticket = heapq.heappop(self._lanes[chosen])
        if not self._lanes[chosen]:
            del self._lanes[chosen]
        virtual = self._virtual.get(ticket.priority, 0.0)
        self._virtual[ticket.priority] = max(virtual, ticket.start_tag or 0.0)
        self._left(ticket)
        return ticket

    def remove(self, ticket: Ticket) -> bool:
        """Take a queued ticket out (it stays in its lane until it reaches the head,
        marked gone)."""
        if ticket.state is not TicketState.QUEUED:
            return False
        ticket.state = TicketState.NEW
        self._left(ticket)
        return True

    def _head(self, key: Lane) -> Ticket | None:
        """The lane's first queued ticket, dropping the gone ones before it."""
        lane = self._lanes[key]
        while lane and lane[0][2].state is not TicketState.QUEUED:
            heapq.heappop(lane)
        if not lane:
            del self._lanes[key]
            return None
        return lane[0][2]

    def _left(self, ticket: Ticket) -> None:
        self._size -= 1
        self._by_class[ticket.priority] -= 1
