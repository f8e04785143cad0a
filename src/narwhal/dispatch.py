"""Taking a validated request to an engine and back: placement, attempts, relay, accounting.

    serve ─▶ choose an engine ─▶ attempt: open the stream, read its first events
                 ▲                  │ failure before headers (retryable)
                 └──── next engine ◀┘ at most fleet.max_attempts in all, then 502
             ─▶ streaming: relay (headers go out with the first events in hand)
             ─▶ non-streaming: assemble the whole stream (all of it is "before headers")

Every attempt owns its upstream response and closes it in `finally`: on success, error,
timeout, client disconnect and cancellation alike, so the engine sees a disconnect at once
and no connection or count is left behind. The request deadline covers everything; before
headers it is a 504 `terminal_expiry`, after them an error event.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import aiohttp
from aiohttp import web

from narwhal.admission.gate import AdmissionGate
from narwhal.admission.queue import Ticket
from narwhal.api.responses import json_response
from narwhal.api.service import RequestContext
from narwhal.config import Config
from narwhal.engines.client import EngineClient, EngineUnavailable
from narwhal.engines.relay import collect, relay_stream
from narwhal.engines.stream import EngineStream, StreamItem, TruncatedStream
from narwhal.errors import BackendUnavailable, TerminalExpiry, UpstreamError
from narwhal.metrics import RouterMetrics
from narwhal.protocol.assembly import Assembler
from narwhal.protocol.events import EngineError, EngineOutputError
from narwhal.protocol.exposure import Exposure
from narwhal.protocol.requests import CompletionRequest
from narwhal.protocol.tracker import OutputTracker
from narwhal.protocol.upstream import supplies_token_ids, upstream_body
from narwhal.scheduler.placement import EngineLoad, InFlightScorer, choose

# Failures that another placement may not repeat: engine down, engine error, bad output.
_RETRYABLE = (EngineUnavailable, EngineError, EngineOutputError, TruncatedStream)


class Dispatcher:
    def __init__(self, config: Config, metrics: RouterMetrics) -> None:
        self._config = config
        self._metrics = metrics
        self._rng = random.Random()
        self._scorer = InFlightScorer()
        self._session: aiohttp.ClientSession | None = None
        self._clients: dict[str, EngineClient] = {}
        self._loads: dict[str, EngineLoad] = {}
        self._gate = AdmissionGate(config, metrics)

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30, enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
            auto_decompress=False,
        )
        for engine in self._config.engines:
            if engine.role == "both":
                self._clients[engine.name] = EngineClient(engine, self._session)
                self._loads[engine.name] = EngineLoad(engine.name)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def readiness(self) -> str | None:
        return None if self._clients else "no_engines"

    def engine_report(self) -> list[dict[str, Any]]:
        return [
            {
                "name": engine.name,
                "url": engine.url,
                "dialect": engine.dialect,
                "role": engine.role,
                "wave": engine.wave,
                "state": "up",
                "eligible": engine.name in self._clients,
                "token_accounting": (
                    "token_ids"
                    if supplies_token_ids(engine.dialect, "completion")
                    else "unavailable"
                ),
                "profile": None,
                "scores": {"in_flight": self._loads[engine.name].in_flight}
                if engine.name in self._loads
                else {},
            }
            for engine in self._config.engines
        ]

    async def serve(
        self, request: CompletionRequest, context: RequestContext, http: web.Request
    ) -> tuple[web.StreamResponse, str]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (context.deadline - time.monotonic())
        gate = self._gate
        gate.hold()
        ticket = Ticket(context.prompt_tokens)
        try:
            await gate.admit(ticket, deadline)
            return await self._attempts(request, context, http, ticket, deadline)
        finally:
            gate.release(ticket)
            gate.unhold()

    async def _attempts(
        self,
        request: CompletionRequest,
        context: RequestContext,
        http: web.Request,
        ticket: Ticket,
        deadline: float,
    ) -> tuple[web.StreamResponse, str]:
        exposure = Exposure(
            token_ids=request.return_token_ids,
            usage=request.include_usage,
            continuous_usage=request.continuous_usage,
        )
        authorization = http.headers.get("Authorization")
        tried: set[str] = set()
        last_error: UpstreamError | None = None
        for _ in range(self._config.fleet.max_attempts):
            load = self._place(context, tried)
            if load is None:
                break
            tried.add(load.name)
            client = self._clients[load.name]
            tracker = OutputTracker(
                request.route, token_ids=supplies_token_ids(client.dialect, request.route)
            )
            load.in_flight += 1
            load.prefill_tokens += context.prompt_tokens
            prefill_pending = True
            stream: EngineStream | None = None
            try:
                try:
                    async with asyncio.timeout_at(deadline):
                        response = await client.open_stream(
                            request.route,
                            upstream_body(request, client.dialect),
                            request_id=context.request_id,
                            authorization=authorization,
                        )
                        stream = EngineStream(client.name, response, tracker)
                        first = await _first_events(stream)
                        load.prefill_tokens -= context.prompt_tokens
                        prefill_pending = False
                        self._gate.first_token(ticket)
                        if not request.stream:
                            assembler = Assembler(request.route, exposure)
                            await collect(stream, first, assembler)
                except TimeoutError:
                    self._metrics.expired.labels("deadline_before_headers").inc()
                    raise TerminalExpiry(
                        "The request deadline expired before the response started."
                    ) from None
                except _RETRYABLE as error:
                    last_error = error
                    continue
                if request.stream:
                    result = await relay_stream(
                        http, stream, first, exposure, context.request_id, deadline
                    )
                    if result[1] == "expired":
                        self._metrics.expired.labels("deadline_streaming").inc()
                    return result
                completion_tokens, _ = tracker.output_tokens()
                body = assembler.result(
                    prompt_tokens=context.prompt_tokens, completion_tokens=completion_tokens
                )
                return json_response(body, request_id=context.request_id), "completed"
            finally:
                if stream is not None:
                    stream.close()
                    self._account(client.name, context, tracker)
                load.in_flight -= 1
                if prefill_pending:
                    load.prefill_tokens -= context.prompt_tokens
        if last_error is not None:
            raise UpstreamError(f"All attempts failed; last: {last_error.message}")
        raise BackendUnavailable("No placement-eligible engine serves this request.")

    def _place(self, context: RequestContext, tried: set[str]) -> EngineLoad | None:
        candidates = [load for name, load in self._loads.items() if name not in tried]
        return choose(candidates, self._scorer, context.prompt_tokens, self._rng)

    def _account(self, engine: str, context: RequestContext, tracker: OutputTracker) -> None:
        metrics = self._metrics
        if tracker.first_output_at is not None:
            metrics.ttft.labels(engine).observe(tracker.first_output_at - context.arrived)
        tpot = tracker.time_per_output_token()
        if tpot is not None:
            metrics.tpot.labels(engine).observe(tpot)
        tokens, source = tracker.output_tokens()
        if tokens:
            metrics.output_tokens.labels(engine, source).inc(tokens)


async def _first_events(stream: EngineStream) -> list[StreamItem]:
    """Read until at least one event is in hand: the response status depends on it."""
    collected: list[StreamItem] = []
    while not collected:
        items = await stream.read_batch()
        if items is None:
            raise TruncatedStream(f"engine {stream.engine_name} sent no events")
        collected = items
    return collected
