"""Admission decisions, sans-IO: retention, one queue over router and engine slots,
phase transitions, retries, and who may start next."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest

from narwhal.admission.controller import Admission, Wakeups
from narwhal.admission.queue import Ticket, TicketState
from narwhal.config import EngineConfig, EnginePhaseConcurrency
from narwhal.errors import CapacityRejected
from narwhal.scheduler.placement import PlacementRequest
from narwhal.scheduler.registry import EngineRegistry
from narwhal.scheduler.scheduler import Plan, Scheduler


def engine(name: str, role: str = "both", **limits: int) -> EngineConfig:
    return EngineConfig(
        name=name,
        url=f"http://127.0.0.1/{name}",
        role=role,  # type: ignore[arg-type]
        phase_concurrency=EnginePhaseConcurrency(**limits),
    )


def make(
    *engines: EngineConfig,
    retained: int = 100,
    queue: int = 10,
    prefill: int = 2,
    decode: int = 100,
    healthy: set[str] | None = None,
    **kw: Any,
) -> Admission:
    registry = EngineRegistry(engines or (engine("e"),), lambda n: healthy is None or n in healthy)
    return Admission(
        Scheduler(registry, rng=random.Random(1)),
        max_retained=retained,
        queue_limit=queue,
        prefill_limit=prefill,
        decode_limit=decode,
        **kw,
    )


def ticket(prompt: int = 10) -> Ticket:
    return Ticket(PlacementRequest.sized("chat", prompt))


def loads(admission: Admission) -> dict[str, tuple[int, int, int, int]]:
    """(prefilling, prefill_tokens, decode_bound, decoding) per engine."""
    return {
        name: (e.load.prefilling, e.load.prefill_tokens, e.load.decode_bound, e.load.decoding)
        for name, e in admission.scheduler.registry.entries.items()
    }


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
    a, b, c, d, e = (ticket() for _ in range(5))
    assert admission.start(a, 0).started == [a]
    assert admission.start(b, 0).started == [b]
    assert not admission.start(c, 0) and c.state is TicketState.QUEUED
    assert not admission.start(d, 0)
    with pytest.raises(CapacityRejected) as info:
        admission.start(e, 0)
    assert info.value.reason == "queue"
    assert e.state is TicketState.NEW and len(admission.queue) == 2
    # a's first token: its prefill slot frees, the head of the queue starts.
    assert admission.first_token(a, 1).started == [c]
    assert admission.finish(b, 1).started == [d]
    assert c.state is TicketState.PREFILL and d.state is TicketState.PREFILL
    assert admission.prefill_in_use == 2 and admission.decode_in_use == 1


def test_no_overtaking_while_others_wait() -> None:
    admission = make(prefill=1)
    a, b, c = ticket(), ticket(), ticket()
    admission.start(a, 0)
    admission.start(b, 0)
    admission.finish(a, 0)  # b starts
    assert b.state is TicketState.PREFILL
    assert not admission.start(c, 0)  # queue order holds even for a newcomer
    assert c.state is TicketState.QUEUED


def test_zero_queue_limit_rejects_at_once_but_starts_when_there_is_room() -> None:
    admission = make(prefill=1, queue=0)
    assert admission.start(ticket(), 0).started
    with pytest.raises(CapacityRejected):
        admission.start(ticket(), 0)


def test_decode_limit_counts_requests_in_prefill() -> None:
    admission = make(prefill=5, decode=2)
    a, b, c = ticket(), ticket(), ticket()
    assert admission.start(a, 0).started
    assert admission.start(b, 0).started
    assert not admission.start(c, 0)  # both will need decode slots
    assert not admission.first_token(a, 0)
    assert admission.finish(a, 0).started == [c]


def test_engine_limits_are_waited_for_in_the_one_queue() -> None:
    """An engine at its own prefill limit makes requests wait in the admission queue,
    in order, under the queue limit (no second, hidden wait)."""
    admission = make(engine("e", prefill=1), prefill=64, queue=1)
    a, b, c = ticket(), ticket(), ticket()
    assert admission.start(a, 0).started == [a]
    assert not admission.start(b, 0) and b.state is TicketState.QUEUED
    with pytest.raises(CapacityRejected):  # the queue limit applies to engine waits too
        admission.start(c, 0)
    assert admission.prefill_in_use == 1 and len(admission.queue) == 1
    assert admission.first_token(a, 1).started == [b]
    assert loads(admission)["e"] == (1, 10, 2, 1)


def test_per_engine_decode_limit_counts_requests_still_in_prefill() -> None:
    admission = make(engine("e", decode=2), prefill=64)
    a, b, c = ticket(), ticket(), ticket()
    admission.start(a, 0)
    admission.start(b, 0)
    assert not admission.start(c, 0)  # a and b will decode on e
    admission.first_token(a, 1)
    assert c.state is TicketState.QUEUED
    assert admission.finish(a, 2).started == [c]


def test_a_full_engine_sends_work_to_the_other() -> None:
    admission = make(engine("x", prefill=1), engine("y", prefill=1), prefill=64)
    a, b, c = ticket(), ticket(), ticket()
    admission.start(a, 0)
    admission.start(b, 0)
    assert a.plan is not None and b.plan is not None
    assert {a.plan.decode.name, b.plan.decode.name} == {"x", "y"}
    assert not admission.start(c, 0)
    assert admission.first_token(b, 1).started == [c]
    assert c.plan is not None and c.plan.decode is b.plan.decode


def test_disaggregated_transitions_move_each_engines_counts_once() -> None:
    admission = make(engine("p", "prefill", prefill=1), engine("d", "decode"), prefill=64)
    a, b = ticket(100), ticket(200)
    admission.start(a, 0)
    assert loads(admission) == {"p": (1, 100, 0, 0), "d": (0, 0, 1, 0)}
    assert not admission.start(b, 0)  # p is at its limit
    # p answered: its slot goes to b, a keeps the router's prefill slot until its first token
    assert admission.prefill_answered(a, 1).started == [b]
    assert loads(admission) == {"p": (1, 200, 0, 0), "d": (0, 0, 2, 0)}
    assert admission.prefill_in_use == 2
    admission.first_token(a, 2)
    assert loads(admission) == {"p": (1, 200, 0, 0), "d": (0, 0, 2, 1)}
    assert (admission.prefill_in_use, admission.decode_in_use) == (1, 1)
    admission.finish(b, 3)  # failed in prefill
    admission.finish(a, 4)
    assert loads(admission) == {"p": (0, 0, 0, 0), "d": (0, 0, 0, 0)}
    assert (admission.prefill_in_use, admission.decode_in_use) == (0, 0)


def test_retry_avoids_the_failed_prefill_engine_too() -> None:
    admission = make(
        engine("p1", "prefill"), engine("p2", "prefill"), engine("d1", "decode"),
        engine("d2", "decode"),
    )  # fmt: skip
    a = ticket()
    admission.start(a, 0)
    assert a.plan is not None
    failed_prefill = a.plan.first.name
    admission.retry(a, failed_prefill, 1)
    assert a.state is TicketState.PREFILL and a.plan is not None
    assert a.plan.first.name != failed_prefill
    assert sum(load[0] for load in loads(admission).values()) == 1  # one placement held


def test_retry_with_no_engine_left_is_unplaceable_and_holds_nothing() -> None:
    admission = make(engine("x"), engine("y"))
    a = ticket()
    admission.start(a, 0)
    assert a.plan is not None
    first = a.plan.decode.name
    admission.retry(a, first, 1)
    assert a.plan is not None and a.plan.decode.name != first
    wakeups = admission.retry(a, a.plan.decode.name, 2)
    assert wakeups.unplaceable == [a] and a.state is TicketState.NEW
    assert loads(admission) == {"x": (0, 0, 0, 0), "y": (0, 0, 0, 0)}
    assert admission.prefill_in_use == 0


def test_a_retry_whose_only_decode_engine_failed_is_unplaceable_though_prefill_is_full() -> None:
    """Found by the admission machine: a request whose decode engine failed, while the one
    prefill engine left was at its own limit, was queued (to wait for that prefill slot)
    although no decode engine could ever take it; its client waited out the admission
    wait for a 504 instead of hearing the engine's failure at once."""
    healthy = {"p0", "d0"}
    admission = make(
        engine("p0", "prefill", prefill=1), engine("p1", "prefill"), engine("d0", "decode"),
        healthy=healthy, prefill=64,
    )  # fmt: skip
    registry = admission.scheduler.registry
    a, b = ticket(), ticket()
    assert admission.start(a, 0).started == [a]  # on p0 (p1 is down): p0 is full
    healthy.add("p1")
    registry.invalidate()
    assert admission.start(b, 1).started == [b]
    assert b.plan is not None and b.plan.first.name == "p1"
    healthy.discard("p1")
    registry.invalidate()
    assert not admission.reconsider(2)
    wakeups = admission.retry(b, "d0", 3)  # b's decode engine failed it before headers
    assert wakeups.unplaceable == [b] and b.state is TicketState.NEW
    assert len(admission.queue) == 0
    assert loads(admission)["d0"] == (0, 0, 1, 0)  # a's decode place alone


