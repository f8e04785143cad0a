"""Taking a validated request to engines and back: admission, placement, attempts, relay.

    serve ─▶ retention ─▶ admission queue / prefill slot ─▶ plan (engine or P/D pair)
                                                              │
          ┌────────────── another placement ◀─ failure before headers (retryable)
          ▼                                                   │
        [prefill engine: one token, kv_transfer_params] ─▶ decode attempt: open the stream,
                                                            read its first events
          ─▶ streaming: relay (headers go out with the first events in hand)
          ─▶ non-streaming: assemble the whole stream (all of it is before headers)

At most fleet.max_attempts decode attempts, then 502. Every attempt owns its upstream
response and closes it in `finally` (success, error, timeout, disconnect, cancellation),
so the engine sees a disconnect at once and no slot, count or connection is left behind.
The request deadline covers everything: before headers a 504 `terminal_expiry`, after them
an error event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
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
from narwhal.engines.prefill import run_prefill
from narwhal.engines.relay import collect, relay_stream
from narwhal.engines.stream import EngineStream, TruncatedStream
from narwhal.engines.upstream import UpstreamPool
from narwhal.errors import (
    BackendUnavailable,
    Outcome,
    RouterUnavailable,
    TerminalExpiry,
    UpstreamError,
)
from narwhal.fleet.monitor import FleetMonitor
from narwhal.metrics import RouterMetrics
from narwhal.protocol.assembly import Assembler
from narwhal.protocol.dialects import token_accounting
from narwhal.protocol.events import EngineError, EngineOutputError
from narwhal.protocol.exposure import Exposure
from narwhal.protocol.forward import StreamCollector, StreamForwarder
from narwhal.protocol.requests import CompletionRequest
from narwhal.protocol.tracker import OutputTracker
from narwhal.protocol.upstream import upstream_body
from narwhal.scheduler.registry import EngineEntry, EngineRegistry
from narwhal.scheduler.scheduler import NoCapacity, Plan, Scheduler

log = logging.getLogger(__name__)
_DRAIN_TIMEOUT_S = 1.0
# Failures another placement may not repeat: engine down, engine error, bad output.
_RETRYABLE = (EngineUnavailable, EngineError, EngineOutputError, TruncatedStream)


class Dispatcher:
    def __init__(self, config: Config, metrics: RouterMetrics) -> None:
        self._config = config
        self._metrics = metrics
        self.registry = EngineRegistry(config.engines)
        self.scheduler = Scheduler(self.registry, round_robin=config.fleet.policy == "round_robin")
        self._gate = AdmissionGate(config, metrics)
        self._session: aiohttp.ClientSession | None = None  # the fleet monitor's
        self._pool: UpstreamPool | None = None  # requests to engines
        self._clients: dict[str, EngineClient] = {}
        self.monitor: FleetMonitor | None = None
        # Set whenever capacity may have appeared (a request ended, an engine came back).
        self._capacity = asyncio.Event()
        for engine in config.engines:  # every engine's series from the start: zeros, not gaps
            metrics.engine_series(engine.name)

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
            auto_decompress=False,
        )
        self._pool = UpstreamPool(connect_timeout=5.0, idle_timeout=30.0)
        for engine in self._config.engines:
            self._clients[engine.name] = EngineClient(engine, self._pool)
        monitor = FleetMonitor(
            self._config.engines,
            self._config.fleet,
            self._session,
            self._metrics.registry,
            model=self._config.model,
        )
        self.registry.set_health_predicate(monitor.is_placeable)
        monitor.subscribe(self.capacity_changed)
        await monitor.start()
        self.monitor = monitor

    async def close(self) -> None:
        if self.monitor is not None:
            await self.monitor.close()
        if self._session is not None:
            await self._session.close()
        if self._pool is not None:
            await self._pool.close()

    def capacity_changed(self) -> None:
        """Placement may have changed (health, drain, maintenance): recompute eligibility and
        let waiting requests look again."""
        self.registry.invalidate()
        self._capacity.set()

    def router_unavailable_reason(self) -> str | None:
        """Whole-wave maintenance or monitoring-degraded: the router refuses everything."""
        if self.registry.whole_fleet_in_maintenance():
            return "maintenance"
        if self.monitor is not None and self.monitor.monitoring_degraded():
            return "monitoring_degraded"
        return None

    def readiness(self) -> str | None:
        reason = self.router_unavailable_reason()
        if reason is not None:
            return reason
        return None if self.scheduler.has_path() else "no_engines"

    def engine_report(self) -> list[dict[str, Any]]:
        # The loads take the engines' scrapes only when a request is placed: without this
        # the report would show the load of the last placement after traffic stops.
        self._refresh_engine_loads()
        now = time.monotonic()
        report = []
        for entry in self.registry.entries.values():
            engine = entry.config
            load = entry.load
            report.append(
                {
                    "name": engine.name,
                    "url": engine.url,
                    "dialect": engine.dialect,
                    "role": engine.role,
                    "wave": engine.wave,
                    "state": self.registry.state(entry),
                    "eligible": self.registry.eligible(entry),
                    "token_accounting": token_accounting(engine.dialect),
                    "profile": None,
                    "scores": {
                        "cost": self.scheduler.scorer.cost(load, 0),
                        "prefilling": load.prefilling,
                        "decoding": load.decoding,
                        "prefill_tokens": load.prefill_tokens,
                    },
                    "monitoring": self.monitor.report(engine.name, now) if self.monitor else None,
                }
            )
        return report

    async def serve(
        self, request: CompletionRequest, context: RequestContext, http: web.Request
    ) -> tuple[web.StreamResponse, Outcome]:
        reason = self.router_unavailable_reason()
        if reason is not None:
            raise RouterUnavailable(f"This router is not serving requests ({reason}).")
        if not self.scheduler.has_path():
            raise BackendUnavailable("No placement-eligible engine serves this request.")
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
            self._capacity.set()

    async def _attempts(
        self,
        request: CompletionRequest,
        context: RequestContext,
        http: web.Request,
        ticket: Ticket,
        deadline: float,
    ) -> tuple[web.StreamResponse, Outcome]:
        tried: set[str] = set()
        last_error: UpstreamError | None = None
        attempts = self._config.fleet.max_attempts
        for attempt in range(1, attempts + 1):
            plan = await self._plan(context.prompt_tokens, tried, deadline)
            if plan is None:
                break
            tried.add(plan.decode.config.name)
            try:
                return await self._attempt(request, context, http, ticket, deadline, plan)
            except _RETRYABLE as error:
                last_error = error
                # The client hears only the last failure; the operator hears each one.
                log.warning(
                    "request %s: attempt %d of %d on %s failed before the response started: %s",
                    context.request_id,
                    attempt,
                    attempts,
                    _placement(plan),
                    error.message,
                )
        if last_error is not None:
            raise UpstreamError(f"The engines failed this request: {last_error.message}")
        raise BackendUnavailable("No placement-eligible engine serves this request.")

    async def _plan(self, prompt_tokens: int, tried: set[str], deadline: float) -> Plan | None:
        """A placement; waits while every eligible engine is at its own phase limit."""
        while True:
            self._refresh_engine_loads()
            try:
                return self.scheduler.plan(prompt_tokens, tried)
            except NoCapacity:
                self._capacity.clear()
                try:
                    async with asyncio.timeout_at(deadline):
                        await self._capacity.wait()
                except TimeoutError:
                    raise self._expired_before_headers() from None

    def _refresh_engine_loads(self) -> None:
        """Correct Narwhal's own counts with each engine's last good metrics scrape."""
        if self.monitor is None:
            return
        for name, entry in self.registry.entries.items():
            scrape = self.monitor.health(name).last_scrape
            if scrape is not None:
                entry.load.engine_running = scrape.running or 0.0
                entry.load.engine_waiting = scrape.waiting or 0.0

    async def _attempt(
        self,
        request: CompletionRequest,
        context: RequestContext,
        http: web.Request,
        ticket: Ticket,
        deadline: float,
        plan: Plan,
    ) -> tuple[web.StreamResponse, Outcome]:
        """One placement: the optional prefill half, then the decode stream."""
        decode_entry = plan.decode
        client = self._clients[decode_entry.config.name]
        exposure = Exposure(
            token_ids=request.return_token_ids,
            usage=request.include_usage,
            continuous_usage=request.continuous_usage,
            null_usage=client.capabilities.null_usage,
            null_ids=client.capabilities.null_ids,
        )
        tracker = OutputTracker(
            request.route,
            token_ids=request.route in client.capabilities.token_ids_on,
            prompt_ids=request.return_token_ids,
        )
        authorization = http.headers.get("Authorization")
        phase = _PhaseLoad(plan.prefill or decode_entry, context.prompt_tokens)
        stream: EngineStream | None = None
        working = plan.prefill or decode_entry  # the engine a failure now would be on
        try:
            try:
                async with asyncio.timeout_at(deadline):
                    body = upstream_body(request, client.dialect)
                    if plan.prefill is not None:
                        prefill_client = self._clients[plan.prefill.config.name]
                        body["kv_transfer_params"] = await run_prefill(
                            prefill_client,
                            request,
                            request_id=context.request_id,
                            authorization=authorization,
                        )
                        working = decode_entry
                        phase.end_prefill()
                        self._gate.first_token(ticket)
                        phase.start_decode(decode_entry)
                    response = await client.open_stream(
                        request.route,
                        body,
                        request_id=context.request_id,
                        authorization=authorization,
                    )
                    if request.stream:
                        sink: StreamForwarder | StreamCollector = StreamForwarder(tracker, exposure)
                    else:
                        assembler = Assembler(request.route, exposure)
                        sink = StreamCollector(tracker, assembler)
                    stream = EngineStream(client.name, response, sink)
                    first = await _first_events(stream)
                    if plan.prefill is None:
                        phase.end_prefill()
                        self._gate.first_token(ticket)
                        phase.start_decode(decode_entry)
                    if not request.stream:
                        await collect(stream)
            except TimeoutError:
                raise self._expired_before_headers() from None
            except _RETRYABLE:
                self._metrics.engine_series(working.config.name).failures["before_headers"].inc()
                raise
            if request.stream:
                result = await relay_stream(http, stream, first, context.request_id, deadline)
                if result[1] == "expired":
                    self._metrics.expired.labels("deadline_streaming").inc()
                elif result[1] == "upstream_error":
                    self._metrics.engine_series(client.name).failures["after_headers"].inc()
                elif stream.done and not stream.at_eof():
                    # The client has everything; the end of the engine's body (usually in
                    # hand already) lets its connection go back to the pool.
                    with contextlib.suppress(OSError, TimeoutError):
                        async with asyncio.timeout(_DRAIN_TIMEOUT_S):
                            await stream.drain()
                return result
            completion_tokens, _ = tracker.output_tokens()
            assembled = assembler.result(
                prompt_tokens=context.prompt_tokens, completion_tokens=completion_tokens
            )
            return json_response(assembled, request_id=context.request_id), "completed"
        finally:
            phase.release()
            if stream is not None:
                stream.close()
                self._account(client.name, context, tracker)

    def _expired_before_headers(self) -> TerminalExpiry:
        self._metrics.expired.labels("deadline_before_headers").inc()
        return TerminalExpiry("The request deadline expired before the response started.")

    def _account(self, engine: str, context: RequestContext, tracker: OutputTracker) -> None:
        series = self._metrics.engine_series(engine)
        if tracker.first_output_at is not None:
            series.ttft.observe(tracker.first_output_at - context.arrived)
        tpot = tracker.time_per_output_token()
        if tpot is not None:
            series.tpot.observe(tpot)
        tokens, source = tracker.output_tokens()
        if tokens:
            series.output_tokens[source].inc(tokens)


def _placement(plan: Plan) -> str:
    """The engines of a plan, for the log: "engine d0", or "prefill p0, decode d0"."""
    if plan.prefill is None:
        return f"engine {plan.decode.config.name}"
    return f"prefill {plan.prefill.config.name}, decode {plan.decode.config.name}"


class _PhaseLoad:
    """What one attempt has placed on which engine, undone exactly once in `release`."""

    __slots__ = ("_decode", "_prefill", "_tokens")

    def __init__(self, prefill: EngineEntry, prompt_tokens: int) -> None:
        self._tokens = prompt_tokens
        self._prefill: EngineEntry | None = prefill
        self._decode: EngineEntry | None = None
        prefill.load.prefilling += 1
        prefill.load.prefill_tokens += prompt_tokens

    def end_prefill(self) -> None:
        if self._prefill is not None:
            self._prefill.load.prefilling -= 1
            self._prefill.load.prefill_tokens -= self._tokens
            self._prefill = None

    def start_decode(self, entry: EngineEntry) -> None:
        self._decode = entry
        entry.load.decoding += 1

    def release(self) -> None:
        self.end_prefill()
        if self._decode is not None:
            self._decode.load.decoding -= 1
            self._decode = None


async def _first_events(stream: EngineStream) -> bytes:
    """Read until at least one event is in hand (the response status depends on it);
    the client's bytes for what was read."""
    payload = b""
    while not stream.events:
        read = await stream.read()
        if read is None:
            raise TruncatedStream(f"engine {stream.engine_name} sent no events")
        payload += read
    return payload
