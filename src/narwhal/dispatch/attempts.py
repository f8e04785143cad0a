"""Taking a validated request to engines: the attempt runner.

    serve ─▶ offer to the decision core (router state, retention, the TTFT check) ─▶
             placed, or one wait in its queue (router and engine slots) ─▶ placement
                                                              │
          ┌──── placed again, never on an engine that failed ◀─ failure before headers
          ▼                                                   │
        [prefill engine: one token, kv_transfer_params] ─▶ decode attempt: open the stream,
                                                            read its first events
          ─▶ streaming: a `StreamLease` (the api relays it, then finishes it)
          ─▶ non-streaming: the whole stream assembled into one `Assembled` body (or,
             for what vLLM answers only unstreamed, its one answer relayed: unstreamed.py)

Every decision is the decision core's (`narwhal.decision`), asked through the gate in
values keyed by the request id: this module runs what it decides (the engines a
placement names, by name) and tells it what happened (prefill done, first token, an
attempt failed, the request finished, with what its output came to). No HTTP here
either: the api layer owns the client side (parsing, writing, the relay). At most
fleet.max_attempts attempts, then 502. Every attempt owns its upstream response and
closes it (success, error, timeout, disconnect, cancellation), so the engine sees a
disconnect at once and no slot, count or connection is left behind. The request deadline
covers everything: before headers a 504 `terminal_expiry`, after them an error event. So
does a shutdown's drain deadline (`narwhal.ops.drain`), with a 503 before headers. Within
it, each attempt's phases have their own limits (`narwhal.engines.timeouts`): an engine
that sends no first event in time is given up and the request placed again, one that
goes silent after it fails the attempt (or, after headers, ends the stream).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from narwhal.config import Config
from narwhal.decision.core import AsyncDecisionCore
from narwhal.decision.messages import Offer, OutputSummary, Placed
from narwhal.dispatch.context_check import EngineCount, check_context
from narwhal.dispatch.gate import AdmissionGate, NoPlacement
from narwhal.engines.client import EngineClient, EngineUnavailable
from narwhal.engines.prefill import run_prefill
from narwhal.engines.stream import EngineStream
from narwhal.engines.timeouts import (
    FirstEventLimit,
    FirstEventTimes,
    TimeoutPhase,
    UpstreamTimeout,
    first_event_timeout,
)
from narwhal.errors import (
    BackendUnavailable,
    RouterUnavailable,
    TerminalExpiry,
    TruncatedStream,
    UpstreamError,
)
from narwhal.lease import Assembled, AttemptTrace, RequestContext, Served, StreamLease
from narwhal.observability.metrics import RouterMetrics
from narwhal.observability.tracing import ADMISSION_WAIT, DECODE, PLACEMENT, PREFILL, Span
from narwhal.ops.drain import Drain
from narwhal.ops.state import RouterState
from narwhal.protocol.assembly import Assembler
from narwhal.protocol.echo import echo_text, echoes, engine_token_ids
from narwhal.protocol.events import EngineError, EngineOutputError
from narwhal.protocol.exposure import Exposure
from narwhal.protocol.forward import StreamCollector, StreamForwarder
from narwhal.protocol.requests import CompletionRequest, Route
from narwhal.protocol.tracker import OutputTracker
from narwhal.protocol.unstreamed import relay_answer, unstreamed_field
from narwhal.protocol.upstream import CHOICES, upstream_body
from narwhal.protocol.usage import usage_tokens
from narwhal.scheduler.prefix_cache import PrefixCache
from narwhal.sizing import PromptSize

log = logging.getLogger("narwhal.dispatch")  # the name operators' log filters know
# A non-streaming answer is whole at the engine's [DONE]. The end of the body follows at
# once (often in a packet of its own: without waiting for it a quarter of the connections
# to a vLLM-like engine were not reused); an engine that keeps its body open delays the
# client no longer than this, and its connection is closed.
_DONE_GRACE_S = 0.01
# Failures another placement may not repeat: engine down, engine error, bad output.
_RETRYABLE = (EngineUnavailable, EngineError, EngineOutputError, TruncatedStream)


@dataclass(frozen=True, slots=True)
class _Failed:
    """One attempt failed before headers on `engine`; another placement may serve it.

    Only what the retry, the log and the client's 502 need: never the exception. Its
    traceback holds the attempt's frames, and with them the engine stream, its decoder
    and its assembler; kept in `_attempts`, whose own frame the traceback holds too, the
    buffers of every failed attempt would form a cycle that lives until a full garbage
    collection (eight failures of large bodies once held 1.25 GB)."""

    engine: str
    message: str
    output: OutputSummary  # what it produced (learning hears it with the retry)


@dataclass(slots=True)
class _LastAttempt:
    """The output of a request's latest attempt, summed up when the request is released."""

    tracker: OutputTracker | None = None