def test_a_retry_waits_past_a_full_queue_and_counts_in_it() -> None:
    admission = make(engine("x", prefill=1), engine("y", prefill=1), prefill=64, queue=1)
    a, b, c, d = ticket(), ticket(), ticket(), ticket()
    admission.start(a, 0)
    admission.start(b, 0)
    assert a.plan is not None and b.plan is not None
    failed, busy = a.plan.decode.name, b.plan.decode.name
    # a fails: it gives its engine back and must wait for b's, over the queue limit
    assert not admission.retry(a, failed, 1).started
    assert a.state is TicketState.QUEUED and len(admission.queue) == 1
    assert admission.start(c, 1).started == [c]  # c takes the engine a cannot use
    assert c.plan is not None and c.plan.decode.name == failed
    with pytest.raises(CapacityRejected):
        admission.start(d, 1)  # a waiting retry fills the queue for newcomers
    # b's engine frees: a, confined to it, goes
    assert admission.first_token(b, 2).started == [a]
    assert a.plan is not None and a.plan.decode.name == busy


def test_a_newcomer_may_pass_a_retry_that_waits_for_another_engine() -> None:
    admission = make(engine("x", prefill=1), engine("y", prefill=1), prefill=64)
    a, b, c, d = ticket(), ticket(), ticket(), ticket()
    admission.start(a, 0)
    admission.start(b, 0)
    assert a.plan is not None and b.plan is not None
    failed, busy = a.plan.decode.name, b.plan.decode.name
    admission.retry(a, failed, 1)  # a waits for `busy`, its only engine left
    assert a.state is TicketState.QUEUED
    # a newcomer takes the engine a left, although a is ahead of it
    assert admission.start(c, 2).started == [c]
    assert c.plan is not None and c.plan.decode.name == failed
    assert not admission.start(d, 2)  # now both engines are busy: d waits behind a
    assert admission.finish(b, 3).started == [a]
    assert a.plan is not None and a.plan.decode.name == busy
    assert admission.finish(c, 4).started == [d]


