"""Health and metrics state transitions (narwhal.fleet.state), with time passed in."""

from __future__ import annotations

import pytest

from narwhal.fleet.scrape import EngineScrape
from narwhal.fleet.state import STRIKES_TO_DOWN, EngineHealth, HealthCheck, MetricsFailure

OK = HealthCheck.OK
STALE = 5.0
SCRAPE = EngineScrape(running=2.0, waiting=1.0, kv_usage=0.5)


def fresh() -> EngineHealth:
    return EngineHealth(stale_after_s=STALE)


def run(checks: list[HealthCheck]) -> EngineHealth:
    state = fresh()
    for t, check in enumerate(checks):
        state.record_health(check, float(t))
    return state


def test_starts_unknown_and_not_placeable() -> None:
    state = fresh()
    assert (state.status, state.healthy, state.placeable) == ("unknown", False, False)
    assert state.metrics_state() == "unknown"
    assert state.scrape_age(100.0) is None


def test_one_passing_check_makes_it_up() -> None:
    state = fresh()
    state.record_health(OK, 3.0)
    assert (state.status, state.placeable, state.last_health_ok_at) == ("up", True, 3.0)


# (checks in order, status after them): the table of health decisions.
H = HealthCheck
TRANSITIONS = [
    ([OK, H.UNREACHABLE], "down"),
    ([OK, H.UNHEALTHY], "down"),
    ([OK, H.TIMEOUT], "up"),  # one slow answer is ridden out...
    ([OK, H.TIMEOUT, H.TIMEOUT], "down"),  # ...two in a row are not
    ([OK, H.BAD_STATUS], "up"),
    ([OK, H.BAD_STATUS, H.BAD_STATUS], "down"),
    ([OK, H.ERROR], "up"),
    ([OK, H.ERROR, H.TIMEOUT], "down"),  # any two failures in a row
    ([OK, H.TIMEOUT, OK, H.TIMEOUT], "up"),  # a success resets the count
    ([OK, H.TIMEOUT, H.UNREACHABLE], "down"),
    ([H.TIMEOUT], "unknown"),  # not yet decided: still not placeable
    ([H.TIMEOUT, H.TIMEOUT], "down"),
    ([H.UNREACHABLE], "down"),
    ([H.UNREACHABLE, OK], "up"),  # back after one success
    ([OK, H.UNREACHABLE, H.TIMEOUT, H.ERROR, OK], "up"),
]


@pytest.mark.parametrize(("checks", "status"), TRANSITIONS)
def test_health_transitions(checks: list[HealthCheck], status: str) -> None:
    state = run(checks)
    assert state.status == status
    assert state.healthy is (status == "up")


def test_failures_are_counted_and_reset() -> None:
    state = run([OK, H.TIMEOUT, H.TIMEOUT, H.UNREACHABLE])
    assert (state.consecutive_failures, state.last_failure) == (3, H.UNREACHABLE)
    assert state.last_health_ok_at == 0.0
    state.record_health(OK, 9.0)
    assert (state.consecutive_failures, state.last_failure) == (0, None)


def test_every_failure_has_a_threshold() -> None:
    assert set(STRIKES_TO_DOWN) == set(HealthCheck) - {OK}


def test_good_scrape_is_kept_with_its_time() -> None:
    state = fresh()
    state.record_scrape(SCRAPE, 10.0)
    assert (state.last_scrape, state.last_scrape_at) == (SCRAPE, 10.0)
    assert state.metrics_supported is True
    assert state.metrics_state() == "ok"
    assert state.scrape_age(12.5) == 2.5


def test_404_before_metrics_ever_worked_is_unsupported_not_failed() -> None:
    state = fresh()
    state.record_health(OK, 0.0)
    state.record_scrape(MetricsFailure.ABSENT, 0.0)
    state.refresh(1000.0)
    assert state.metrics_supported is False
    assert state.metrics_state() == "unsupported"
    assert (state.monitoring_failed, state.placeable) == (False, True)


