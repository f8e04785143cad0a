"""The asyncio shell of the decision core: waiting with a deadline, waking who may go.

The decisions are the core's (`narwhal.decision`, sans-IO, in values keyed by request
id); this class passes it the time, parks each queued request on a future and resolves
the futures its wakeups name, placed or unplaceable. A request leaves the queue when it
is placed, when its admission wait or original deadline expires (504 terminal_expiry),
when no eligible engine is left for it (`Unplaceable`) or when its client goes away (the
task is cancelled); in each case its `release` gives back exactly what it held.

It also keeps the core told of what requests produce (decode correction), in batches: the
output count of every request decoding, at most every `progress_every_s`, sent before the
next message that could use it. Nothing goes to the core per event.

The core answers a request's own calls awaited (`AsyncDecisionCore`: at once in
process, a round trip later from a decision process); the wakeups of events come with
their answer in process, or later through `wake`. A wakeup may then name a request
whose Queued answer has arrived but whose handler has not parked yet: it is kept for
that request (`_early`) until it parks or is released.

Times passed to the core come from `clock` (time.monotonic); deadlines are the event
loop's clock, which is what asyncio's timers use.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from narwhal.decision.core import AsyncDecisionCore
from narwhal.decision.messages import (
    Answer,
    Counted,
    Failed,
    Finished,
    FirstToken,
    NeedsCount,
    Offer,
    OutputSummary,
    Placed,
    PrefillDone,
    Progress,
    Queued,
    Reconsider,
    Refused,
    Wakeups,
)
from narwhal.errors import CapacityRejected, RouterUnavailable, TerminalExpiry
from narwhal.observability.metrics import RouterMetrics
from narwhal.ops.drain import Drain
from narwhal.scheduler.registry import EngineEntry

# How stale the core's view of decoding requests' output may be (what its decode books
# read at most this often anyway: `narwhal.models.decode`).
PROGRESS_EVERY_S = 0.05


class NoPlacement(Exception):
    """No eligible engine is left for this request (none at all, or every one failed it)."""


class Producing(Protocol):
    """A decoding request's output so far (its `OutputTracker`)."""

    @property
    def tokens(self) -> int: ...


