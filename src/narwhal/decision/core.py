"""The protocol between the attempt runner and the decision core.

The attempt runner (`narwhal.dispatch`, through its asyncio shell `AdmissionGate`) asks
only this of the core, in values (`messages.py`), with the time of each call. The first
implementation is `Brain`, in the same process; a transport to a core in another process
implements the same methods (Step 16: several relay workers, one decision process).

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