@pytest.mark.parametrize("failure", [f for f in MetricsFailure if f is not MetricsFailure.ABSENT])
def test_errors_before_metrics_ever_worked_leave_it_unknown(failure: MetricsFailure) -> None:
    state = fresh()
    state.record_health(OK, 0.0)
    state.record_scrape(failure, 0.0)
    state.record_scrape(failure, 1000.0)
    assert state.metrics_supported is None
    assert state.metrics_state() == "unknown"
    assert (state.monitoring_failed, state.placeable) == (False, True)


@pytest.mark.parametrize("failure", list(MetricsFailure))
def test_metrics_that_worked_then_broke_fail_once_stale(failure: MetricsFailure) -> None:
    state = fresh()
    state.record_health(OK, 10.0)
    state.record_scrape(SCRAPE, 10.0)
    state.record_scrape(failure, 11.0)  # a 404 now counts too: it worked before
    assert (state.monitoring_failed, state.placeable) == (False, True)
    state.refresh(10.0 + STALE)  # exactly stale_after_s old: not yet
    assert state.placeable
    state.refresh(10.0 + STALE + 0.01)
    assert (state.monitoring_failed, state.placeable) == (True, False)
    assert state.healthy  # out of placement for monitoring, not health
    assert state.metrics_state() == "failed"
    assert state.last_scrape == SCRAPE  # the last good figures are kept
    state.record_scrape(SCRAPE, 16.0)
    assert (state.monitoring_failed, state.placeable) == (False, True)


def test_an_old_scrape_is_not_a_failure_while_scrapes_succeed() -> None:
    state = fresh()
    state.record_health(OK, 0.0)
    state.record_scrape(SCRAPE, 0.0)
    state.refresh(100.0)  # no scrape attempted since (say, the probe round was slow)
    assert not state.monitoring_failed


def test_failure_recorded_after_staleness_fails_at_once() -> None:
    state = fresh()
    state.record_health(OK, 0.0)
    state.record_scrape(SCRAPE, 0.0)
    state.record_scrape(MetricsFailure.TIMEOUT, STALE + 1.0)
    assert state.monitoring_failed


def test_unsupported_metrics_that_appear_later_become_supported() -> None:
    state = fresh()
    state.record_scrape(MetricsFailure.ABSENT, 0.0)
    state.record_scrape(SCRAPE, 1.0)
    assert state.metrics_state() == "ok"


def test_counters_that_go_back_are_a_restart_to_recheck() -> None:
    """Prefix-cache counters count from the engine's start: lower than before, the engine
    is a new process (which may serve with another max_model_len)."""
    state = fresh()
    state.record_health(OK, 0.0)

    def scrape(queries: float | None, hits: float | None) -> EngineScrape:
        return EngineScrape(2.0, 1.0, 0.5, prefix_cache_queries=queries, prefix_cache_hits=hits)

    for t, (queries, hits) in enumerate([(100, 10), (100, 10), (250, 90), (None, None)]):
        state.record_scrape(scrape(queries, hits), float(t))
    assert (state.restarts, state.recheck) == (0, False)  # unchanged, grown or unreadable
    state.record_scrape(scrape(300, 90), 4.0)
    state.record_scrape(scrape(12, 0), 5.0)  # went back
    assert (state.restarts, state.recheck) == (1, True)
    assert state.placeable  # not a failure: the monitor reads its limits again
    state.recheck = False
    state.record_scrape(scrape(40, 5), 6.0)
    assert (state.restarts, state.recheck) == (1, False)


def test_counters_after_the_engine_was_down_are_not_a_second_restart() -> None:
    """Down and up again is a new process already (the profiler measures it again): its
    counters starting over are not counted once more."""
    state = fresh()
    state.record_health(OK, 0.0)
    state.record_scrape(EngineScrape(0.0, 0.0, 0.1, prefix_cache_queries=500), 0.0)
    state.record_health(HealthCheck.UNREACHABLE, 1.0)
    assert state.status == "down"
    state.record_health(OK, 2.0)
    state.record_scrape(EngineScrape(0.0, 0.0, 0.0, prefix_cache_queries=0), 2.0)
    assert (state.restarts, state.recheck) == (0, False)
