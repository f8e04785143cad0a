"""Learning from placements: admission's transitions, told to the engines' models.

`PlacementLearning` is the `PlacementListener` of predictive admission. Every transition
admission makes on a ticket arrives here once, with its time, and becomes what the
models learn from:

    placed            the first engine's prefill lane gets the prompt (its estimate)
    prefill_answered  a P/D prefill engine finished: its measured service time
    first_token       a `both` engine's prefill finished, or a P/D decode engine's first
                      step after the KV transfer; and the request's TTFT projection meets
                      what it turned into (the book's calibration)
    first_token also  the decode engine's book starts following the request's output
                      (decode correction: its remaining work as the decision core is
                      told it produces, `DecodeBook.produced`)
    released          decode done or given up: TPOT at the decode batch it ran in, and
                      (for a complete output) its validated length, from the summary of
                      the attempt's output on the ticket; an unfinished prefill leaves
                      its lane

Sans-IO like the controller that calls it: what it reads of a request's output are
values (`OutputSummary`), never the tracker that counts it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Protocol

from narwhal.models.book import ModelBook
from narwhal.scheduler.placement import PlacementRequest
from narwhal.scheduler.predictive import decoding_on, prefill_part
from narwhal.scheduler.scheduler import Plan

if TYPE_CHECKING:
    from narwhal.scheduler.placement import OutputSummary


class PlacedTicket(Protocol):
    """What learning reads of a request admission placed (`narwhal.admission.queue`'s
    ticket; one object per request, the key of what is learned from it until released).
    The scheduler sits under admission and does not import it."""

    @property
    def request(self) -> PlacementRequest: ...

    projected_ttft: float | None  # the TTFT projected at the check (set None once met)
    projected_upper: float | None  # and the bound it was held to

    @property
    def checked_at(self) -> float: ...

    @property
    def output(self) -> OutputSummary | None:
        """What the attempt that just ended produced (read when it is released)."""
        ...


class PlacementLearning:
    def __init__(self, book: ModelBook) -> None:
        self.book = book
        self._answered: dict[PlacedTicket, float] = {}  # P/D: when the prefill engine answered
        # The decode batch, the engine's stretch and the time at the first token.
        self._decode_start: dict[PlacedTicket, tuple[float, float, float]] = {}

    def placed(self, ticket: PlacedTicket, plan: Plan, now: float) -> None:
        first = plan.first
        if first.model is not None:
            # The engine prefills what it does not find cached: that is its work, and
            # what its prefill time is learnt against.
            tokens = ticket.request.prompt_tokens - plan.cached_tokens
            # Its TTFT there as projected now: what the engine's calibration learns from.
            projected = prefill_part(first, first.model, tokens, now)
            first.model.prefill_placed(
                ticket,
                tokens,
                decoding_on(first),
                now,
                projected,
                output=ticket.request.predicted_output,
            )

    def prefill_answered(self, ticket: PlacedTicket, plan: Plan, now: float) -> None:
        first = plan.first
        if first.model is not None:
            first.model.prefill_finished(ticket, now, decoding_on(first))
        self._answered[ticket] = now

    def first_token(self, ticket: PlacedTicket, plan: Plan, now: float) -> None:
        decode = plan.decode
        model = decode.model
        if model is not None:
            if plan.prefill is None:
                # (admission counts it among those decoding there already)
                decoding = decoding_on(decode)
                model.prefill_finished(ticket, now, decoding, others=decoding - 1)
            else:
                answered = self._answered.pop(ticket, None)
                if answered is not None:
                    model.observe_first_step(ticket.request.prompt_tokens, now - answered)
        projected = ticket.projected_ttft
        if projected is not None:
            ticket.projected_ttft = None  # one measurement per request, retries included
            bound = ticket.projected_upper
            self.book.ttft_measured(
                projected, now - ticket.checked_at, math.inf if bound is None else bound
            )
        batch = decoding_on(decode)
        stretch = 1.0 if model is None else model.stretch(batch, now)
        self._decode_start[ticket] = (batch, stretch, now)
        if model is not None:
            request = ticket.request
            model.decoding.start(ticket, request.route, request.prompt_tokens, request.max_tokens)

    def released(self, ticket: PlacedTicket, plan: Plan, now: float, *, decoded: bool) -> None:
        self._answered.pop(ticket, None)
        start = self._decode_start.pop(ticket, None)
        if plan.decode.model is not None:
            plan.decode.model.decoding.stop(ticket)
        if not decoded:
            first = plan.first
            if first.model is not None:
                first.model.prefill_dropped(ticket, now, decoding_on(first))
            return
        output = ticket.output
        decode = plan.decode
        if output is None:
            return
        model = decode.model
        tpot = output.tpot
        if model is not None and tpot is not None and start is not None:
            # The batch it decoded in: the mean of the batch at its start and at its end.
            batch, stretch, since = start
            model.observe_tpot(
                tpot, (batch + decoding_on(decode)) / 2, now, stretch_before=stretch, since=since
            )
        if output.complete and output.exact:  # counted from IDs or the engine's usage
            request = ticket.request
            self.book.lengths.observe(request.route, request.prompt_tokens, output.tokens)
