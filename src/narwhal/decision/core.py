"""The protocol between the attempt runner and the decision core.

The attempt runner (`narwhal.dispatch`, through its asyncio shell `AdmissionGate`) asks
only this of the core, in values (`messages.py`), with the time of each call.

- `DecisionCore` is the core itself, synchronous: `Brain` implements it.
- `AsyncDecisionCore` is what the gate speaks. The three calls that answer the request
  itself (`offer`, `counted`, `failed`) are awaited, because a core in another process
  answers a round trip later (`narwhal.transport.RemoteCore`, Step 16). Events are sent
  without waiting: in process their wakeups come back at once, from another process they
  arrive later, through the gate's `wake`.
- `InProcessCore` adapts a `DecisionCore` in this process to it, at the cost of a
  coroutine per call.

Besides the messages, a few read-only questions a worker asks before or while it runs an
attempt, answered in values too: whether the router admits at all (readiness), the
model's context length (the 400 before any engine work), what an engine can do (its
resolved capabilities, by name), whether a retry would have somewhere to go (how long a
first event may take), and the counts the router's gauges export.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from narwhal.decision.messages import (
    Answer,
    Counted,
    Failed,
    Finished,
    FirstToken,
    Offer,
    PrefillDone,
    Progress,
    Reconsider,
    Wakeups,
)
from narwhal.protocol.dialects import DialectCapabilities


@dataclass(frozen=True, slots=True)
class AdmissionCounts:
    """What the router holds now: retention places, queued requests, slots in use."""

    retained: int
    queued: int
    prefill_in_use: int
    decode_in_use: int


class DecisionCore(Protocol):
    def offer(self, offer: Offer, now: float) -> tuple[Answer, Wakeups]: ...

    def counted(self, counted: Counted, now: float) -> tuple[Answer, Wakeups]: ...

    def prefill_done(self, event: PrefillDone, now: float) -> Wakeups: ...

    def first_token(self, event: FirstToken, now: float) -> Wakeups: ...

    def progress(self, event: Progress, now: float) -> None: ...

    def failed(self, event: Failed, now: float) -> tuple[Answer, Wakeups]: ...

    def finished(self, event: Finished, now: float) -> Wakeups: ...

    def reconsider(self, event: Reconsider, now: float) -> Wakeups: ...

    def readiness(self) -> str | None:
        """Why the router does not admit now ("no_engines" without a path), or None."""
        ...

    def max_model_len(self) -> int | None: ...

    def capabilities(self, engine: str) -> DialectCapabilities: ...

    def could_retry(self, request_id: str, engine: str) -> bool: ...

    def counts(self) -> AdmissionCounts: ...


class AsyncDecisionCore(Protocol):
    """What the gate speaks: the answers to a request awaited, events sent."""

    async def offer(self, offer: Offer, now: float) -> tuple[Answer, Wakeups]: ...

    async def counted(self, counted: Counted, now: float) -> tuple[Answer, Wakeups]: ...

    async def failed(self, event: Failed, now: float) -> tuple[Answer, Wakeups]: ...

    def prefill_done(self, event: PrefillDone, now: float) -> Wakeups: ...

    def first_token(self, event: FirstToken, now: float) -> Wakeups: ...

    def progress(self, event: Progress, now: float) -> None: ...

    def finished(self, event: Finished, now: float) -> Wakeups: ...

    def reconsider(self, event: Reconsider, now: float) -> Wakeups: ...

    def readiness(self) -> str | None: ...

    def max_model_len(self) -> int | None: ...

    def capabilities(self, engine: str) -> DialectCapabilities: ...

    def could_retry(self, request_id: str, engine: str) -> bool: ...

    def counts(self) -> AdmissionCounts: ...


class InProcessCore:
    """A `DecisionCore` in this process as an `AsyncDecisionCore`: every answer at once."""

    __slots__ = (
        "capabilities",
        "core",
        "could_retry",
        "counts",
        "finished",
        "first_token",
        "max_model_len",
        "prefill_done",
        "progress",
        "readiness",
        "reconsider",
    )

    def __init__(self, core: DecisionCore) -> None:
        self.core = core
        # The synchronous calls are the core's own bound methods: nothing in between.
        self.prefill_done = core.prefill_done
        self.first_token = core.first_token
        self.progress = core.progress
        self.finished = core.finished
        self.reconsider = core.reconsider
        self.readiness = core.readiness
        self.max_model_len = core.max_model_len
        self.capabilities = core.capabilities
        self.could_retry = core.could_retry
        self.counts = core.counts

    async def offer(self, offer: Offer, now: float) -> tuple[Answer, Wakeups]:
        return self.core.offer(offer, now)

    async def counted(self, counted: Counted, now: float) -> tuple[Answer, Wakeups]:
        return self.core.counted(counted, now)

    async def failed(self, event: Failed, now: float) -> tuple[Answer, Wakeups]:
        return self.core.failed(event, now)
