"""The router's metrics: every series of a fixed label set exists from the start."""

from __future__ import annotations

from typing import get_args

from narwhal.errors import NarwhalError, Outcome
from narwhal.metrics import OUTCOMES, RouterMetrics
from tests.metrics_text import samples


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
