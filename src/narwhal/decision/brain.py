"""The decision core (sans-IO): every admission and placement decision, behind one seam.

    offer(Offer, now)            router state, a path, retention, the predictive check
                                 (or NeedsCount), then placed, queued or refused
    counted(Counted, now)        the engine's count came: the check, then as an offer
    prefill_done / first_token   phase transitions, answered with Wakeups
    progress(Progress, now)      the output decoding requests have produced (decode
                                 correction reads it)
    failed(Failed, now)          the attempt failed before headers: placed again elsewhere
    finished(Finished, now)      all the request held goes back, retention too
    reconsider(now)              engines came or went, limits changed

Its parts are the ones admission has always had, and it is their only caller on the
request path: the router's state (`narwhal.ops.state`), retention and the admission
queue with placement (`narwhal.admission.controller`, its `Scheduler` and the engine
registry, the per-engine aggregate the fleet monitor and the operator write into), the
predictive check (`narwhal.admission.predictive`), and learning (the controller's
listener, `narwhal.scheduler.learning`). What crosses it is in `messages.py`: values
keyed by request id, with time passed in. Nothing here awaits or reads a clock.

Every offer that was not refused before retention is followed by exactly one `Finished`
(the caller's `finally`); `Finished` for a request the core no longer holds is nothing.
A request refused or found unplaceable keeps its retention place until then, as it
keeps its handler.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from narwhal.admission.controller import Admission
from narwhal.admission.controller import Wakeups as TicketWakeups
from narwhal.admission.predictive import PredictiveCheck
from narwhal.admission.queue import Ticket, TicketState
from narwhal.decision.core import AdmissionCounts
from narwhal.decision.messages import (
    NO_WAKEUPS,
    Answer,
    Counted,
    Failed,
    Finished,
    FirstToken,
    NeedsCount,
    Offer,
    Placed,
    PrefillDone,
    Progress,
    Queued,
    Reconsider,
    Refused,
    Unplaceable,
    Wakeups,
)
from narwhal.errors import BackendUnavailable, CapacityRejected, NarwhalError, RouterUnavailable
from narwhal.models.lengths import OutputLengths
from narwhal.ops.state import RouterState
from narwhal.protocol.dialects import DialectCapabilities
from narwhal.scheduler.placement import PlacementRequest
from narwhal.scheduler.registry import EngineRegistry
from narwhal.scheduler.scheduler import Scheduler
from narwhal.sizing.bounds import context_fit


@dataclass(slots=True)
class BrainSettings:
    """What the core decides by that a reload may change."""

    ttft_target_s: float


class Brain:
    def __init__(
        self,
        settings: BrainSettings,
        state: RouterState,
        admission: Admission,
        *,
        check: PredictiveCheck | None = None,
        lengths: OutputLengths | None = None,
        admitted: Callable[[str, float, float], None] | None = None,
    ) -> None:
        """`check`, `lengths`: predictive admission (the TTFT check, output lengths);
        `admitted(tenant, work, now)`: told of each request admitted, with its work in
        tokens (the tenants' shares)."""
        self.settings = settings
        self.state = state
        self.admission = admission
        self.check = check
        self._lengths = lengths
        self._admitted = admitted
        self._tickets: dict[str, Ticket] = {}  # every request holding a retention place
        self._offers: dict[str, Offer] = {}  # offers waiting for an engine's count

    # --- what the core knows, for the attempt runner -------------------------------------

    @property
    def scheduler(self) -> Scheduler:
        return self.admission.scheduler

    @property
    def registry(self) -> EngineRegistry:
        return self.admission.scheduler.registry

    def readiness(self) -> str | None:
        """Why the router does not admit now ("no_engines" without a path), or None."""
        reason = self.state.unavailable_reason()
        if reason is not None:
            return reason
        return None if self.scheduler.has_path() else "no_engines"

    def max_model_len(self) -> int | None:
        return self.registry.max_model_len()

    def capabilities(self, engine: str) -> DialectCapabilities:
        """What the engine can do, as the fleet monitor resolved it."""
        entry = self.registry.get(engine)
        assert entry is not None, f"engine {engine} is not in the fleet"
        return entry.capabilities

    def counts(self) -> AdmissionCounts:
        admission = self.admission
        return AdmissionCounts(
            admission.retained,
            len(admission.queue),
            admission.prefill_in_use,
            admission.decode_in_use,
        )

    def could_retry(self, request_id: str, engine: str) -> bool:
        """Whether the request could be placed avoiding the engines that failed it and
        `engine` too (a first-event timeout there would have somewhere to go)."""
        ticket = self._tickets.get(request_id)
        excluded = set() if ticket is None else ticket.excluded
        return self.scheduler.could_place(excluded | {engine})

    # --- offers --------------------------------------------------------------------------

    def offer(self, offer: Offer, now: float) -> tuple[Answer, Wakeups]:
        """Admit, queue or refuse a request; `NeedsCount` when its size's bounds could
        flip the decision (answer with `counted`)."""
        request_id = offer.request_id
        reason = self.state.unavailable_reason()
        if reason is not None:
            return Refused(
                request_id, RouterUnavailable.not_admitting(reason), offer.prompt_tokens
            ), NO_WAKEUPS
        if not self.scheduler.has_path():
            error = BackendUnavailable("No placement-eligible engine serves this request.")
            return Refused(request_id, error, offer.prompt_tokens), NO_WAKEUPS
        try:
            self.admission.arrive()
        except CapacityRejected as rejection:
            return Refused(request_id, rejection, offer.prompt_tokens), NO_WAKEUPS
        ticket = Ticket(
            self._placement_request(offer, offer.prompt_tokens),
            deadline=offer.deadline,
            request_id=request_id,
        )
        self._tickets[request_id] = ticket
        check = self.check
        if check is not None and offer.countable and offer.low != offer.high:
            tokens = self._size_without_count(offer, check, now)
            if tokens is None:
                self._offers[request_id] = offer
                return NeedsCount(request_id), NO_WAKEUPS
            if tokens != offer.prompt_tokens:
                ticket.request = self._placement_request(offer, tokens)
        return self._check_and_start(ticket, offer.arrived, now)

    def counted(self, counted: Counted, now: float) -> tuple[Answer, Wakeups]:
        """The engine's count of a prompt that `offer` answered `NeedsCount` for."""
        request_id = counted.request_id
        offer = self._offers.pop(request_id, None)
        ticket = self._tickets.get(request_id)
        if offer is None or ticket is None:
            return Unplaceable(request_id), NO_WAKEUPS  # finished meanwhile
        if counted.tokens != ticket.request.prompt_tokens:
            ticket.request = self._placement_request(offer, counted.tokens)
        return self._check_and_start(ticket, offer.arrived, now)

    def _placement_request(self, offer: Offer, prompt_tokens: int) -> PlacementRequest:
        lengths = self._lengths
        if lengths is None:
            sized = PlacementRequest.sized(offer.route, prompt_tokens, offer.max_tokens)
            return replace(sized, prefix=offer.prefix, priority=offer.priority, tenant=offer.tenant)
        cap = offer.max_tokens
        context_len = self.registry.max_model_len()
        if context_len is not None:
            # The output cannot run past the model's context, whatever max_tokens says.
            room = max(1, context_len - prompt_tokens)
            cap = room if cap is None else min(cap, room)
        return PlacementRequest(
            route=offer.route,
            prompt_tokens=prompt_tokens,
            max_tokens=cap,
            predicted_output=lengths.predict(offer.route, prompt_tokens, cap),
            ttft_due=offer.arrived + self.settings.ttft_target_s,
            prefix=offer.prefix,
            priority=offer.priority,
            tenant=offer.tenant,
        )

    def _size_without_count(self, offer: Offer, check: PredictiveCheck, now: float) -> int | None:
        """The size to decide an estimated prompt on without an engine's count, or None
        when its bounds could change the check's verdict (or whether it fits the
        context), and the count must be waited for.

        Except: where only the budget's verdict could flip, to a retryable refusal, and
        the fleet is refusing anyway, whichever request is refused the next arrival takes
        its place, so the wait (up to sizing_wait_s on a busy engine) would only delay the
        429: judged at the high end of its bounds, at once. Never for the prompt-alone
        refusal (no retry: the true count may fit) or the context."""
        waiting = self.admission.queue.ahead(offer.priority)
        context_len = self.registry.max_model_len()

        def verdict(tokens: int) -> tuple[str, bool]:
            sized = self._placement_request(offer, tokens)
            return (
                check.verdict(sized, arrived=offer.arrived, now=now, queued=waiting),
                context_fit(tokens, offer.max_tokens, context_len),
            )

        high = verdict(offer.high)
        low = verdict(offer.low)
        if high == low:
            return offer.prompt_tokens
        if high[0] == "projected" and high[1] == low[1] and check.overloaded(now):
            return offer.high
        return None

    def _check_and_start(
        self, ticket: Ticket, arrived: float, now: float
    ) -> tuple[Answer, Wakeups]:
        try:
            return self._decide(ticket, arrived, now)
        finally:
            if self.check is not None:
                self.check.parts.forget()  # projected for this decision only

    def _decide(self, ticket: Ticket, arrived: float, now: float) -> tuple[Answer, Wakeups]:
        request_id = ticket.request_id
        tokens = ticket.request.prompt_tokens
        check = self.check
        if check is not None:
            queued = self.admission.queue.ahead(ticket.priority)
            try:
                projection = check.check(ticket.request, arrived=arrived, now=now, queued=queued)
            except NarwhalError as refusal:
                return Refused(request_id, refusal.with_traceback(None), tokens), NO_WAKEUPS
            if projection is not None:
                ticket.projected_ttft = projection.raw
                ticket.projected_upper = projection.upper
                ticket.checked_at = now
        if self._admitted is not None:
            placed = ticket.request
            self._admitted(placed.tenant, placed.prompt_tokens + placed.predicted_output, now)
        try:
            woken = self.admission.start(ticket, now)
        except CapacityRejected as rejection:
            return Refused(request_id, rejection.with_traceback(None), tokens), NO_WAKEUPS
        return self._answer(ticket, woken)

    def _answer(self, ticket: Ticket, woken: TicketWakeups) -> tuple[Answer, Wakeups]:
        """The ticket's own answer after a start or a retry, and everyone else's wakeups."""
        answer: Answer
        if ticket in woken.unplaceable:
            answer = Unplaceable(ticket.request_id)
        elif ticket.state is TicketState.PREFILL:
            answer = self._placed(ticket)
        else:
            answer = Queued(ticket.request_id, ticket.request.prompt_tokens)
        return answer, self._wakeups(woken, caller=ticket)

    def _placed(self, ticket: Ticket) -> Placed:
        plan = ticket.plan
        assert plan is not None, "placed without a plan"
        return Placed(
            ticket.request_id,
            plan.decode.name,
            None if plan.prefill is None else plan.prefill.name,
            plan.cached_tokens,
            ticket.request.prompt_tokens,
            None if ticket.retrying else ticket.projected_upper,
        )

    def _wakeups(self, woken: TicketWakeups, caller: Ticket | None = None) -> Wakeups:
        if not woken:
            return NO_WAKEUPS
        return Wakeups(
            tuple(self._placed(t) for t in woken.started if t is not caller),
            tuple(t.request_id for t in woken.unplaceable if t is not caller),
        )

    # --- events --------------------------------------------------------------------------

    def prefill_done(self, event: PrefillDone, now: float) -> Wakeups:
        ticket = self._tickets.get(event.request_id)
        if ticket is None:
            return NO_WAKEUPS
        return self._wakeups(self.admission.prefill_answered(ticket, now))

    def first_token(self, event: FirstToken, now: float) -> Wakeups:
        ticket = self._tickets.get(event.request_id)
        if ticket is None:
            return NO_WAKEUPS
        return self._wakeups(self.admission.first_token(ticket, now))

    def progress(self, event: Progress, now: float) -> None:
        """Decode correction: each decoding request's output so far, on its engine's book."""
        tickets = self._tickets
        for request_id, tokens in event.produced:
            ticket = tickets.get(request_id)
            if ticket is None or ticket.state is not TicketState.DECODE or ticket.plan is None:
                continue
            model = ticket.plan.decode.model
            if model is not None:
                model.decoding.produced(ticket, tokens)

    def failed(self, event: Failed, now: float) -> tuple[Answer, Wakeups]:
        """Place the request again, never on `event.engine`: its own answer (placed,
        queued or unplaceable), and the wakeups of the capacity it gave back."""
        ticket = self._tickets.get(event.request_id)
        if ticket is None:
            return Unplaceable(event.request_id), NO_WAKEUPS
        ticket.output = event.output
        woken = self.admission.retry(ticket, event.engine, now)
        ticket.output = None
        return self._answer(ticket, woken)

    def finished(self, event: Finished, now: float) -> Wakeups:
        ticket = self._tickets.pop(event.request_id, None)
        if ticket is None:
            return NO_WAKEUPS
        self._offers.pop(event.request_id, None)
        output = ticket.output = event.output
        unstreamed = ticket.state is TicketState.PREFILL
        woken = self.admission.finish(ticket, now)
        self.admission.leave()
        lengths = self._lengths
        if unstreamed and output is not None and output.complete and output.exact and lengths:
            # Answered in one piece (what vLLM answers only unstreamed): no first token
            # was marked, so learning saw no decode, but its length is exact.
            request = ticket.request
            lengths.observe(request.route, request.prompt_tokens, output.tokens)
        return self._wakeups(woken)

    def reconsider(self, event: Reconsider, now: float) -> Wakeups:
        if event.monitoring_degraded is not None:
            registry = self.registry
            registry.invalidate()
            state = self.state
            state.set(
                "maintenance",
                "maintenance" if registry.whole_fleet_in_maintenance() else None,
                "every engine's wave is in maintenance",
            )
            state.set(
                "monitoring",
                "monitoring_degraded" if event.monitoring_degraded else None,
                "no engine is placeable and monitoring is why",
            )
        return self._wakeups(self.admission.reconsider(now))
