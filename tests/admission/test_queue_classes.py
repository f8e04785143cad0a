"""The admission queue by class and tenant, sans-IO: higher classes first, the starvation
guard's rise with age, weighted fair shares in tokens between tenants of one class, the
earliest deadline first within a tenant, and a retry that keeps its place."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from narwhal.admission.queue import AdmissionQueue, Ticket
from narwhal.scheduler.placement import PlacementRequest


def ticket(
    priority: int = 1, tenant: str = "default", tokens: int = 100, deadline: float = 100.0
) -> Ticket:
    request = replace(PlacementRequest.sized("chat", tokens, 1), priority=priority, tenant=tenant)
    return Ticket(request, deadline=deadline)


def drain(queue: AdmissionQueue, now: float = 0.0) -> list[Ticket]:
    out = []
    while (t := queue.pop(now)) is not None:
        out.append(t)
    return out


def test_the_higher_class_goes_first_whatever_the_order_of_arrival() -> None:
    queue = AdmissionQueue(100)
    low, standard, high = ticket(2), ticket(1), ticket(0)
    for t in (low, standard, high):
        queue.push(t)
    assert queue.ahead(0) == 1 and queue.ahead(1) == 2 and queue.ahead(2) == 3
    assert drain(queue) == [high, standard, low]
    assert len(queue) == 0 and queue.ahead(2) == 0


def test_a_waiting_lower_class_rises_one_class_per_aging_step() -> None:
    queue = AdmissionQueue(100, aging_s=5.0)
    old = ticket(2)
    queue.push(old, now=0.0)
    queue.push(standard := ticket(1), now=4.0)
    assert queue.pop(now=4.0) is standard  # not risen yet
    queue.push(critical := ticket(0), now=5.0)
    queue.push(standard := ticket(1), now=5.0)
    # Risen one class: behind the critical one, ahead of the standard one (it is older).
    assert drain(queue, now=5.0) == [critical, old, standard]
    queue.push(old := ticket(2), now=0.0)
    queue.push(critical := ticket(0), now=10.0)
    assert queue.pop(now=10.0) is old  # risen two classes: as high as any, and older


def test_tenants_of_one_class_share_by_weight_in_tokens_not_in_requests() -> None:
    weights = {"a": 1.0, "b": 3.0}
    queue = AdmissionQueue(10_000, weight=weights.__getitem__)
    for _ in range(200):
        queue.push(ticket(tenant="a", tokens=100))
    for _ in range(100):  # b's requests are twice the size
        queue.push(ticket(tenant="b", tokens=200))
    served: Counter[str] = Counter()
    for t in drain(queue)[:120]:
        served[t.tenant] += t.request.prompt_tokens + 1
    assert served["b"] / served["a"] == pytest.approx(3.0, rel=0.1)


def test_a_flooding_tenant_does_not_push_back_one_that_just_arrived() -> None:
    queue = AdmissionQueue(10_000)
    for _ in range(500):
        queue.push(ticket(tenant="flood"))
    polite = ticket(tenant="polite")
    queue.push(polite)
    order = drain(queue)
    assert order.index(polite) <= 1


def test_within_a_tenant_the_earliest_deadline_goes_first() -> None:
    queue = AdmissionQueue(100)
    late, soon = ticket(deadline=50.0), ticket(deadline=10.0)
    queue.push(late)
    queue.push(soon)
    assert drain(queue) == [soon, late]


def test_a_ticket_put_back_keeps_its_tags_and_goes_back_ahead_of_later_arrivals() -> None:
    queue = AdmissionQueue(100)
    first = ticket()
    queue.push(first)
    assert queue.pop() is first
    later = ticket()
    queue.push(later)
    queue.push(first)  # (no room for it: back in the queue, or a retry)
    assert drain(queue) == [first, later]


def test_removed_tickets_leave_the_counts_at_once() -> None:
    queue = AdmissionQueue(100)
    a, b = ticket(tenant="x"), ticket(tenant="y", priority=0)
    queue.push(a)
    queue.push(b)
    assert queue.by_tenant() == {"x": {1: 1}, "y": {0: 1}}
    assert queue.remove(a) and not queue.remove(a)
    assert len(queue) == 1 and queue.ahead(2) == 1 and queue.by_tenant() == {"y": {0: 1}}
    assert drain(queue) == [b]