def test_queued_tickets_become_unplaceable_when_the_engines_go() -> None:
    healthy = {"e"}
    admission = make(engine("e", prefill=1), prefill=64, healthy=healthy)
    a, b = ticket(), ticket()
    admission.start(a, 0)
    admission.start(b, 0)
    healthy.clear()
    admission.scheduler.registry.invalidate()
    assert admission.reconsider(1).unplaceable == [b]
    assert len(admission.queue) == 0 and b.state is TicketState.NEW


def test_queued_ticket_that_leaves_frees_its_place() -> None:
    admission = make(prefill=1, queue=1)
    a, b = ticket(), ticket()
    admission.start(a, 0)
    admission.start(b, 0)
    assert not admission.finish(b, 0)
    assert len(admission.queue) == 0
    assert not admission.finish(a, 0)  # nobody left to start
    assert admission.prefill_in_use == 0


def test_finish_is_idempotent_and_everything_returns_to_zero() -> None:
    admission = make(engine("x", decode=3), engine("y", prefill=1), prefill=2, queue=5)
    tickets = [ticket() for _ in range(6)]
    for each in tickets:
        admission.start(each, 0)
    while any(t.state is not TicketState.DONE for t in tickets):
        for each in tickets:
            if each.state is TicketState.PREFILL:
                admission.first_token(each, 1)
                admission.finish(each, 2)
                admission.finish(each, 2)
    assert (admission.prefill_in_use, admission.decode_in_use, len(admission.queue)) == (0, 0, 0)
    assert loads(admission) == {"x": (0, 0, 0, 0), "y": (0, 0, 0, 0)}


