"""The first-event limit's derivation and the engines' observed first-event times (sans-IO:
values in, a number out, no clock); the limit itself and the idle gap, on a loop."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field

import pytest

from narwhal.engines.timeouts import (
    DEFAULT_S,
    FLOOR_S,
    MAX_BACKOFF,
    PROJECTION_MULTIPLE,
    FirstEventLimit,
    FirstEventTimes,
    IdleGap,
    TimeoutPhase,
    UpstreamTimeout,
    first_event_timeout,
)


def derived(
    *,
    configured: float | None = None,
    projected: float | None = None,
    observed: float | None = None,
    budget: float = 2.0,
    backoff: float = 1,
    remaining: float = 600.0,
) -> float | None:
    return first_event_timeout(
        configured,
        projected_s=projected,
        observed_s=observed,
        budget_s=budget,
        backoff=backoff,
        remaining_s=remaining,
    )


def test_a_configured_limit_is_taken_as_it_is() -> None:
    assert derived(configured=0.25, projected=10.0, observed=50.0, backoff=8) == 0.25


def test_a_projection_gives_a_multiple_of_its_upper_bound() -> None:
    assert derived(projected=1.5) == PROJECTION_MULTIPLE * 1.5


def test_a_short_projection_is_held_to_the_budget_and_the_floor() -> None:
    # A limit shorter than the budget would give up on requests that can still make it.
    assert derived(projected=0.01, budget=2.0) == 2.0
    assert derived(projected=0.01, budget=0.2) == FLOOR_S


def test_the_projection_wins_over_what_the_engine_was_seen_to_do() -> None:
    assert derived(projected=1.0, observed=20.0) == PROJECTION_MULTIPLE * 1.0


def test_without_a_projection_the_observed_times_only_raise_the_default() -> None:
    # Open admission: nothing bounds the engine's queue, so a burst is not a stall.
    assert derived(observed=0.05) == DEFAULT_S
    assert derived(observed=20.0) == PROJECTION_MULTIPLE * 20.0


def test_with_nothing_known_the_default_applies() -> None:
    assert derived() == DEFAULT_S


def test_the_backoff_multiplies_a_derived_limit() -> None:
    assert derived(projected=1.5, backoff=2) == 2 * PROJECTION_MULTIPLE * 1.5
    assert derived(backoff=4) == 4 * DEFAULT_S


@pytest.mark.parametrize("remaining", [30.0, 5.0])
def test_the_deadline_caps_every_limit(remaining: float) -> None:
    # At or past the deadline there is no limit of its own: the deadline's 504 ends it.
    assert derived(remaining=remaining) is None
    assert derived(configured=remaining, remaining=remaining) is None
    assert derived(configured=remaining - 0.5, remaining=remaining) == remaining - 0.5


@pytest.mark.parametrize("absurd", [math.nan, math.inf, -1.0])
def test_absurd_inputs_count_as_unknown(absurd: float) -> None:
    assert derived(projected=absurd) == DEFAULT_S
    assert derived(observed=absurd) == DEFAULT_S


def test_observed_times_follow_rfc_6298() -> None:
    times = FirstEventTimes()
    assert times.bound("e") is None
    times.observe("e", 1.0)  # first sample: mean 1, deviation 1/2
    assert times.bound("e") == pytest.approx(1.0 + 4 * 0.5)
    times.observe("e", 2.0)  # deviation 3/4·0.5 + 1/4·1 = 0.625, mean 1 + 1/8
    assert times.bound("e") == pytest.approx(1.125 + 4 * 0.625)
    assert times.bound("other") is None


def test_a_steady_engine_s_bound_converges_on_its_times() -> None:
    times = FirstEventTimes()
    for _ in range(200):
        times.observe("e", 0.3)
    assert times.bound("e") == pytest.approx(0.3, rel=1e-6)


def test_timeouts_double_the_backoff_until_an_answer_in_time() -> None:
    times = FirstEventTimes()
    times.timed_out("e")  # never answered: a backoff, still no bound
    assert (times.backoff("e"), times.bound("e")) == (2, None)
    for _ in range(10):
        times.timed_out("e")
    assert times.backoff("e") == MAX_BACKOFF
    times.observe("e", 0.5)
    assert times.backoff("e") == 1
    assert times.bound("e") == pytest.approx(0.5 + 4 * 0.25)


def test_absurd_samples_are_ignored() -> None:
    times = FirstEventTimes()
    for absurd in (math.nan, math.inf, -2.0):
        times.observe("e", absurd)
    assert times.bound("e") is None
    times.observe("e", 1.0)
    times.observe("e", math.nan)
    assert math.isfinite(times.bound("e") or math.nan)


def test_engines_that_leave_the_configuration_are_forgotten() -> None:
    times = FirstEventTimes()
    times.observe("a", 1.0)
    times.observe("b", 1.0)
    times.forget({"b"})
    assert times.bound("a") is None and times.bound("b") is not None


# --- the idle gap (on the loop, no sockets: the stream is its last-read stamp) --------------


@dataclass
class Stamped:
    """What the gap watches of an engine stream: its last read, and whether reading is
    held for the client."""

    engine_name: str = "e0"
    last_read_at: float = field(default_factory=time.monotonic)
    paused: bool = False
    timed_out: TimeoutPhase | None = None


async def test_silence_past_the_gap_raises_an_idle_timeout() -> None:
    stream = Stamped()
    started = time.monotonic()
    with pytest.raises(UpstreamTimeout) as raised:
        async with IdleGap(stream, 0.05):
            await asyncio.sleep(5)
    assert 0.05 <= time.monotonic() - started < 1.0
    assert (raised.value.phase, raised.value.engine, stream.timed_out) == ("idle", "e0", "idle")
    assert "fleet.idle_timeout_s" in raised.value.message


async def test_reads_within_the_gap_keep_it_open() -> None:
    stream = Stamped()
    async with IdleGap(stream, 0.1):
        for _ in range(8):  # 0.32 s in all, three gaps' worth
            await asyncio.sleep(0.04)
            stream.last_read_at = time.monotonic()
    assert stream.timed_out is None


async def test_no_gap_runs_while_reading_is_held() -> None:
    stream = Stamped(paused=True)
    async with IdleGap(stream, 0.05):
        await asyncio.sleep(0.3)
        stream.paused = False
        stream.last_read_at = time.monotonic()
    assert stream.timed_out is None


async def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    async def relay() -> None:
        async with IdleGap(Stamped(), 5.0):
            await asyncio.sleep(5)

    task = asyncio.create_task(relay())
    await asyncio.sleep(0.02)
    task.cancel()  # the client went away
    with pytest.raises(asyncio.CancelledError):
        await task


# --- the first-event limit (on the loop) ---------------------------------------------------


async def test_a_step_past_the_first_event_limit_raises_a_first_event_timeout() -> None:
    limit = FirstEventLimit(0.05)
    started = time.monotonic()
    with pytest.raises(UpstreamTimeout) as raised:
        await limit.wait(asyncio.sleep(5), "e1")
    assert 0.05 <= time.monotonic() - started < 1.0
    assert (raised.value.phase, raised.value.engine) == ("first_event", "e1")
    assert "fleet.first_event_timeout_s" in raised.value.message


async def test_the_limit_runs_from_the_attempt_s_start_over_every_step() -> None:
    limit = FirstEventLimit(0.15)
    assert await limit.wait(asyncio.sleep(0.1, "head"), "e0") == "head"
    with pytest.raises(UpstreamTimeout):
        await limit.wait(asyncio.sleep(0.1), "e0")  # 0.2 s in all


async def test_past_the_limit_a_later_step_does_not_start() -> None:
    limit = FirstEventLimit(0.01)
    await asyncio.sleep(0.05)  # (between two steps)
    started = []

    async def step() -> None:
        started.append(True)

    with pytest.raises(UpstreamTimeout):
        await limit.wait(step(), "e0")
    assert not started


async def test_an_ended_limit_no_longer_fires() -> None:
    limit = FirstEventLimit(0.05)
    await limit.wait(asyncio.sleep(0), "e0")
    limit.end()
    await asyncio.sleep(0.1)
    assert not limit.expired


async def test_without_a_limit_a_step_runs_as_it_is() -> None:
    assert await FirstEventLimit(None).wait(asyncio.sleep(0.01, "done"), "e0") == "done"


async def test_a_cancellation_from_elsewhere_is_not_a_first_event_timeout() -> None:
    limit = FirstEventLimit(5.0)
    task = asyncio.create_task(limit.wait(asyncio.sleep(5), "e0"))
    await asyncio.sleep(0.02)
    task.cancel()  # the request's deadline, or the client gone
    with pytest.raises(asyncio.CancelledError):
        await task
