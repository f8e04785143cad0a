"""Per-phase upstream timeouts: how long an engine may take to start, and may go quiet.

Every engine attempt runs under these, each inside the next:

    connect      the upstream pool's connect timeout (5 s)
    first event  from the attempt's start (its prefill half included) to the first event
                 of the answer: `fleet.first_event_timeout_s`, or derived for the attempt
                 (`first_event_timeout`). Past it, before any response header went to the
                 client, the attempt is abandoned (its connection closed, so the engine
                 stops work on it), the engine is charged a failure as any other failure
                 before headers, and the request goes to another placement.
    idle gap     after the first event, the longest silence between two reads from the
                 engine: `fleet.idle_timeout_s`. A streaming client then gets one error
                 event and no `[DONE]`; a non-streaming one (nothing sent yet) has the
                 attempt failed like the first-event case.
    total        the request's deadline (504 `terminal_expiry` before headers)

What resets which clock:

- The first-event clock stops at the first *event*: an SSE comment (vLLM's
  `--sse-keep-alive-interval` pings, sent while a request waits) is not progress, and
  before headers the request can still be served elsewhere, so only an answer counts.
- The idle clock restarts at every *byte* from the engine, comments included. After
  headers the request can no longer move, so cutting it loses it: it is cut only when the
  engine looks dead (no byte at all: a hung process, a half-open connection, a partition),
  never for being slow while it says it is alive, which is what keep-alive pings are for
  (an intermediary's idle timer is exactly what they are sent to satisfy). A live engine
  that takes long is bounded by the request's deadline instead. While the relay has paused
  reading for a slow client the engine cannot send, so the gap does not run then.

Either timeout ending an attempt is an `UpstreamTimeout`, an engine failure: when it ends
the request (the last attempt, or a stream after its headers) the client gets 502
`upstream_error`, not 504 `terminal_expiry`. The errors module keeps `terminal_expiry`
for the request's own deadlines (the seed's table: admission wait, original deadline),
which did not pass here; what failed is an engine that stopped answering, which
`upstream_error` ("the engines failed this request") says, and counts, as such. When
the derived first-event limit would reach past the deadline, the deadline is what ends
the attempt, with its 504.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Literal, Protocol, TypeGuard, TypeVar

from narwhal.engines.client import EngineUnavailable

TimeoutPhase = Literal["first_event", "idle"]
_T = TypeVar("_T")

# The derived first-event limit (`first_event_timeout`). A projection's upper bound is
# exceeded by one admitted request in a hundred; four times it is far past what a working
# engine does, even when the projection is off by a factor of two or three.
PROJECTION_MULTIPLE: Final = 4.0
# With a projection, never less than this, nor than the TTFT budget: a limit shorter than
# the budget would give up on requests that can still keep the promise, and below a
# second scheduling noise (a GC pause, a busy host) would be taken for a stall.
FLOOR_S: Final = 1.0
# Without a projection (admission: open, an unmodelled engine, a retry elsewhere), never
# less than this. Nothing then bounds the engine's queue, so a TTFT many times the usual
# one is load, not a stall: a limit from past answers alone would turn every burst into
# retries and 502s. What the engine has been seen to take only raises it (a slow engine
# whose first events take a minute keeps four minutes).
DEFAULT_S: Final = 30.0
# A timed-out engine's next derived limits double, up to this factor, until it answers
# in time again (RFC 6298 section 5.5): a limit too tight for an engine does not fail
# every request sent there.
MAX_BACKOFF: Final = 8


class UpstreamTimeout(EngineUnavailable):
    """An engine took longer than a phase allows (retryable before headers)."""

    def __init__(self, message: str, *, engine: str, phase: TimeoutPhase) -> None:
        super().__init__(message)
        self.engine = engine
        self.phase = phase


def first_event_timeout(
    configured: float | None,
    *,
    projected_s: float | None,
    observed_s: float | None,
    budget_s: float,
    backoff: float,
    remaining_s: float,
) -> float | None:
    """Seconds the attempt may take to its first event, or None when the request's
    deadline (`remaining_s` away) comes first and is the only limit.

    `configured` (`fleet.first_event_timeout_s`) is taken as it is. Else the limit is
    derived, times the engine's `backoff`: from the placement's projected TTFT upper
    bound (`projected_s`) where there is one, `PROJECTION_MULTIPLE` times it but at least
    `FLOOR_S` and the TTFT budget; else from what the engine has been seen to take
    (`observed_s`, from `FirstEventTimes`), `PROJECTION_MULTIPLE` times it but at least
    `DEFAULT_S`."""
    if configured is not None:
        limit = configured
    elif _known(projected_s):
        limit = max(FLOOR_S, budget_s, PROJECTION_MULTIPLE * projected_s) * backoff
    elif _known(observed_s):
        limit = max(DEFAULT_S, PROJECTION_MULTIPLE * observed_s) * backoff
    else:
        limit = DEFAULT_S * backoff
    return limit if limit < remaining_s else None


def _known(seconds: float | None) -> TypeGuard[float]:
    return seconds is not None and 0 <= seconds < math.inf  # (NaN: unknown)


@dataclass(slots=True)
class _Estimate:
    mean: float
    deviation: float
    backoff: int = 1


class FirstEventTimes:
    """What each engine has been seen to take from an attempt's start to its first event,
    smoothed as TCP smooths round-trip times (RFC 6298 section 2: mean and mean
    deviation, gains 1/8 and 1/4, bound = mean + 4 deviations), and the backoff of its
    first-event limit after a timeout. Keyed by engine name (from configuration)."""

    def __init__(self) -> None:
        self._engines: dict[str, _Estimate] = {}

    def observe(self, engine: str, seconds: float) -> None:
        """An attempt's first event came `seconds` after its start: in time, so the
        backoff ends."""
        if not _known(seconds):
            return  # a clock that cannot be: nothing learned
        estimate = self._engines.get(engine)
        if estimate is None or estimate.mean != estimate.mean:  # the first answer
            self._engines[engine] = _Estimate(seconds, seconds / 2)
            return
        estimate.deviation += (abs(estimate.mean - seconds) - estimate.deviation) / 4
        estimate.mean += (seconds - estimate.mean) / 8
        estimate.backoff = 1

    def timed_out(self, engine: str) -> None:
        """An attempt on `engine` reached its first-event limit."""
        estimate = self._engines.get(engine)
        if estimate is None:
            # Never answered: nothing to smooth yet (NaN), only the backoff to keep.
            nan = float("nan")
            estimate = self._engines[engine] = _Estimate(nan, nan)
        estimate.backoff = min(MAX_BACKOFF, estimate.backoff * 2)

    def bound(self, engine: str) -> float | None:
        """The engine's usual first-event time, as an upper bound; None before any."""
        estimate = self._engines.get(engine)
        if estimate is None or estimate.mean != estimate.mean:  # NaN: never answered
            return None
        return estimate.mean + 4 * estimate.deviation

    def backoff(self, engine: str) -> int:
        estimate = self._engines.get(engine)
        return 1 if estimate is None else estimate.backoff

    def forget(self, keep: set[str]) -> None:
        """Engines no longer configured leave (a reload)."""
        for name in [name for name in self._engines if name not in keep]:
            del self._engines[name]