class Dispatcher:
    def __init__(
        self,
        config: Config,
        metrics: RouterMetrics,
        core: AsyncDecisionCore,
        gate: AdmissionGate,
        clients: Mapping[str, EngineClient],
        state: RouterState,
        *,
        monitoring_degraded: Callable[[], bool] = lambda: False,
        prefix: PrefixCache | None = None,
        prompt_counted: Callable[[Route, PromptSize, int], None] | None = None,
        engine_count: EngineCount | None = None,
        drain: Drain | None = None,
    ) -> None:
        """`core`: every decision, through `gate`, its asyncio shell;
        `monitoring_degraded()`: whether the fleet monitor says no engine is placeable
        because of monitoring itself; `prefix`: the engines' prefix indexes (cache-aware
        placement: the prompt's blocks go with its offer); `prompt_counted`: told the
        engine's count of each sized prompt; `engine_count`: an engine's count of a
        prompt whose estimate could flip the check, within a bounded wait
        (`WorkloadSizer.engine_count`); `drain`: the shutdown's drain deadline, which
        ends attempts still running."""
        self.drain = drain or Drain()
        self._config = config
        self.metrics = metrics
        self.core = core
        self.gate = gate
        self._clients = clients
        self.state = state
        self._monitoring_degraded = monitoring_degraded
        self._prefix = prefix
        self._prompt_counted = prompt_counted
        self._engine_count = engine_count
        self._first_event_times = FirstEventTimes()
        self.reconfigure(config)
        state.subscribe(self._state_changed)

    def reconfigure(self, config: Config) -> None:
        """Serve by `config` from now on (a reload): limits, attempts, engine names. A
        request in flight keeps the engines it was placed on."""
        self._config = config
        metrics = self.metrics
        for engine in config.engines:  # every engine's series from the start: zeros, not gaps
            metrics.engine_series(engine.name)
            if engine.role == "prefill":
                metrics.prefill_series(engine.name)
        self._first_event_times.forget({e.name for e in config.engines})

    def capacity_changed(self) -> None:
        """Placement may have changed (health, drain, maintenance): the core recomputes
        eligibility, says whether the whole router is out (maintenance, monitoring), and
        lets waiting requests look again."""
        self.gate.reconsider(self._monitoring_degraded())

    def readiness(self) -> str | None:
        return self.core.readiness()

    def _state_changed(self, reason: str | None) -> None:
        """The router stopped admitting: the requests still queued get its 503 now rather
        than waiting for a placement they may no longer be sent to."""
        if reason is not None:
            self.gate.refuse_waiting(lambda: RouterUnavailable.not_admitting(reason))

    def _check_state(self) -> None:
        reason = self.state.unavailable_reason()
        if reason is not None:
            raise RouterUnavailable.not_admitting(reason)

    async def serve(
        self, request: CompletionRequest, context: RequestContext
    ) -> Assembled | StreamLease:
        """Admit, place and start one request. Before response headers every failure is
        raised as a NarwhalError; a `StreamLease` must be finished by the caller."""
        reason = self.core.readiness()
        if reason == "no_engines":
            raise BackendUnavailable("No placement-eligible engine serves this request.")
        if reason is not None:
            raise RouterUnavailable.not_admitting(reason)
        check_context(request, context, self.core.max_model_len())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (context.deadline - time.monotonic())
        last = _LastAttempt()
        leased = False
        try:
            result = await self._attempts(request, context, last, deadline)
            leased = isinstance(result, StreamLease)
            return result
        finally:
            if not leased:
                self.release(context.request_id, last.tracker)

    def release(self, request_id: str, output: OutputTracker | None) -> None:
        """The request is over: its slots, placement and retention go back; `output`:
        its last attempt's, for what the core learns."""
        self.gate.release(request_id, None if output is None else OutputSummary.of(output))

    def _offer(self, request: CompletionRequest, context: RequestContext) -> Offer:
        size = context.prompt_size
        tokens = context.prompt_tokens
        prefix = self._prefix
        return Offer(
            context.request_id,
            request.route,
            tokens,
            request.max_tokens,
            context.arrived,
            context.deadline,
            tokens if size is None else size.low,
            tokens if size is None else size.high,
            countable=self._engine_count is not None and size is not None,
            priority=context.priority,
            tenant=context.tenant,
            prefix=None if prefix is None else prefix.blocks_of(request),
        )

    async def _count(self, request: CompletionRequest, context: RequestContext) -> int:
        """An engine's count of the prompt, within `admission.sizing_wait_s` (the core
        asked: its estimate's bounds could flip the decision); the context-length 400
        again on it."""
        size = context.prompt_size
        assert size is not None and self._engine_count is not None
        counted = await self._engine_count(
            request.route, size, self._config.admission.sizing_wait_s
        )
        context.prompt_size = counted
        context.prompt_tokens = counted.tokens
        if counted.source == "engine":
            check_context(request, context, self.core.max_model_len())
        return counted.tokens

    async def _attempts(
        self,
        request: CompletionRequest,
        context: RequestContext,
        last_attempt: _LastAttempt,
        deadline: float,
    ) -> Assembled | StreamLease:
        def resized(tokens: int) -> None:
            context.prompt_tokens = tokens

        decided = await self.gate.decide(
            self._offer(request, context), lambda: self._count(request, context), resized
        )
        last: _Failed | None = None
        attempts = self._config.fleet.max_attempts
        for attempt in range(1, attempts + 1):
            try:
                with context.span.child(ADMISSION_WAIT, {"narwhal.attempt": attempt}):
                    if last is None:
                        placed = await self.gate.placement(decided, deadline)
                    else:
                        placed = await self.gate.retry(
                            context.request_id, last.engine, last.output, deadline
                        )
            except NoPlacement:
                break
            # Leadership (or maintenance) may have been lost while the request waited:
            # nothing goes to an engine unless this router may admit at this instant.
            self._check_state()
            context.engines = placed.engines
            result = await self._attempt(request, context, placed, last_attempt, deadline, attempt)
            if not isinstance(result, _Failed):
                return result
            last = result
            # The client hears only the last failure; the operator hears each one.
            log.warning(
                "request %s: attempt %d of %d on %s failed before the response started: %s",
                context.request_id,
                attempt,
                attempts,
                placed.describe(),
                result.message,
            )
        if last is not None:
            # (In the engine layer's words, addresses too: the front redacts what clients read.)
            raise UpstreamError(f"The engines failed this request: {last.message}")
        raise BackendUnavailable("No placement-eligible engine serves this request.")

    async def _attempt(
        self,
        request: CompletionRequest,
        context: RequestContext,
        placed: Placed,
        last_attempt: _LastAttempt,
        deadline: float,
        attempt: int,
    ) -> Assembled | StreamLease | _Failed:
        """One placement: the optional prefill half, then the decode stream's first events
        (streaming) or all of it (non-streaming); `_Failed` when another placement may
        serve the request. Whatever the end, the attempt's engine stream is closed and
        its buffers released before this returns (a lease keeps its stream open)."""
        request_id = context.request_id
        unknown = next((name for name in placed.engines if name not in self._clients), None)
        if unknown is not None:
            # A relay worker placed on an engine the decision process added a moment ago,
            # before this process read the file that names it: elsewhere, as a failure.
            message = f"engine {unknown} is not yet known to this relay worker"
            return _Failed(unknown, message, OutputSummary(0, True, False, None))
        client = self._clients[placed.decode]
        engine = self.core.capabilities(placed.decode)  # as the fleet monitor resolved them
        # (An echo of token IDs is sent without asking for IDs: echo.py.)
        ids = request.route in engine.token_ids_on and engine_token_ids(request)
        exposure = Exposure(
            token_ids=request.return_token_ids,
            usage=request.include_usage,
            continuous_usage=request.continuous_usage,
            null_usage=engine.null_usage,
            null_ids=engine.null_ids,
            echo=echoes(request),
            echo_text=echo_text(request) if ids else None,
        )
        tracker = OutputTracker(
            request.route,
            token_ids=ids,
            prompt_ids=request.return_token_ids or echoes(request),
            choices=CHOICES,
            echo=request.route == "chat" and request.echo,
        )
        last_attempt.tracker = tracker
        # Answered only unstreamed by this engine (unstreamed.py): one request, one answer.
        whole = (
            not request.stream
            and engine.answers_unstreamed
            and unstreamed_field(request) is not None
        )
        stream: EngineStream | None = None
        working = placed.first  # the engine a failure now would be on
        leased = False
        placement = context.span.child(
            PLACEMENT, {"narwhal.attempt": attempt, "narwhal.engines": placed.engines}
        )
        trace = AttemptTrace(placement)
        started = time.monotonic()
        first_event = self._first_event_limit(request_id, placed, attempt, deadline)
        try:
            try:
                async with self.drain.timeout_at(deadline):
                    body = upstream_body(
                        request, engine, streamed=not whole, priority=context.priority
                    )
                    if placed.prefill is not None:
                        sent = time.monotonic()
                        with placement.child(PREFILL, {"narwhal.engine": placed.prefill}) as half:
                            prefill = run_prefill(
                                self._clients[placed.prefill],
                                request,
                                request_id=context.request_id,
                                client_authorization=context.authorization,
                                trace=half.propagated(),
                            )
                            body["kv_transfer_params"] = await first_event.wait(
                                prefill, placed.prefill
                            )
                        # The decode engine's TTFT holds this wait too; only this series
                        # says which prefill engine it was spent on.
                        self.metrics.prefill_series(placed.prefill).observe(time.monotonic() - sent)
                        self.gate.prefill_done(request_id)
                        working = placed.decode
                    trace.decode = placement.child(DECODE, {"narwhal.engine": client.name})
                    if whole:
                        # One answer at the end: the first event is the whole answer.
                        return await first_event.wait(
                            self._answer_whole(
                                client, request, context, body, tracker, exposure, trace.decode
                            ),
                            client.name,
                        )
                    opened = client.open_stream(
                        request.route,
                        body,
                        request_id=context.request_id,
                        client_authorization=context.authorization,
                        trace=trace.decode.propagated(),
                    )
                    response = await first_event.wait(opened, client.name)
                    limit = self._config.max_event_bytes
                    if request.stream:
                        sink: StreamForwarder | StreamCollector = StreamForwarder(
                            tracker, exposure, max_event_bytes=limit
                        )
                    else:
                        assembler = Assembler(request.route, exposure, choices=CHOICES)
                        sink = StreamCollector(
                            tracker,
                            assembler,
                            max_event_bytes=limit,
                            max_response_bytes=self._config.max_response_bytes,
                        )
                    stream = EngineStream(
                        client.name,
                        response,
                        sink,
                        idle_timeout_s=self._config.fleet.idle_timeout_s,
                    )
                    first = await first_event.wait(_first_events(stream, tracker), client.name)
                    first_event.end()
                    self._first_event_times.observe(client.name, time.monotonic() - started)
                    self.gate.first_token(request_id, tracker)
                    if not request.stream:
                        # Up to the engine's [DONE]: what follows is not the answer, and an
                        # engine that keeps its body open must not hold the client.
                        async with stream.idle_gap():
                            while not stream.done and await stream.read() is not None:
                                pass
                        await stream.settle(_DONE_GRACE_S)
                        # An answer that ended unfinished or without a choice fails here,
                        # like any engine output error before headers.
                        completion_tokens, _ = tracker.output_tokens()
                        assembled = assembler.result(
                            prompt_tokens=context.prompt_tokens,
                            completion_tokens=completion_tokens,
                        )
            except TimeoutError:
                trace.fail("the request deadline expired")
                raise self._timed_out_before_headers(deadline) from None
            except _RETRYABLE as error:
                trace.fail(error.message)
                self.metrics.engine_series(working).failures["before_headers"].inc()
                if isinstance(error, UpstreamTimeout):
                    self.timed_out(working, error.phase, context)
                return _Failed(working, error.message, OutputSummary.of(tracker))
            if request.stream:
                leased = True
                return StreamLease(self, context, stream, first, deadline, trace)
            self.count_served(stream, context, streamed=False)
            return Assembled(assembled)
        finally:
            if not leased:
                if stream is not None:
                    self.end_attempt(stream, context)
                trace.end(stream)

    def _first_event_limit(
        self, request_id: str, placed: Placed, attempt: int, deadline: float
    ) -> FirstEventLimit:
        """The attempt's first-event limit: configured, else derived from the projection
        (the first attempt goes where admission projected it, when a retry could go
        elsewhere), else from what the engine has been seen to take (`engines/timeouts.py`).
        Without another placement to retry on, giving up early would only turn a late
        answer into an error (a loaded host stalls an engine for a second or two): the
        attempt then gets the generous limit."""
        times = self._first_event_times
        projected = placed.projected_upper if attempt == 1 else None
        if projected is not None:
            core = self.core
            elsewhere = (
                attempt < self._config.fleet.max_attempts
                and core.could_retry(request_id, placed.first)
                and core.could_retry(request_id, placed.decode)
            )
            projected = projected if elsewhere else None
        seconds = first_event_timeout(
            self._config.fleet.first_event_timeout_s,
            projected_s=projected,
            observed_s=times.bound(placed.decode),
            budget_s=self._config.admission.ttft_target_s,
            backoff=max(times.backoff(placed.first), times.backoff(placed.decode)),
            remaining_s=deadline - asyncio.get_running_loop().time(),
        )
        return FirstEventLimit(seconds)

    def timed_out(self, engine: str, phase: TimeoutPhase, context: RequestContext) -> None:
        """A phase timeout ended an attempt on `engine`: counted, and on the access line."""
        self.metrics.engine_series(engine).timeouts[phase].inc()
        context.upstream_timeout = phase
        if phase == "first_event":
            self._first_event_times.timed_out(engine)

    async def _answer_whole(
        self,
        client: EngineClient,
        request: CompletionRequest,
        context: RequestContext,
        body: dict[str, Any],
        tracker: OutputTracker,
        exposure: Exposure,
        span: Span,
    ) -> Assembled:
        """Ask the engine without streaming and relay its answer (`unstreamed.py`), with
        the accounting of a streamed answer less its timing: output tokens, the engine's
        prompt count (the output length is learnt by the core, from the summary its
        release sends). No first token is marked: one answer at the end says nothing of
        the prefill, so its slot stays a prefill slot."""
        answer = await client.post_json(
            request.route,
            body,
            request_id=context.request_id,
            client_authorization=context.authorization,
            trace=span.propagated(),
            max_bytes=self._config.max_response_bytes,
        )
        relayed = relay_answer(answer, tracker, exposure, time.monotonic())
        tokens, source = tracker.output_tokens()
        series = self.metrics.engine_series(client.name)
        if tokens:
            series.output_tokens[source].inc(tokens)
        usage = None if tracker.usage is None else usage_tokens(tracker.usage)[0]
        size = context.prompt_size
        if self._prompt_counted is not None and size is not None and usage:
            self._prompt_counted(request.route, size, usage)
        prompt = context.prompt_tokens if usage is None else usage
        served = self.metrics.request_series(request.route, False)
        served.prompt_tokens.inc(prompt)
        served.completion_tokens.inc(tokens)
        context.served = Served(prompt, tokens, None)
        return Assembled(relayed)

    def end_attempt(self, stream: EngineStream, context: RequestContext) -> None:
        """Close the engine stream and account what it produced."""
        stream.close()
        tracker = stream.tracker
        series = self.metrics.engine_series(stream.engine_name)
        if tracker.first_output_at is not None:
            series.ttft.observe(tracker.first_output_at - context.arrived)
        tpot = tracker.time_per_output_token()
        if tpot is not None:
            series.tpot.observe(tpot)
        tokens, source = tracker.output_tokens()
        if tokens:
            series.output_tokens[source].inc(tokens)
        size = context.prompt_size
        if self._prompt_counted is not None and size is not None and tracker.usage:
            counted = tracker.usage.get("prompt_tokens")
            if type(counted) is int and counted > 0:
                self._prompt_counted(tracker.route, size, counted)

    def count_served(
        self, stream: EngineStream, context: RequestContext, *, streamed: bool
    ) -> None:
        """Count the tokens of the attempt whose answer goes to the client (only that one:
        an attempt that failed before headers was retried or became the client's error)."""
        tracker = stream.tracker
        usage = None if tracker.usage is None else usage_tokens(tracker.usage)[0]
        prompt = context.prompt_tokens if usage is None else usage
        completion, _ = tracker.output_tokens()
        series = self.metrics.request_series(tracker.route, streamed)
        series.prompt_tokens.inc(prompt)
        series.completion_tokens.inc(completion)
        first = tracker.first_output_at
        ttft = None if first is None else first - context.arrived
        context.served = Served(prompt, completion, ttft)

    def _timed_out_before_headers(self, deadline: float) -> RouterUnavailable | TerminalExpiry:
        if self.drain.cut_short(deadline):
            # The shutdown's drain deadline, not the request's: no response has started,
            # so the client gets a 503 it may retry on another router.
            return RouterUnavailable(
                "This router is shutting down: its drain deadline ended the request before "
                "the response started."
            )
        return self._expired_before_headers()

    def _expired_before_headers(self) -> TerminalExpiry:
        self.metrics.expired.labels("deadline_before_headers").inc()
        return TerminalExpiry("The request deadline expired before the response started.")


async def _first_events(stream: EngineStream, tracker: OutputTracker) -> bytes:
    """Read until the first output is in hand, or the stream says there will be none (a
    finish, its end); the client's bytes for what was read. Not merely the first event:
    an engine may send its role chunk as it accepts a request and its first token only
    when the requests queued ahead of it are done (`transformers serve` does), and the
    first token is what admission learns from, the response status depends on, and a
    stalled engine is given up by."""
    payload = b""
    while not stream.events or not (
        tracker.first_output_at is not None or tracker.finish_seen or stream.done
    ):
        read = await stream.read()
        if read is None:
            if not stream.events:
                raise TruncatedStream(f"engine {stream.engine_name} sent no events")
            break  # the end: what was read is the answer (its checks come after)
        payload += read
    return payload