class AdmissionGate:
    def __init__(
        self,
        core: AsyncDecisionCore,
        metrics: RouterMetrics,
        *,
        wait_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
        progress_every_s: float = PROGRESS_EVERY_S,
    ) -> None:
        self.core = core
        self.wait_timeout_s = wait_timeout_s  # the admission wait (a reload may change it)
        self._metrics = metrics
        self._clock = clock
        self._progress_every_s = progress_every_s
        self._progress_at = float("-inf")
        self._waiters: dict[str, asyncio.Future[Placed]] = {}
        # Wakeups that came before their request parked (from another process only).
        self._early: dict[str, Placed | None] = {}
        self._decoding: dict[str, Producing] = {}
        # Read at scrape time: nothing to update on the hot path.
        metrics.retained.set_function(lambda: core.counts().retained)
        metrics.queue_depth.set_function(lambda: core.counts().queued)
        metrics.prefill_slots.set_function(lambda: core.counts().prefill_in_use)
        metrics.decode_slots.set_function(lambda: core.counts().decode_in_use)

    def watch_engine(self, entry: EngineEntry) -> None:
        """Export the engine's requests by phase (from the start, or once it is added)."""
        load = entry.load
        requests = self._metrics.engine_requests
        requests.labels(entry.name, "prefill").set_function(lambda: load.prefilling)
        requests.labels(entry.name, "decode").set_function(lambda: load.decoding)

    def unwatch_engine(self, name: str) -> None:
        """The engine left the fleet: its series go."""
        for phase in ("prefill", "decode"):
            self._metrics.engine_requests.remove(name, phase)

    def _now(self) -> float:
        """The time for the core, with the decoding requests' output sent first when the
        last batch is older than `progress_every_s`."""
        now = self._clock()
        if self._decoding and now - self._progress_at >= self._progress_every_s:
            self._progress_at = now
            produced = tuple((rid, out.tokens) for rid, out in self._decoding.items())
            self.core.progress(Progress(produced), now)
        return now

    async def decide(
        self,
        offer: Offer,
        count: Callable[[], Awaitable[int]],
        resized: Callable[[int], None],
    ) -> Placed | Queued:
        """The core's answer to an offer: placed or queued; a refusal is raised (429, 503),
        and NoPlacement when no engine is left for it. `count()`: the engine's count
        of the prompt, awaited only when the core asks for it; `resized(tokens)`: told
        when the request was decided on another size than offered."""
        answer, woken = await self.core.offer(offer, self._now())
        self.wake(woken)
        if isinstance(answer, NeedsCount):
            tokens = await count()
            counted = Counted(offer.request_id, tokens)
            answer, woken = await self.core.counted(counted, self._now())
            self.wake(woken)
        if isinstance(answer, Placed | Queued | Refused) and answer.prompt_tokens != (
            offer.prompt_tokens
        ):
            resized(answer.prompt_tokens)
        return self._placed_or_queued(answer)

    async def placement(self, answer: Placed | Queued, deadline: float) -> Placed:
        """Where the request runs: at once, or once a wakeup places it; `deadline` is the
        request's (loop time). Raises 504 when the admission wait or the deadline expires
        first, and NoPlacement when no eligible engine is left."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        placed = (
            answer if isinstance(answer, Placed) else await self._wait(answer, started, deadline)
        )
        self._metrics.admission_wait.observe(loop.time() - started)
        return placed

    async def retry(
        self, request_id: str, failed: str, output: OutputSummary | None, deadline: float
    ) -> Placed:
        """Place a request whose attempt failed on engine `failed` again, elsewhere; the
        same waits and errors as `placement` (but never a full queue: it was admitted)."""
        answer, woken = await self.core.failed(Failed(request_id, failed, output), self._now())
        self.wake(woken)
        placed_or_queued = self._placed_or_queued(answer)
        if isinstance(placed_or_queued, Placed):
            return placed_or_queued
        return await self._wait(placed_or_queued, asyncio.get_running_loop().time(), deadline)

    def _placed_or_queued(self, answer: Answer) -> Placed | Queued:
        if isinstance(answer, Refused):
            error = answer.error
            if isinstance(error, CapacityRejected):
                self._metrics.rejected.labels(error.reason).inc()
            raise error
        if isinstance(answer, Placed | Queued):
            return answer
        raise NoPlacement()  # Unplaceable (or NeedsCount twice: a core's bug, not a wait)

    async def _wait(self, queued: Queued, started: float, deadline: float) -> Placed:
        request_id = queued.request_id
        if request_id in self._early:
            early = self._early.pop(request_id)
            if early is None:
                raise NoPlacement()
            return early
        wait_until = started + self.wait_timeout_s
        stage = "admission_wait" if wait_until < deadline else "deadline_before_headers"
        future: asyncio.Future[Placed] = asyncio.get_running_loop().create_future()
        self._waiters[request_id] = future
        try:
            async with asyncio.timeout_at(min(wait_until, deadline)):
                return await future
        except TimeoutError:
            if future.done() and not future.cancelled():
                error = future.exception()
                if error is None:
                    return future.result()  # placed in the same instant the wait expired
                raise error from None
            self.wake(self.core.finished(Finished(request_id), self._now()))
            self._metrics.expired.labels(stage).inc()
            raise TerminalExpiry(
                "The request expired waiting for admission."
                if stage == "admission_wait"
                else "The request deadline expired before the response started."
            ) from None
        finally:
            self._waiters.pop(request_id, None)
            if future.done() and not future.cancelled():
                future.exception()  # retrieved, whoever raised first

    def prefill_done(self, request_id: str) -> None:
        """A P/D pair's prefill engine answered: its slot there is free."""
        self.wake(self.core.prefill_done(PrefillDone(request_id), self._now()))

    def first_token(self, request_id: str, output: Producing) -> None:
        """The first output is in hand: the prefill slot becomes a decode slot, and the
        request's output is reported from now on."""
        self.wake(self.core.first_token(FirstToken(request_id), self._now()))
        self._decoding[request_id] = output

    def release(self, request_id: str, output: OutputSummary | None = None) -> None:
        """The request is over: whatever it holds goes back (idempotent); `output`: what
        its last attempt produced, for learning."""
        self._decoding.pop(request_id, None)
        self._early.pop(request_id, None)
        self.wake(self.core.finished(Finished(request_id, output), self._now()))

    def refuse_waiting(self, error: Callable[[], Exception]) -> None:
        """Fail every queued request with `error()` (the router stopped admitting); each
        leaves the queue as its own handler unwinds and releases it."""
        for future in list(self._waiters.values()):
            if not future.done():
                future.set_exception(error())

    def refuse_at(self, drain: Drain) -> None:
        """At the shutdown's drain deadline, a request still waiting for a slot is refused
        like one arriving now (a retry may be waiting: its first attempt failed during the
        drain)."""
        drain.subscribe(
            lambda: self.refuse_waiting(
                lambda: RouterUnavailable("This router is shutting down (drain deadline).")
            )
        )

    def reconsider(self, monitoring_degraded: bool | None = None) -> None:
        """Engines came or went, or limits changed: place or fail the waiting requests
        accordingly (`Reconsider`)."""
        self.wake(self.core.reconsider(Reconsider(monitoring_degraded), self._now()))

    def wake(self, wakeups: Wakeups) -> None:
        """Resolve the waits `wakeups` names (the core's answer to an event, or a batch
        pushed from a decision process)."""
        if not wakeups:
            return
        waiters = self._waiters
        for placed in wakeups.placed:
            future = waiters.get(placed.request_id)
            if future is None:
                self._early[placed.request_id] = placed
            elif not future.done():
                future.set_result(placed)
        for request_id in wakeups.unplaceable:
            future = waiters.get(request_id)
            if future is None:
                self._early[request_id] = None
            elif not future.done():
                future.set_exception(NoPlacement())