class FirstEventLimit:
    """One attempt's first-event limit (None: the deadline's alone): one timer from the
    attempt's start, under which each step before the first event runs (`wait`); `end()`
    once the first event is in hand.

    Like `IdleGap`, it cancels the waiting task itself and turns the cancellation into
    the timeout on the way out, rather than an `asyncio.Timeout` per step: this runs for
    every request."""

    __slots__ = ("_cancelling", "_task", "_timer", "expired", "seconds")

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.expired = False
        self._task: asyncio.Task[object] | None = None  # while a step waits
        self._cancelling = 0
        self._timer = (
            None
            if seconds is None
            else asyncio.get_running_loop().call_later(seconds, self._expire)
        )

    async def wait(self, step: Coroutine[Any, Any, _T], engine: str) -> _T:
        """`await step` (work on `engine` before its first event), raising
        UpstreamTimeout if the limit passes first; any failure ends the limit."""
        if self._timer is None:
            return await step
        task = asyncio.current_task()
        if self.expired or task is None:
            self.end()
            step.close()  # never started: no "never awaited" warning
            raise self._timeout(engine)
        self._task = task
        self._cancelling = task.cancelling()
        try:
            return await step
        except asyncio.CancelledError:
            self.end()
            if self.expired and task.uncancel() <= self._cancelling:
                raise self._timeout(engine) from None
            raise
        except BaseException:
            self.end()
            raise
        finally:
            self._task = None

    def end(self) -> None:
        """The first event is in hand (or the attempt is over): no limit from now on."""
        timer = self._timer
        if timer is not None:
            timer.cancel()

    def _expire(self) -> None:
        self.expired = True
        task = self._task
        if task is not None and not task.done():
            task.cancel()

    def _timeout(self, engine: str) -> UpstreamTimeout:
        return UpstreamTimeout(
            f"engine {engine} sent no event within {self.seconds:.3g} s "
            "(fleet.first_event_timeout_s)",
            engine=engine,
            phase="first_event",
        )


