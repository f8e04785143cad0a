"""What crosses the decision seam: frozen values keyed by request id, and nothing else.

The attempt runner (`narwhal.dispatch`) and the decision core (`narwhal.decision.brain`)
speak only these. No engine entry, ticket, tracker or stream crosses: a placement names
its engines, a request's progress and its output arrive as numbers, and time is passed
in with every message. So the core can run in another process (Step 16) behind a
transport that only has to carry these values.

    offer      Offer                 -> Placed | Queued | Refused | NeedsCount | Unplaceable
    counted    Counted               -> the same (the answer to NeedsCount)
    events     PrefillDone, FirstToken, Failed, Finished, Progress, Reconsider -> Wakeups
               (Failed also answers the request's own retry: Placed, Queued or Unplaceable)

Every answer that frees or moves capacity carries `Wakeups`: the queued requests it
placed (each with its placement) and those no engine is left for.
"""

from __future__ import annotations

from dataclasses import dataclass

from narwhal.config import DEFAULT_TENANT
from narwhal.errors import NarwhalError
from narwhal.protocol.requests import Route
from narwhal.scheduler.placement import OutputSummary as OutputSummary
from narwhal.scheduler.prefix_index import PromptBlocks


@dataclass(frozen=True, slots=True)
class Offer:
    """A validated request asking to be admitted. `prompt_tokens` is its size as the front
    counted it, within [`low`, `high`] (equal when the count is exact); `countable`: an
    engine's count can be asked for when the bounds could flip the decision."""

    request_id: str
    route: Route
    prompt_tokens: int
    max_tokens: int | None
    arrived: float  # monotonic, when the request arrived
    deadline: float  # monotonic, by which it must be done
    low: int
    high: int
    countable: bool = False
    priority: int = 0  # its class's rank (admission.classes; 0: the highest)
    tenant: str = DEFAULT_TENANT
    prefix: PromptBlocks | None = None  # its prompt's blocks (cache-aware placement)

    @classmethod
    def exact(
        cls,
        request_id: str,
        route: Route,
        prompt_tokens: int,
        max_tokens: int | None = None,
        *,
        arrived: float = 0.0,
        deadline: float = float("inf"),
        priority: int = 0,
        tenant: str = DEFAULT_TENANT,
        prefix: PromptBlocks | None = None,
    ) -> Offer:
        """An offer whose prompt is counted exactly."""
        return cls(
            request_id,
            route,
            prompt_tokens,
            max_tokens,
            arrived,
            deadline,
            prompt_tokens,
            prompt_tokens,
            priority=priority,
            tenant=tenant,
            prefix=prefix,
        )


@dataclass(frozen=True, slots=True)
class Counted:
    """The engine's count of an offer's prompt (or, where none came in time, the size the
    front falls back on), answering `NeedsCount`."""

    request_id: str
    tokens: int


@dataclass(frozen=True, slots=True)
class Placed:
    """Admitted and placed: run it on `decode` (after `prefill`, for a P/D pair).
    `prompt_tokens`: the size it was decided on; `projected_upper`: the TTFT bound the
    predictive check held it to, on its first placement (None on a retry or unmodelled)."""

    request_id: str
    decode: str
    prefill: str | None = None
    cached_tokens: int = 0
    prompt_tokens: int = 0
    projected_upper: float | None = None

    @property
    def first(self) -> str:
        """The engine that works on the request first (its prefill)."""
        return self.prefill or self.decode

    @property
    def engines(self) -> tuple[str, ...]:
        """The engines it runs on, the prefill half first."""
        return (self.decode,) if self.prefill is None else (self.prefill, self.decode)

    def describe(self) -> str:
        """For logs: "engine d0", or "prefill p0, decode d0"."""
        if self.prefill is None:
            return f"engine {self.decode}"
        return f"prefill {self.prefill}, decode {self.decode}"


@dataclass(frozen=True, slots=True)
class Queued:
    """Admitted, waiting for room: a later `Wakeups` places it (or finds it unplaceable)."""

    request_id: str
    prompt_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Refused:
    """Not admitted, with the error the client gets (429, 503): a value built for the
    client, never raised inside the core, so it carries no frames."""

    request_id: str
    error: NarwhalError
    prompt_tokens: int = 0


@dataclass(frozen=True, slots=True)
class NeedsCount:
    """The prompt's bounds could flip the decision: send `Counted` with an engine's count
    (the offer keeps its place against the retention limit meanwhile)."""

    request_id: str


@dataclass(frozen=True, slots=True)
class Unplaceable:
    """No eligible engine is left for the request (none at all, or every one failed it)."""

    request_id: str


Answer = Placed | Queued | Refused | NeedsCount | Unplaceable


@dataclass(frozen=True, slots=True)
class Wakeups:
    """Queued requests this call placed (in queue order) and those it found unplaceable."""

    placed: tuple[Placed, ...] = ()
    unplaceable: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.placed or self.unplaceable)

    def __add__(self, other: Wakeups) -> Wakeups:
        return Wakeups(self.placed + other.placed, self.unplaceable + other.unplaceable)


NO_WAKEUPS = Wakeups()


@dataclass(frozen=True, slots=True)
class PrefillDone:
    """A P/D pair's prefill engine answered: its slot there is free."""

    request_id: str


@dataclass(frozen=True, slots=True)
class FirstToken:
    """The first output is in hand: the request's prefill slot becomes a decode slot."""

    request_id: str


@dataclass(frozen=True, slots=True)
class Progress:
    """Output tokens produced so far by requests decoding, in one batch."""

    produced: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class Failed:
    """The current attempt failed on `engine` before the response started: place the
    request again, never there."""

    request_id: str
    engine: str
    output: OutputSummary | None = None


@dataclass(frozen=True, slots=True)
class Finished:
    """The request is over (served, failed, expired, gone, or it left the queue): all it
    held goes back, its retention place too."""

    request_id: str
    output: OutputSummary | None = None


@dataclass(frozen=True, slots=True)
class Reconsider:
    """Engine membership or eligibility changed (health, drain, maintenance, profiles,
    engines added or removed) or limits did: place or fail who waits. With
    `monitoring_degraded` (what the fleet monitor says of itself), eligibility is
    recomputed first and the router's own state follows: whole-fleet maintenance, and
    monitoring that leaves no engine placeable."""

    monitoring_degraded: bool | None = None
