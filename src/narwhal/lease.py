"""What a dispatched request holds and gives back (the api reads these; `narwhal.dispatch`
makes them): the answer's counts (`Served`), what the front and the dispatcher tell each
other about a request (`RequestContext`), a whole non-streaming answer (`Assembled`), and
a streaming answer the api relays and must finish exactly once (`StreamLease`), with the
attempt's open spans (`AttemptTrace`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from narwhal.config import DEFAULT_TENANT
from narwhal.engines.stream import EngineStream
from narwhal.engines.timeouts import TimeoutPhase
from narwhal.errors import Outcome
from narwhal.observability.tracing import NO_SPAN, Span
from narwhal.ops.drain import Drain
from narwhal.sizing import PromptSize

if TYPE_CHECKING:
    from narwhal.dispatch import Dispatcher

_DRAIN_TIMEOUT_S = 1.0


@dataclass(frozen=True, slots=True)
class Served:
    """The answer the client got: its tokens (as counted in narwhal_*_tokens_total) and
    its time to first token (arrival to the first output token), if it had one."""

    prompt_tokens: int
    completion_tokens: int
    ttft_s: float | None


@dataclass(slots=True)
class RequestContext:
    """What the front learned of a request besides its body, and what the dispatcher
    tells it back for the request's access line (`engines`, `served`)."""

    request_id: str
    arrived: float  # time.monotonic() when the request arrived
    deadline: float  # time.monotonic() by which it must be done
    prompt_tokens: int  # workload sizing
    authorization: str | None = None  # the client's Authorization header
    prompt_size: PromptSize | None = None  # how the prompt was sized
    span: Span = NO_SPAN  # the request's span; its phases' spans are children (tracing.py)
    engines: tuple[str, ...] = ()  # where its last attempt was placed
    served: Served | None = None  # set once an answer has gone (or is going) to the client
    upstream_timeout: TimeoutPhase | None = None  # the last phase timeout that ended an attempt
    tenant: str = DEFAULT_TENANT  # whose request it is (its client key's tenant)
    priority: int = 0  # its class's rank (admission.classes; 0: the highest)


class Tenancy(Protocol):
    """What the front asks of tenants and classes (`narwhal.admission.tenants`), by name:
    the tenant a key's tenant is served as, the class rank a request runs at (400 for a
    bad X-Narwhal-Priority), and its quotas (429 `tenant_quota_exceeded`): one request
    as it is offered, its prompt's tokens once sized, its output as produced."""

    def resolve(self, name: str) -> str: ...

    def rank(self, name: str, header: Sequence[str]) -> int: ...

    def class_name(self, rank: int) -> str: ...

    def offer(self, name: str, now: float) -> None: ...

    def sized(self, name: str, tokens: int, now: float) -> None: ...

    def produced(self, name: str, tokens: int, now: float) -> None: ...


@dataclass(frozen=True, slots=True)
class Assembled:
    """A non-streaming answer, whole; everything it held is released already."""

    body: dict[str, Any]


class StreamLease:
    """A streaming answer whose first events are in hand and validated (so the status is
    200 from here on). The api relays `first` and then the rest of `stream` until
    `deadline` (loop time), and calls `finish(outcome)` exactly once, in `finally`: that
    closes the engine stream, accounts its output and frees the request's slots."""

    __slots__ = (
        "_dispatcher",
        "_finished",
        "_trace",
        "context",
        "deadline",
        "first",
        "stream",
    )

    def __init__(
        self,
        dispatcher: Dispatcher,
        context: RequestContext,
        stream: EngineStream,
        first: bytes,
        deadline: float,
        trace: AttemptTrace,
    ) -> None:
        self._dispatcher = dispatcher
        self._trace = trace
        self._finished = False
        self.context = context
        self.stream = stream
        self.first = first
        self.deadline = deadline

    @property
    def shutdown(self) -> Drain:
        """The shutdown's drain deadline, which may end the stream before `deadline`."""
        return self._dispatcher.drain

    async def drain(self) -> None:
        """After a complete relay: read the end of the engine's body (usually in hand
        already), so its connection goes back to the pool."""
        stream = self.stream
        if stream.done and not stream.at_eof():
            with contextlib.suppress(OSError, TimeoutError):
                async with asyncio.timeout(_DRAIN_TIMEOUT_S):
                    await stream.drain()

    def finish(self, outcome: Outcome) -> None:
        if self._finished:
            return
        self._finished = True
        dispatcher = self._dispatcher
        metrics = dispatcher.metrics
        if outcome == "expired":
            ended_by_drain = dispatcher.drain.cut_short(self.deadline)
            metrics.expired.labels("shutdown" if ended_by_drain else "deadline_streaming").inc()
        elif outcome == "upstream_error":
            metrics.engine_series(self.stream.engine_name).failures["after_headers"].inc()
        if self.stream.timed_out is not None:
            dispatcher.timed_out(self.stream.engine_name, self.stream.timed_out, self.context)
        try:
            dispatcher.end_attempt(self.stream, self.context)
            dispatcher.count_served(self.stream, self.context, streamed=True)
        finally:
            if outcome in ("upstream_error", "expired"):
                self._trace.fail(f"the stream ended {outcome} after the response started")
            self._trace.end(self.stream)
            # (whatever accounting did: a bug is raised on)
            dispatcher.release(self.context.request_id, self.stream.tracker)


@dataclass(slots=True)
class AttemptTrace:
    """One attempt's open spans: its placement, and its decode request once made (a
    stream's outlives the attempt: its lease ends it)."""

    placement: Span
    decode: Span | None = None

    def fail(self, description: str) -> None:
        self.placement.fail(description)
        if self.decode is not None:
            self.decode.fail(description)

    def end(self, stream: EngineStream | None) -> None:
        decode = self.decode
        if decode is not None:
            if stream is not None and decode.recording:
                decode.set({"narwhal.completion_tokens": stream.tracker.output_tokens()[0]})
            decode.end()
        self.placement.end()