class Watched(Protocol):
    """What the idle gap watches: an engine stream's last read, and whether reading is
    held for the client (`EngineStream`)."""

    engine_name: str
    last_read_at: float  # time.monotonic() of the last bytes from the engine
    paused: bool
    timed_out: TimeoutPhase | None


class IdleGap:
    """`async with`: raise UpstreamTimeout when `limit` seconds pass without a byte from
    the stream (while it is not paused).

    Reads only stamp `stream.last_read_at` (the stream takes the clock for its sink
    anyway): nothing is armed or cancelled per read. One timer is due at the last read
    plus the limit; when it fires early (bytes came since) it is set again from the last
    read, so a live stream costs a timer per `limit` seconds, not one per event. Past the
    limit it cancels the task, as `asyncio.timeout` does, and turns the cancellation into
    the timeout on the way out (without an `asyncio.Timeout`, which costs as much again as
    the rest: this runs once per relayed stream)."""

    __slots__ = ("_cancelling", "_limit", "_stream", "_task", "_timer", "fired")

    def __init__(self, stream: Watched, limit: float) -> None:
        self._stream = stream
        self._limit = limit
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0  # the task's pending cancellations on the way in
        self._timer: asyncio.TimerHandle | None = None
        self.fired = False

    async def __aenter__(self) -> IdleGap:
        task = self._task = asyncio.current_task()
        if task is not None:
            self._cancelling = task.cancelling()
        self._arm(self._stream.last_read_at + self._limit)
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        timer = self._timer
        if timer is not None:
            timer.cancel()
            self._timer = None
        if not self.fired:
            return
        task = self._task
        # The cancellation was this gap's (none came from elsewhere): it becomes the timeout.
        if (
            task is not None
            and task.uncancel() <= self._cancelling
            and kind is asyncio.CancelledError
        ):
            stream = self._stream
            raise UpstreamTimeout(
                f"engine {stream.engine_name} sent nothing for {self._limit:g} s "
                "(fleet.idle_timeout_s)",
                engine=stream.engine_name,
                phase="idle",
            ) from None

    def _arm(self, due: float) -> None:
        delay = max(0.0, due - time.monotonic())
        self._timer = asyncio.get_running_loop().call_later(delay, self._check)

    def _check(self) -> None:
        stream = self._stream
        now = time.monotonic()
        if stream.paused:
            # Reading is held until the client catches up: the engine cannot send now.
            self._arm(now + self._limit)
            return
        due = stream.last_read_at + self._limit
        if now < due:
            self._arm(due)
            return
        self._timer = None
        task = self._task
        if task is None or task.done():
            return
        self.fired = True
        stream.timed_out = "idle"
        task.cancel()
