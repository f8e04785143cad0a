"""The completion routes' front: body limit, parsing, validation and the admission counters.

Every request that reaches a completion route is offered exactly once and ends in exactly
one terminal outcome, counted in `finally`, whichever way the handler leaves; its duration
(arrival to the end of its response) is observed there too. With `serving.api_keys` the
key is checked first, before a byte of the body is read: a request without a valid one
is answered 401 `invalid_api_key` and counted as `invalid`.

Its access line (`access_log.py`) is written there too, and its span ended (`tracing.py`:
started at arrival, a child of the client's valid W3C traceparent, which goes on to the
engines; an invalid one goes nowhere).

Every error it answers, a status or a stream's last event, names engines, never their
addresses (`narwhal.api.redaction`); its log and access line keep them.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web

from narwhal.api.access_log import AccessEntry, AccessLog
from narwhal.api.auth import BearerTokens, require_api_key
from narwhal.api.body import BodyIncomplete, BodyLate, read_limited_body
from narwhal.api.redaction import EngineRedaction
from narwhal.api.relay import relay_stream
from narwhal.api.request_id import HEADER as REQUEST_ID_HEADER
from narwhal.api.request_id import current_request_id
from narwhal.api.responses import error_response, json_response
from narwhal.api.service import (
    Assembled,
    CompletionService,
    RequestContext,
    StreamLease,
    Tenancy,
)
from narwhal.config import Config
from narwhal.errors import (
    CapacityRejected,
    InvalidRequest,
    NarwhalError,
    Outcome,
    PromptExceedsTtftBudget,
    RouterUnavailable,
    TenantQuotaExceeded,
    TerminalExpiry,
    TtftBudgetExceeded,
)
from narwhal.observability.metrics import UNKNOWN, RouterMetrics
from narwhal.observability.tracing import PassthroughTracer, Span, Tracer
from narwhal.ops.state import RouterState
from narwhal.protocol.headers import (
    CONTENT_ENCODING,
    CONTENT_TYPE,
    PRIORITY,
    REQUEST_TIMEOUT,
    check_content_encoding,
    check_content_type,
    request_timeout,
)
from narwhal.protocol.requests import Route, check_one_prompt, parse_request
from narwhal.protocol.trace_context import TRACEPARENT, TRACESTATE, TraceContext, trace_context
from narwhal.sizing import WorkloadSizer

log = logging.getLogger(__name__)
SPAN_NAMES: dict[Route, str] = {
    "chat": "POST /v1/chat/completions",
    "completion": "POST /v1/completions",
}
# Outcomes that are the router's or its engines' fault: an error status on the span.
_FAULTS: frozenset[Outcome] = frozenset(
    {"expired", "unavailable", "upstream_error", "internal_error"}
)


class CompletionFront:
    def __init__(
        self,
        config: Config,
        metrics: RouterMetrics,
        service: CompletionService,
        sizer: WorkloadSizer,
        state: RouterState,
        api_keys: BearerTokens,
        tenants: Tenancy,
        tracer: Tracer | None = None,
    ) -> None:
        """`tenants`: whose each request is, its class, its quotas (`admission.tenants`)."""
        self._tenants = tenants
        self._tracer: Tracer = tracer or PassthroughTracer()
        self._access = AccessLog(config.logging.access_log)
        self._state = state
        self._api_keys = api_keys
        self._config = config
        self._metrics = metrics
        self._service = service
        self._sizer = sizer
        self._redaction = EngineRedaction().for_engines(config.engines)

    def reconfigure(self, config: Config) -> None:
        """Read limits (body size, request timeout) from `config` from now on (a reload),
        and redact its engines' addresses too."""
        self._config = config
        self._redaction = self._redaction.for_engines(config.engines)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "completion")

    async def _handle(self, http: web.Request, route: Route) -> web.StreamResponse:
        metrics = self._metrics
        redact = self._redaction.redact
        arrived = time.monotonic()
        request_id = current_request_id.get()
        metrics.offered.inc()
        metrics.offered_count += 1
        outcome: Outcome = "client_gone"
        sized = False
        relaying = False  # a stream response may have started
        streaming = False  # as the body asks; a body never parsed is answered with JSON
        written: float | None = None  # a stream's last write (the engine's end may follow)
        response: web.StreamResponse | None = None  # whose status the client got
        context: RequestContext | None = None
        tenants = self._tenants
        tenant: str | None = None
        rank: int | None = None
        refusal: str | None = None  # a 429's reason
        span = self._tracer.request(SPAN_NAMES[route], _client_trace(http))
        try:
            headers = http.headers
            tenant = tenants.resolve(require_api_key(self._api_keys, headers.get("Authorization")))
            rank = tenants.rank(tenant, headers.getall(PRIORITY, []))
            timeout = request_timeout(
                headers.getall(REQUEST_TIMEOUT, []), self._config.serving.request_timeout_s
            )
            deadline = arrived + timeout
            check_content_type(headers.getall(CONTENT_TYPE, []))
            check_content_encoding(headers.getall(CONTENT_ENCODING, []))
            raw = await read_limited_body(http, self._config.serving.max_request_bytes, deadline)
            parsed = parse_request(raw, route, model=self._config.model)
            check_one_prompt(parsed)
            streaming = parsed.stream
            # Cheap refusals first: a router that may not admit says so before sizing.
            reason = self._state.unavailable_reason()
            if reason is not None:
                raise RouterUnavailable(f"This router is not serving requests ({reason}).")
            tenants.offer(tenant, arrived)  # its request quota
            size = await self._sizer.size(parsed, len(raw))
            tenants.sized(tenant, size.tokens, time.monotonic())  # its token quota
            context = RequestContext(
                request_id=request_id,
                arrived=arrived,
                deadline=deadline,
                prompt_tokens=size.tokens,
                authorization=http.headers.get("Authorization"),
                prompt_size=size,
                span=span,
                tenant=tenant,
                priority=rank,
            )
            sized = True
            try:
                served = await self._service.serve(parsed, context)
            finally:
                # As admission acted on it: an estimate may have become the engine's count.
                self._sizer.count(context.prompt_size or size)
            if isinstance(served, Assembled):
                outcome = "completed"
                response = json_response(served.body, request_id=request_id)
                return response
            relaying = True
            try:
                response, outcome, written = await self._relay(http, served)
                if outcome == "completed":
                    # The client has the whole stream: its outcome is settled before this
                    # wait, which a client closing its connection now may cancel.
                    await served.drain()
            finally:
                served.finish(outcome)
            return response
        except NarwhalError as error:
            outcome = error.outcome
            if outcome == "invalid":
                metrics.invalid_requests.inc()
            refusal = _refusal_reason(error)
            if isinstance(error, TenantQuotaExceeded):
                metrics.rejected.labels(error.reason).inc()  # (the others count their own)
            response = error_response(error, request_id, redact)
            if outcome == "refused":
                metrics.refusal_latency.observe(time.monotonic() - arrived)
            return response
        except BodyLate:
            metrics.unsized_offered.inc()
            metrics.expired.labels("deadline_before_headers").inc()
            expiry = TerminalExpiry("The request deadline expired before the body arrived.")
            outcome = expiry.outcome
            response = error_response(expiry, request_id, redact)
            response.force_close()  # the rest of the body may still be on its way
            return response
        except BodyIncomplete:
            metrics.unsized_offered.inc()
            if http.transport is None or http.transport.is_closing():
                raise web.HTTPBadRequest() from None  # nobody to answer; outcome client_gone
            outcome = "invalid"
            metrics.invalid_requests.inc()
            ended_early = InvalidRequest("The request body ended early.")
            response = error_response(ended_early, request_id, redact)
            response.force_close()  # where the next request would begin is unknown
            return response
        except (ConnectionError, asyncio.CancelledError):
            if written is None:  # (after a whole relay, its outcome stands: see above)
                outcome = "client_gone"
            if not sized:
                metrics.unsized_offered.inc()
            raise
        except Exception:
            # A bug, not a client or engine condition: log it, answer 500, count it once.
            outcome = "internal_error"
            log.exception("request %s failed unexpectedly", request_id)
            internal = error_response(NarwhalError("Internal router error."), request_id, redact)
            if relaying and http.transport is not None:
                # Never a 500 over a stream response (prepared, its headers maybe still
                # held for the first bytes): the client would read it as part of the
                # stream. The connection ends here instead, so no client takes the stream
                # for a complete one, and aiohttp writes nothing more.
                http.transport.close()
            else:
                response = internal
            return internal
        finally:
            metrics.count_outcome(outcome)
            ended = time.monotonic() if written is None else written
            self._count_class(tenant, rank, outcome, refusal, context, ended)
            metrics.observe_duration(route, streaming, outcome, ended - arrived)
            status = None if response is None else response.status
            self._ended(
                request_id,
                route,
                streaming,
                status,
                outcome,
                context,
                span,
                ended - arrived,
                None if rank is None else (tenant, tenants.class_name(rank)),
            )

    def _count_class(
        self,
        tenant: str | None,
        rank: int | None,
        outcome: Outcome,
        refusal: str | None,
        context: RequestContext | None,
        now: float,
    ) -> None:
        """The request's end by its class and tenant, and its output on its token quota."""
        served = None if context is None else context.served
        within: bool | None = None
        if served is not None and tenant is not None:
            self._tenants.produced(tenant, served.completion_tokens, now)
            if outcome == "completed" and served.ttft_s is not None:
                within = served.ttft_s <= self._config.admission.ttft_target_s
        self._metrics.count_class(
            UNKNOWN if rank is None else self._tenants.class_name(rank),
            UNKNOWN if tenant is None or rank is None else tenant,
            outcome,
            refusal=refusal,
            within_budget=within,
        )

    def _ended(
        self,
        request_id: str,
        route: Route,
        stream: bool,
        status: int | None,
        outcome: Outcome,
        context: RequestContext | None,
        span: Span,
        duration: float,
        classed: tuple[str | None, str] | None,
    ) -> None:
        """The request's access line and the end of its span, with what is known of it
        (`classed`: its tenant and class, once both were known)."""
        if not span.recording and not self._access.enabled:
            span.end()
            return
        served = None if context is None else context.served
        engines = () if context is None else context.engines
        prompt: int | None = None
        if served is not None:
            prompt = served.prompt_tokens
        elif context is not None:
            prompt = context.prompt_tokens  # sized, never served
        entry = AccessEntry(
            request_id,
            route,
            stream,
            status,
            outcome,
            engines,
            prompt,
            None if served is None else served.completion_tokens,
            None if served is None else served.ttft_s,
            duration,
            None if context is None else context.upstream_timeout,
            None if classed is None else classed[0],
            None if classed is None else classed[1],
        )
        if span.recording:
            span.set(entry.span_attributes())
            if outcome in _FAULTS:
                span.fail(outcome)
        span.end()
        if self._access.enabled:
            self._access.write(entry)

    async def _relay(
        self, http: web.Request, lease: StreamLease
    ) -> tuple[web.StreamResponse, Outcome, float]:
        """Write the leased stream to the client (the caller finishes the lease whatever
        happens; cancelled here, the client went away). Also returns when the last byte
        was written (before the engine's end is drained)."""
        response, outcome = await relay_stream(
            http,
            lease.stream,
            lease.first,
            lease.context.request_id,
            lease.deadline,
            lease.shutdown,
            self._redaction.redact,
        )
        return response, outcome, time.monotonic()


def _refusal_reason(error: NarwhalError) -> str | None:
    """Why a 429 refused the request, as the class metrics label it; None for others."""
    if isinstance(error, CapacityRejected):
        return error.reason
    if isinstance(error, TtftBudgetExceeded):
        return "projected"
    if isinstance(error, PromptExceedsTtftBudget):
        return "prompt"
    return None


def _client_trace(http: web.Request) -> TraceContext | None:
    """The client's W3C trace context, if it sent a valid one."""
    headers = http.headers
    parent = headers.getall(TRACEPARENT, ())
    return trace_context(parent, headers.getall(TRACESTATE, ())) if parent else None


__all__ = ["REQUEST_ID_HEADER", "CompletionFront"]
