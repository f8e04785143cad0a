"""The router's metrics: every series of a fixed label set exists from the start."""

from __future__ import annotations

import importlib.metadata
from typing import get_args

from narwhal import DISTRIBUTION, installed_version
from narwhal.errors import NarwhalError, Outcome
from narwhal.observability.metrics import OUTCOMES, RouterMetrics
from tests.metrics_text import samples, series, total

DURATION = "narwhal_request_duration_seconds"


def test_every_outcome_series_exists_from_the_start_at_zero() -> None:
    values = samples(RouterMetrics().render().decode())
    outcomes = {k: v for k, v in values.items() if k.startswith("narwhal_outcomes_total{")}
    assert outcomes == {f'narwhal_outcomes_total{{outcome="{o}"}}': 0.0 for o in OUTCOMES}
    assert get_args(Outcome) == OUTCOMES and "internal_error" in OUTCOMES


def test_an_outcome_is_counted_once() -> None:
    metrics = RouterMetrics()
    metrics.count_outcome("internal_error")
    values = samples(metrics.render().decode())
    assert values['narwhal_outcomes_total{outcome="internal_error"}'] == 1.0
    assert values['narwhal_outcomes_total{outcome="upstream_error"}'] == 0.0


def test_a_router_bug_is_an_internal_error() -> None:
    """The base class is raised on purpose only for a router bug (DESIGN.md §3)."""
    error = NarwhalError("Internal router error.")
    assert (error.status, error.outcome) == (500, "internal_error")


def test_request_series_exist_from_the_start_at_zero() -> None:
    values = samples(RouterMetrics().render().decode())
    for route in ("chat", "completion"):
        for stream in ("false", "true"):
            for completed in ("false", "true"):
                labels = {"route": route, "stream": stream, "completed": completed}
                assert values[series(DURATION + "_count", **labels)] == 0
                assert values[series(DURATION + "_bucket", **labels, le="+Inf")] == 0
            for name in ("narwhal_prompt_tokens_total", "narwhal_completion_tokens_total"):
                assert values[series(name, route=route, stream=stream)] == 0


def test_a_duration_goes_to_the_completed_series_only_when_the_outcome_is_completed() -> None:
    metrics = RouterMetrics()
    metrics.observe_duration("chat", True, "completed", 12.0)
    metrics.observe_duration("chat", True, "client_gone", 3.0)
    metrics.observe_duration("chat", True, "refused", 0.001)
    values = samples(metrics.render().decode())
    done = {"route": "chat", "stream": "true", "completed": "true"}
    other = {**done, "completed": "false"}
    assert values[series(DURATION + "_count", **done)] == 1
    assert values[series(DURATION + "_sum", **done)] == 12.0
    assert values[series(DURATION + "_bucket", **done, le="10.0")] == 0
    assert values[series(DURATION + "_bucket", **done, le="20.0")] == 1
    assert values[series(DURATION + "_count", **other)] == 2
    assert total(values, DURATION + "_count") == 3


def test_build_info_carries_the_installed_version() -> None:
    version = importlib.metadata.version(DISTRIBUTION)
    assert installed_version() == version
    values = samples(RouterMetrics().render().decode())
    assert {k: v for k, v in values.items() if k.startswith("narwhal_build_info")} == {
        f'narwhal_build_info{{version="{version}"}}': 1.0
    }


def test_the_process_and_platform_series_are_on_every_router_registry() -> None:
    """On the router's own registry: two in one process (tests, embedded engines) would
    collide on a shared one."""
    for _ in range(2):
        values = samples(RouterMetrics().render().decode())
        assert values["process_cpu_seconds_total"] > 0
        assert values["process_resident_memory_bytes"] > 0
        assert values["process_open_fds"] > 0 and "process_start_time_seconds" in values
        assert any(k.startswith("python_info{") for k in values)
