"""Engines joining and leaving the registry while it serves (a configuration reload)."""

from __future__ import annotations

from narwhal.admission.controller import Admission
from narwhal.admission.queue import Ticket
from narwhal.config import EngineConfig
from narwhal.fleet.state import EngineHealth
from narwhal.scheduler.placement import PlacementRequest
from narwhal.scheduler.registry import EngineEntry, EngineRegistry
from narwhal.scheduler.scheduler import Scheduler


def engines(*names: str, wave: int | None = None) -> list[EngineConfig]:
    return [
        EngineConfig(name=n, url=f"http://127.0.0.1:{8100 + i}", wave=wave)
        for i, n in enumerate(names)
    ]


def test_a_retiring_engine_takes_no_new_work_and_keeps_what_it_has() -> None:
    registry = EngineRegistry(engines("a", "b"))
    admission = Admission(
        Scheduler(registry), max_retained=10, queue_limit=10, prefill_limit=10, decode_limit=10
    )
    placed = [Ticket(PlacementRequest.sized("chat", 10)) for _ in range(4)]
    for ticket in placed:
        admission.start(ticket, now=0.0)
    b = registry.entries["b"]
    on_b = [t for t in placed if t.plan is not None and t.plan.decode is b]
    assert on_b  # placement by load used both
    registry.retire("b")
    assert registry.state(b) == "removing" and not registry.eligible(b)
    assert [e.name for e in registry.candidates("both")] == ["a"]
    later = Ticket(PlacementRequest.sized("chat", 10))
    admission.start(later, now=1.0)
    assert later.plan is not None and later.plan.decode.name == "a"
    # Removed from the registry, the engine's own requests still release onto it.
    assert registry.remove("b") is b and registry.get("b") is None
    for ticket in on_b:
        admission.finish(ticket, now=2.0)
    assert b.load.decode_bound == 0 and b.load.prefilling == 0


def test_an_engine_added_is_a_candidate_once_its_predicates_say_so() -> None:
    healthy = {"a"}
    registry = EngineRegistry(engines("a"), lambda name: name in healthy)
    entry = EngineEntry(EngineConfig(name="c", url="http://127.0.0.1:8200"))
    registry.add(entry)
    assert registry.state(entry) == "down" and registry.candidates("both") == [
        registry.entries["a"]
    ]
    healthy.add("c")
    registry.invalidate()
    assert {e.name for e in registry.candidates("both")} == {"a", "c"}


def test_a_retiring_engine_does_not_count_for_whole_fleet_maintenance() -> None:
    registry = EngineRegistry(engines("a", wave=1))
    registry.add(EngineEntry(EngineConfig(name="old", url="http://127.0.0.1:8300")))
    registry.set_wave(1, True)
    assert not registry.whole_fleet_in_maintenance()  # "old" has no wave: it serves
    registry.retire("old")
    assert registry.whole_fleet_in_maintenance()  # what stays is all in maintenance


def test_the_context_is_the_smallest_among_the_engines_a_request_may_go_to() -> None:
    """What /v1/models and the context check use: the smallest `max_model_len` of the
    eligible engines (a drained one may not take the request), else of any listed one."""
    registry = EngineRegistry(engines("a", "b", "c"))
    assert registry.max_model_len() is None  # no engine has said yet
    for name, context in (("a", 8192), ("b", 2048)):
        registry.entries[name].health = EngineHealth(
            stale_after_s=1.0, status="up", max_model_len=context
        )
    assert registry.max_model_len() == 2048
    registry.set_drained("b", True)
    assert registry.max_model_len() == 8192
    registry.set_drained("a", True)  # none eligible: what the listed engines said
    assert registry.max_model_len() == 2048
    registry.retire("b")
    assert registry.max_model_len() == 8192
