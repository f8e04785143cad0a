"""The router state: one reason per owner, a guard that cannot be late, one log per change."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from narwhal.ops.state import RouterState
from tests.metrics_text import samples


def exported(registry: CollectorRegistry) -> dict[str, float]:
    return samples(generate_latest(registry).decode())


def test_one_owner_clearing_its_reason_does_not_clear_anothers() -> None:
    state = RouterState()
    state.set("monitoring", "monitoring_degraded")
    state.set("maintenance", "maintenance")
    assert state.unavailable_reason() == "maintenance"
    state.set("maintenance", None)
    assert state.unavailable_reason() == "monitoring_degraded"
    state.set("monitoring", None)
    assert state.unavailable_reason() is None


def test_the_first_owner_in_order_names_the_state() -> None:
    state = RouterState(initial={"ha": "standby"})
    state.set("maintenance", "maintenance")
    assert state.unavailable_reason() == "standby"
    state.set("shutdown", "shutting_down")
    assert state.unavailable_reason() == "shutting_down"


def test_each_owners_reason_can_be_read_behind_the_first() -> None:
    # What the pod label follows: the shutdown's and high availability's reasons alone.
    state = RouterState(initial={"ha": "standby"})
    state.set("shutdown", "shutting_down")
    assert (state.reason("shutdown"), state.reason("ha")) == ("shutting_down", "standby")
    assert state.reason("maintenance") is None


def test_the_guard_refuses_as_fenced_when_no_reason_is_set() -> None:
    provable = [True]
    state = RouterState()
    state.set_guard(lambda: provable[0])
    assert state.unavailable_reason() is None
    provable[0] = False
    assert state.unavailable_reason() == "fenced"
    state.set("maintenance", "maintenance")
    assert state.unavailable_reason() == "maintenance"


def test_each_change_is_logged_once_exported_and_announced(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = CollectorRegistry()
    state = RouterState(registry)
    heard: list[str | None] = []
    state.subscribe(heard.append)
    caplog.set_level(logging.INFO, "narwhal.state")
    state.set("ha", "fenced", "no renewal")
    state.set("ha", "fenced", "no renewal")  # no change: nothing logged, nothing announced
    state.set("monitoring", "monitoring_degraded")  # hidden behind ha: the state is unchanged
    state.set("ha", None, "renewed")
    assert heard == ["fenced", "monitoring_degraded"]
    assert [r.getMessage() for r in caplog.records] == [
        "router state: active -> fenced (no renewal)",
        "router state: fenced -> monitoring_degraded (renewed)",
    ]
    metrics = exported(registry)
    assert metrics['narwhal_router_state{state="monitoring_degraded"}'] == 1
    assert metrics['narwhal_router_state{state="active"}'] == 0
    state.set_revision(42)
    assert exported(registry)["narwhal_router_leadership_revision"] == 42
