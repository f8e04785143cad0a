"""What admission decides from a request's prompt, before any placement.

Three things, in this order, on the size the front gave the prompt (`RequestContext`):

1. the placement request: the prompt's tokens, the output it may ask for (capped by
   the model's context), the output length predicted for it, and when its first token
   is due;
2. the context-length 400, before any engine work, on the least the engines' count can
   be (an estimate is held to the low end of its bounds);
3. in predictive admission, the TTFT check: an estimated prompt whose bounds could flip
   the check's verdict (or whether it fits the context) first waits, bounded by
   `admission.sizing_wait_s`, for an engine's count; every other request is decided at
   once, and so is one whose only flip is to a retryable refusal while the check is
   refusing more than 5% of requests (`PredictiveCheck.overloaded`): it is judged at the
   high end of its bounds. The verdict is a 429 raised here, or the projection written
   on the ticket.

No engine I/O here beyond the awaited count (`EngineCount`, the sizer's bounded wait).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

from narwhal.admission.predictive import PredictiveCheck
from narwhal.admission.queue import Ticket
from narwhal.config import Config
from narwhal.lease import RequestContext
from narwhal.models.lengths import OutputLengths
from narwhal.protocol.context import check_context_length
from narwhal.protocol.requests import CompletionRequest, Route
from narwhal.scheduler.placement import PlacementRequest
from narwhal.scheduler.registry import EngineRegistry
from narwhal.scheduler.scheduler import Scheduler
from narwhal.sizing import PromptSize
from narwhal.sizing.bounds import context_fit, needs_engine_count

# (route, the prompt's size, how long to wait) -> an engine's count, or the size marked
# "fallback" (`WorkloadSizer.engine_count`).
EngineCount = Callable[[Route, PromptSize, float], Awaitable[PromptSize]]


class PromptAdmission:
    def __init__(
        self,
        config: Config,
        registry: EngineRegistry,
        scheduler: Scheduler,
        *,
        check: PredictiveCheck | None = None,
        lengths: OutputLengths | None = None,
        engine_count: EngineCount | None = None,
        admitted: Callable[[str, float, float], None] | None = None,
    ) -> None:
        """`check`, `lengths`: predictive admission (the TTFT check, output-length
        learning); `engine_count`: an engine's count of a prompt whose estimate could
        flip the check, within a bounded wait; `admitted(tenant, work, now)`: told of
        each request admitted, with its work in tokens (the tenants' shares)."""
        self._admitted = admitted
        self.config = config
        self._registry = registry
        self._scheduler = scheduler
        self._check = check
        self._lengths = lengths
        self._engine_count = engine_count

    def placement_request(
        self, request: CompletionRequest, context: RequestContext
    ) -> PlacementRequest:
        lengths = self._lengths
        prefix = self._scheduler.prefix
        blocks = None if prefix is None else prefix.blocks_of(request)
        if lengths is None:
            sized = PlacementRequest.sized(request.route, context.prompt_tokens, request.max_tokens)
            return replace(sized, prefix=blocks, priority=context.priority, tenant=context.tenant)
        cap = request.max_tokens
        context_len = self._registry.max_model_len()
        if context_len is not None:
            # The output cannot run past the model's context, whatever max_tokens says.
            room = max(1, context_len - context.prompt_tokens)
            cap = room if cap is None else min(cap, room)
        return PlacementRequest(
            route=request.route,
            prompt_tokens=context.prompt_tokens,
            max_tokens=cap,
            predicted_output=lengths.predict(request.route, context.prompt_tokens, cap),
            ttft_due=context.arrived + self.config.admission.ttft_target_s,
            prefix=blocks,
            priority=context.priority,
            tenant=context.tenant,
        )

    def check_context_length(self, request: CompletionRequest, context: RequestContext) -> None:
        """The 400 for a request that cannot fit the engines' context, before any work.
        A prompt whose count is not exact (not the tokenizer's, not an engine's) is held to
        the least the engines' count can be: the low end of its estimate's bounds, as the
        engines' usage has taught them (wide until it has)."""
        limit = self._registry.max_model_len()
        if limit is None:
            return
        size = context.prompt_size
        if size is None or size.source in ("local", "engine"):
            check_context_length(request, least=context.prompt_tokens, exact=True, limit=limit)
            return
        least = max(1, size.low)
        check_context_length(request, least=least, exact=False, limit=limit)

    async def check_budget(
        self,
        request: CompletionRequest,
        context: RequestContext,
        ticket: Ticket,
        queued: Callable[[], int],
    ) -> None:
        """Predictive admission's verdict on the ticket (nothing without a check): a 429
        raised, or the projection it was admitted on written on the ticket. `queued()`:
        the requests waiting ahead of it now (it changes while a count is awaited)."""
        check = self._check
        if check is None:
            self._count_admitted(ticket)
            return
        await self._settle_size(request, context, ticket, check, queued)
        if context.prompt_size is not None and context.prompt_size.source == "engine":
            self.check_context_length(request, context)  # now on the engine's count
        now = time.monotonic()
        projection = check.check(ticket.request, arrived=context.arrived, now=now, queued=queued())
        if projection is not None:
            ticket.projected_ttft = projection.raw
            ticket.projected_upper = projection.upper
            ticket.checked_at = now
        self._count_admitted(ticket)

    def _count_admitted(self, ticket: Ticket) -> None:
        if self._admitted is not None:
            placed = ticket.request
            work = placed.prompt_tokens + placed.predicted_output
            self._admitted(placed.tenant, work, time.monotonic())

    async def _settle_size(
        self,
        request: CompletionRequest,
        context: RequestContext,
        ticket: Ticket,
        check: PredictiveCheck,
        queued: Callable[[], int],
    ) -> None:
        """An estimated prompt whose bounds could change the check's verdict (or whether
        it fits the context) waits, bounded, for an engine's count; the ticket is then
        sized by it. Any other request goes on at once, sized as it is."""
        size = context.prompt_size
        if size is None or size.settled or self._engine_count is None:
            return
        placement = ticket.request
        now = time.monotonic()
        waiting = queued()
        context_len = self._registry.max_model_len()

        def verdict(tokens: int) -> tuple[str, bool]:
            sized = replace(placement, prompt_tokens=tokens)
            return (
                check.verdict(sized, arrived=context.arrived, now=now, queued=waiting),
                context_fit(tokens, request.max_tokens, context_len),
            )

        if not needs_engine_count(size, verdict):
            return
        high = verdict(size.high)
        if high[0] == "projected" and high[1] == verdict(size.low)[1] and check.overloaded(now):
            # Only the budget's verdict could flip, to a retryable refusal, and the fleet
            # is refusing anyway: whichever request is refused, the next arrival takes its
            # place, so the wait (up to sizing_wait_s on a busy engine) would only delay
            # the 429. Judged at the high end of its bounds, at once. Never for the
            # prompt-alone refusal (no retry: the true count may fit) or the context.
            self._size_ticket(request, context, ticket, size.high)
            return
        counted = await self._engine_count(request.route, size, self.config.admission.sizing_wait_s)
        context.prompt_size = counted
        self._size_ticket(request, context, ticket, counted.tokens)

    def _size_ticket(
        self, request: CompletionRequest, context: RequestContext, ticket: Ticket, tokens: int
    ) -> None:
        if tokens != context.prompt_tokens:
            context.prompt_tokens = tokens
            ticket.request = self.placement_request(request, context)
