"""Admission decisions, sans-IO: retention, queue, phase slots, who may start next."""

from __future__ import annotations

import pytest

from narwhal.admission.controller import Admission
from narwhal.admission.queue import Ticket, TicketState
from narwhal.errors import CapacityRejected


def make(*, retained: int = 100, queue: int = 10, prefill: int = 2, decode: int = 100) -> Admission:
    return Admission(
        max_retained=retained, queue_limit=queue, prefill_limit=prefill, decode_limit=decode
    )


def test_retention_limit_rejects_with_reason_retention() -> None:
    admission = make(retained=2)
    admission.arrive()
    admission.arrive()
    with pytest.raises(CapacityRejected) as info:
        admission.arrive()
    assert info.value.reason == "retention"
    assert info.value.status == 429 and info.value.retry_after == 1
    admission.leave()
    admission.arrive()  # room again


def test_prefill_slots_then_fifo_queue_then_queue_full() -> None:
    admission = make(prefill=2, queue=2)
    a, b, c, d, e = (Ticket(10) for _ in range(5))
    assert admission.request_prefill(a) and admission.request_prefill(b)
    assert not admission.request_prefill(c)
    assert not admission.request_prefill(d)
    with pytest.raises(CapacityRejected) as info:
        admission.request_prefill(e)
    assert info.value.reason == "queue"
    assert len(admission.queue) == 2
    # a's first token: its prefill slot frees, the head of the queue starts.
    assert admission.prefill_done(a) == [c]
    assert admission.finish(b) == [d]
    assert c.state is TicketState.PREFILL and d.state is TicketState.PREFILL
    assert admission.prefill_in_use == 2 and admission.decode_in_use == 1


def test_no_overtaking_while_others_wait() -> None:
    admission = make(prefill=1)
    a, b, c = Ticket(1), Ticket(1), Ticket(1)
    admission.request_prefill(a)
    admission.request_prefill(b)
    admission.finish(a)  # b starts
    assert b.state is TicketState.PREFILL
    assert not admission.request_prefill(c)  # queue order holds even for a newcomer


def test_zero_queue_limit_rejects_at_once() -> None:
    admission = make(prefill=1, queue=0)
    admission.request_prefill(Ticket(1))
    with pytest.raises(CapacityRejected):
        admission.request_prefill(Ticket(1))


def test_decode_limit_counts_requests_in_prefill() -> None:
    admission = make(prefill=5, decode=2)
    a, b, c = Ticket(1), Ticket(1), Ticket(1)
    assert admission.request_prefill(a)
    assert admission.request_prefill(b)
    assert not admission.request_prefill(c)  # both will need decode slots
    assert admission.prefill_done(a) == []
    assert admission.finish(a) == [c]


def test_queued_ticket_that_leaves_frees_its_place() -> None:
    admission = make(prefill=1, queue=1)
    a, b = Ticket(1), Ticket(1)
    admission.request_prefill(a)
    admission.request_prefill(b)
    assert admission.finish(b) == []
    assert len(admission.queue) == 0
    assert admission.finish(a) == []  # nobody left to start
    assert admission.prefill_in_use == 0


def test_finish_is_idempotent_and_everything_returns_to_zero() -> None:
    admission = make(prefill=2, queue=5)
    tickets = [Ticket(1) for _ in range(6)]
    for ticket in tickets:
        admission.request_prefill(ticket)
    for ticket in tickets:
        admission.prefill_done(ticket)
        admission.finish(ticket)
        admission.finish(ticket)
    assert (admission.prefill_in_use, admission.decode_in_use, len(admission.queue)) == (0, 0, 0)


def test_priority_class_is_served_first_fifo_within_class() -> None:
    admission = make(prefill=1)
    running = Ticket(1)
    admission.request_prefill(running)
    low1, high, low2 = Ticket(1, priority=1), Ticket(1, priority=0), Ticket(1, priority=1)
    for ticket in (low1, high, low2):
        admission.request_prefill(ticket)
    order = []
    current = running
    for _ in range(3):
        (current,) = admission.finish(current)
        order.append(current)
    assert order == [high, low1, low2]
