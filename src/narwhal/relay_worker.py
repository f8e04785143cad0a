"""The composition root of a relay worker (`serving.workers` above 1, Step 16).

A relay worker does a router's per-byte work and decides nothing: the HTTP front, body
parsing, sizing (its tokenizer; the engines' `/tokenize` where the count matters), the
engine connections, the relay, exposure, assembly and the access log. Every decision is
the decision process's, asked through a `RemoteCore` once per request; the gate, the
attempt runner and the front are the same classes a single router runs, over that core.
`/ready`, `/metrics` and `/admin/*` are the whole router's and are passed on to the
decision process (`DecisionProxy`); `/health` is this process's own.

Its own router state carries only its shutdown: whether the router admits is the
decision process's (the view's readiness), and when that says it stopped (fenced,
standby, shutting down) the requests this worker has queued get its 503, as a single
router's do.

A reload (SIGHUP, which the supervisor passes to every process, or the decision process's
fleet naming an engine this worker does not know, after `POST /admin/reload`) re-reads
the file here too: limits, budgets and tokens take their new values, and an engine added
or replaced gets its connection before the decision process, which profiles it first,
places on it. An engine removed keeps its connection for the requests still on it.

Not shared across workers yet: tenants' request and token quotas are counted per worker,
so each worker allows a tenant its whole quota.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

from aiohttp import web

from narwhal.admission.classes import PriorityClasses
from narwhal.admission.tenants import Tenants
from narwhal.api.app import build_app
from narwhal.api.auth import BearerTokens
from narwhal.api.completions import CompletionFront
from narwhal.api.decision_proxy import DecisionProxy
from narwhal.api.ops import OpsRoutes
from narwhal.config import Config, ConfigError, EngineConfig, resolve_secrets
from narwhal.dispatch import Dispatcher
from narwhal.dispatch.gate import AdmissionGate
from narwhal.engines.client import EngineClient
from narwhal.engines.session import SharedSession
from narwhal.engines.upstream import UpstreamPool
from narwhal.errors import RouterUnavailable
from narwhal.observability.loop_monitor import LoopMonitor
from narwhal.observability.merged import families_of
from narwhal.observability.metrics import RouterMetrics
from narwhal.observability.tracing import Tracer, build_tracer
from narwhal.ops.config_changes import compare
from narwhal.ops.drain import Drain
from narwhal.ops.reload import Source
from narwhal.ops.state import RouterState
from narwhal.protocol.dialects import capabilities
from narwhal.scheduler.prefix_cache import prefix_cache_for
from narwhal.sizing import EngineTokenizer, TokenizeCandidate, WorkloadSizer, load_sizer
from narwhal.sizing.metrics import SizingCollector
from narwhal.transport.client import UNREACHABLE, RemoteCore

log = logging.getLogger("narwhal.worker")

# How long start-up waits for the decision process before the worker listens anyway
# (refusing with 503 until it is reached).
CONNECT_WAIT_S = 30.0


class RelayWorker:
    def __init__(
        self,
        config: Config,
        core_socket: str,
        admin_socket: str,
        *,
        source: Source | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        """`source(running)`: the configuration file read again, for a reload."""
        self._source = source
        self._reloading: set[asyncio.Task[None]] = set()
        config = self.config = resolve_secrets(config, os.environ)
        self.tracer: Tracer = tracer or build_tracer(config.tracing)
        self.metrics = RouterMetrics()
        self.state = RouterState(self.metrics.registry)
        self.drain = Drain()
        self.shutting_down = False
        admission = config.admission
        # What an engine can do until the decision process's view says: its configured
        # dialect's (an engine this worker's file does not name: the default dialect's).
        dialects = {e.name: e.dialect for e in config.engines}
        default = EngineConfig(name="-", url="http://-").dialect
        core = self.core = RemoteCore(
            core_socket, lambda engine: capabilities(dialects.get(engine, default))
        )
        gate = AdmissionGate(core, self.metrics, wait_timeout_s=admission.wait_timeout_s)
        self.gate = gate
        core.on_wakeups = gate.wake
        core.on_lost = lambda: gate.refuse_waiting(
            lambda: RouterUnavailable.not_admitting(UNREACHABLE)
        )
        core.on_readiness = self._readiness_changed
        core.on_engines = self._engines_changed
        core.families = lambda: families_of(self.metrics.registry)
        metrics = self.metrics
        core.tally = lambda: metrics.counted
        gate.refuse_at(self.drain)
        self.pool = UpstreamPool(connect_timeout=5.0, idle_timeout=30.0)
        self.clients: dict[str, EngineClient] = {
            e.name: EngineClient.configured(e, self.pool, config) for e in config.engines
        }
        self.session = SharedSession()
        self.sizer = WorkloadSizer(
            load_sizer(config.tokenizer),
            EngineTokenizer(self.session, self._tokenize_candidates),
            use_engine=admission.mode == "predictive" and config.tokenizer is None,
        )
        self.metrics.registry.register(SizingCollector(self.sizer))
        self.dispatcher = Dispatcher(
            config,
            self.metrics,
            core,
            gate,
            self.clients,
            self.state,
            prefix=prefix_cache_for(config),
            prompt_counted=self.sizer.observe_engine_prompt_tokens,
            engine_count=self.sizer.engine_count if self.sizer.calibrating else None,
            drain=self.drain,
        )
        classes = PriorityClasses.from_config(admission)
        self.tenants = Tenants(config.tenants, classes, time.monotonic())
        self.metrics.class_series(classes.names, self.tenants.names)
        api_keys = BearerTokens(config.client_keys)
        self.front = CompletionFront(
            config,
            self.metrics,
            self.dispatcher,
            self.sizer,
            self.state,
            api_keys,
            self.tenants,
            self.tracer,
        )
        ops = OpsRoutes(
            config.model,
            self.metrics,
            self.dispatcher,
            self.state,
            api_keys,
            context_len=core.max_model_len,
        )
        self.proxy = DecisionProxy(admin_socket)
        self.app: web.Application = build_app(
            self.front,
            ops,
            lambda: self.config.serving.max_request_bytes,
            api_keys,
            closing=lambda: self.shutting_down,
            decision=self.proxy.handle,
        )
        self.loop_monitor = LoopMonitor(self.metrics.registry)
        self.app.on_startup.append(self._on_startup)
        self.app.on_cleanup.append(self._on_cleanup)

    async def _on_startup(self, app: web.Application) -> None:
        await self.loop_monitor.start()
        await self.session.open()
        await self.core.start(wait_s=CONNECT_WAIT_S)

    async def stop_admitting(self) -> None:
        """SIGTERM: this worker refuses new work at once, the requests it queued too."""
        self.shutting_down = True
        self.state.set("shutdown", "shutting_down", "stopping")

    async def _on_cleanup(self, app: web.Application) -> None:
        await self.loop_monitor.close()
        self.core.push_counts()  # the last of what this worker counted, before it goes
        await self.core.close()
        await self.proxy.close()
        await self.session.close()
        await self.pool.close()
        await asyncio.to_thread(self.tracer.close)

    def reload_signalled(self) -> None:
        """SIGHUP: read the file again in the background (the log says how it went)."""
        task = asyncio.create_task(self._reload(), name="narwhal-worker-reload")
        self._reloading.add(task)
        task.add_done_callback(self._reloading.discard)

    async def _reload(self) -> None:
        if self._source is None:
            return
        try:
            config = await asyncio.to_thread(self._source, self.config)
        except ConfigError as e:
            # The decision process logs each problem and keeps its configuration: so do we.
            log.info("relay worker: configuration not reloaded (%d problem(s))", len(e.problems))
            return
        self.apply(resolve_secrets(config, os.environ))

    def apply(self, config: Config) -> None:
        """Serve by `config` from now on: what can change live, and a connection for each
        engine added or replaced (the decision process refuses what needs a restart)."""
        if compare(self.config, config).restart:
            return
        for engine in config.engines:
            known = self.clients.get(engine.name)
            if known is None or not known.serves(engine, config):
                self.clients[engine.name] = EngineClient.configured(engine, self.pool, config)
        self.config = config
        self.dispatcher.reconfigure(config)
        self.front.reconfigure(config)
        self.gate.wait_timeout_s = config.admission.wait_timeout_s
        log.info("relay worker: configuration reloaded")

    def _engines_changed(self, names: tuple[str, ...]) -> None:
        """The decision process's fleet names an engine this worker has no connection
        for (a reload there, by `POST /admin/reload`): read the file again now, well
        before the decision process has profiled the engine and places on it."""
        if any(name not in self.clients for name in names):
            self.reload_signalled()

    def _readiness_changed(self, reason: str | None) -> None:
        """The decision process stopped admitting (or has no engine): who waits here in
        the queue gets its 503 now, as in a single router."""
        if reason is not None and reason != "no_engines":
            self.gate.refuse_waiting(lambda: RouterUnavailable.not_admitting(reason))

    def _tokenize_candidates(self) -> list[TokenizeCandidate]:
        """Every configured engine, with the capabilities the decision process resolved;
        the tokenizer skips those without a tokenize endpoint and those that fail."""
        return [
            TokenizeCandidate(
                engine.name,
                engine.url.rstrip("/"),
                self.core.capabilities(engine.name),
                engine.authorization,
            )
            for engine in self.config.engines
        ]