def test_priority_class_is_served_first_fifo_within_class() -> None:
    admission = make(prefill=1)
    running = ticket()
    admission.start(running, 0)
    low1, high, low2 = (
        Ticket(replace(PlacementRequest.sized("chat", 1), priority=p)) for p in (1, 0, 1)
    )
    for each in (low1, high, low2):
        admission.start(each, 0)
    order = []
    current = running
    for _ in range(3):
        (current,) = admission.finish(current, 1).started
        order.append(current)
    assert order == [high, low1, low2]


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, float]] = []

    def placed(self, ticket: Ticket, plan: Plan, now: float) -> None:
        self.calls.append(("placed", plan.describe(), now))

    def prefill_answered(self, ticket: Ticket, plan: Plan, now: float) -> None:
        self.calls.append(("prefill_answered", plan.describe(), now))

    def first_token(self, ticket: Ticket, plan: Plan, now: float) -> None:
        self.calls.append(("first_token", plan.describe(), now))

    def released(self, ticket: Ticket, plan: Plan, now: float, *, decoded: bool) -> None:
        self.calls.append((f"released decoded={decoded}", plan.describe(), now))


def test_the_listener_hears_every_transition_once_with_its_time() -> None:
    recorder = Recorder()
    admission = make(
        engine("p", "prefill"), engine("d1", "decode"), engine("d2", "decode"), listener=recorder
    )
    a = ticket()
    admission.start(a, 1.0)
    assert a.plan is not None
    first_decode = a.plan.decode.name
    admission.prefill_answered(a, 2.0)
    admission.prefill_answered(a, 2.5)  # no second call
    admission.retry(a, first_decode, 3.0)
    admission.prefill_answered(a, 4.0)
    admission.first_token(a, 5.0)
    admission.finish(a, 6.0)
    admission.finish(a, 7.0)
    other = "d2" if first_decode == "d1" else "d1"
    assert recorder.calls == [
        ("placed", f"prefill p, decode {first_decode}", 1.0),
        ("prefill_answered", f"prefill p, decode {first_decode}", 2.0),
        ("released decoded=False", f"prefill p, decode {first_decode}", 3.0),
        ("placed", f"prefill p, decode {other}", 3.0),
        ("prefill_answered", f"prefill p, decode {other}", 4.0),
        ("first_token", f"prefill p, decode {other}", 5.0),
        ("released decoded=True", f"prefill p, decode {other}", 6.0),
    ]


def test_wakeups_is_false_when_nobody_was_woken() -> None:
    assert not Wakeups()


def test_reserved_prefill_slots_go_only_to_their_class_and_those_above() -> None:
    """Three slots, one reserved for critical (rank 0): standard requests take the other
    two and the next one waits, while a critical one still finds the reserved slot; with
    it taken, a standard one may have any slot that frees."""
    reserved = {0: 1, 1: 0, 2: 0}
    admission = make(prefill=3, reserved_prefill=reserved.__getitem__)
    standard = [Ticket(replace(PlacementRequest.sized("chat", 1), priority=1)) for _ in range(3)]
    assert admission.start(standard[0], 0.0).started == [standard[0]]
    assert admission.start(standard[1], 0.0).started == [standard[1]]
    assert admission.start(standard[2], 0.0).started == []  # the last slot is critical's
    critical = Ticket(replace(PlacementRequest.sized("chat", 1), priority=0))
    assert admission.start(critical, 0.0).started == [critical]
    assert admission.finish(standard[0], 0.0).started == [standard[2]]
    admission.finish(critical, 0.0)
    later = Ticket(replace(PlacementRequest.sized("chat", 1), priority=2))
    assert admission.start(later, 0.0).started == []  # free again: kept for critical


def test_each_engine_counts_its_requests_by_class_until_they_end() -> None:
    admission = make(prefill=4)
    tickets = [Ticket(replace(PlacementRequest.sized("chat", 1), priority=p)) for p in (0, 2, 2)]
    for t in tickets:
        admission.start(t, 0.0)
    load = admission.scheduler.registry.entries["e"].load
    assert load.by_class == {0: 1, 2: 2}
    admission.first_token(tickets[1], 0.0)
    assert load.by_class == {0: 1, 2: 2}  # decode-bound from placement to the end
    admission.finish(tickets[1], 0.0)
    admission.finish(tickets[0], 0.0)
    assert load.by_class == {0: 0, 2: 1}
