"""The composition root: builds every component from the configuration, in order.

No component reaches another through globals, and none builds its own collaborators:
each gets them here, through its constructor. Start-up runs in dependency order (engine
connections, then the fleet monitor's first round, then, in predictive mode, the first
profiling round), shutdown in reverse.

`admission.mode: predictive` adds the models (`ModelBook`, one `EngineModel` per
engine), the learning listener on admission's transitions, the projecting scorer
(unless `fleet.policy: round_robin`), the predictive check, the profiler (an engine is
placeable once profiled) and prompt sizing by the engines' tokenize endpoints. `open`
builds none of them: placement by in-flight work, as before.

`ha.backend: etcd` adds the leadership (`ha/leadership.py`) last: a router campaigns only
once its engines are monitored and profiled, so the standby that takes over is warm; until
it wins it refuses traffic as `standby`. The operator state (drains, maintenance waves)
then lives in etcd under the fleet's key.
"""

from __future__ import annotations

import asyncio
import os
import socket

import aiohttp
from aiohttp import web

from narwhal.admission.controller import Admission, PlacementListener
from narwhal.admission.gate import AdmissionGate
from narwhal.admission.predictive import PredictiveCheck
from narwhal.api.admin import AdminRoutes
from narwhal.api.app import build_app
from narwhal.api.auth import BearerTokens
from narwhal.api.completions import CompletionFront
from narwhal.api.engines_report import EngineReport
from narwhal.api.ops import OpsRoutes
from narwhal.config import Config, resolve_secrets
from narwhal.dispatch import Dispatcher
from narwhal.engines.client import EngineClient
from narwhal.engines.profiling import Profiler
from narwhal.engines.upstream import UpstreamPool
from narwhal.fleet.monitor import FleetMonitor
from narwhal.ha.election import Timing
from narwhal.ha.etcd import EtcdClient
from narwhal.ha.leadership import Leadership
from narwhal.loop_monitor import LoopMonitor
from narwhal.metrics import RouterMetrics
from narwhal.models.book import ModelBook
from narwhal.models.metrics import ModelCollector
from narwhal.operator_state import OperatorState
from narwhal.scheduler.learning import PlacementLearning
from narwhal.scheduler.metrics import EngineStateCollector
from narwhal.scheduler.predictive import ProjectingScorer, decoding_on
from narwhal.scheduler.prefix_accuracy import AccuracyPolicy
from narwhal.scheduler.prefix_cache import PrefixCache
from narwhal.scheduler.prefix_metrics import PrefixCollector
from narwhal.scheduler.registry import EngineEntry, EngineRegistry
from narwhal.scheduler.scheduler import Scheduler
from narwhal.sizing import EngineTokenizer, TokenizeCandidate, WorkloadSizer, load_sizer
from narwhal.state import RouterState
from narwhal.tracing import Tracer, build_tracer

# How long start-up waits for the first profiles before listening (predictive mode).
PROFILE_WAIT_S = 10.0


class Router:
    def __init__(self, config: Config, *, tracer: Tracer | None = None) -> None:
        """`tracer`: the spans' recorder in place of the one `config.tracing` names."""
        # Secrets named by `_env`/`_file` keys are read here if the caller has not (ConfigError
        # when one cannot be): every component below sees them inline.
        config = self.config = resolve_secrets(config, os.environ)
        # First: without the SDK that tracing.otlp_endpoint needs, nothing else is built.
        self.tracer: Tracer = tracer or build_tracer(config.tracing)
        self.metrics = RouterMetrics()
        ha = config.ha.backend == "etcd"
        # With HA, refuse from the first instant: leadership is proven, never assumed.
        self.state = RouterState(self.metrics.registry, {"ha": "standby"} if ha else None)
        self.registry = EngineRegistry(config.engines)
        self.metrics.registry.register(EngineStateCollector(self.registry))
        admission = config.admission
        predictive = admission.mode == "predictive"
        round_robin = config.fleet.policy == "round_robin"
        self.prefix = _prefix_cache(config)
        self.book: ModelBook | None = None
        listener: PlacementListener | None = None
        check: PredictiveCheck | None = None
        self.scheduler = Scheduler(self.registry, round_robin=round_robin, prefix=self.prefix)
        if predictive:
            book = self.book = ModelBook(
                self.registry.entries,
                step_budgets={e.name: e.max_num_batched_tokens for e in config.engines},
                max_sequences={e.name: e.max_num_seqs for e in config.engines},
                ttft_budget_s=admission.ttft_target_s,
                prediction_error=self.metrics.ttft_prediction_error.observe,
            )
            for name, entry in self.registry.entries.items():
                entry.model = book.model(name)
            self.registry.set_ready_predicate(_profiled)
            listener = PlacementLearning(book)
            if not round_robin:
                self.scheduler.scorer = ProjectingScorer(
                    book, tpot_target_s=admission.tpot_target_s, prefix=self.prefix
                )
            check = PredictiveCheck(
                self.registry,
                book,
                ttft_budget_s=admission.ttft_target_s,
                refused=lambda reason: self.metrics.refused.labels(reason).inc(),
                prefix=self.prefix,
            )
            entries = self.registry.entries
            self.metrics.registry.register(
                ModelCollector(book, lambda name: decoding_on(entries[name]))
            )
        if self.prefix is not None:
            entries = self.registry.entries
            self.metrics.registry.register(
                PrefixCollector(self.prefix, lambda: list(entries.values()))
            )
        self.admission = Admission(
            self.scheduler,
            max_retained=config.serving.max_retained,
            queue_limit=admission.queue_limit,
            prefill_limit=admission.phase_concurrency.prefill,
            decode_limit=admission.phase_concurrency.decode,
            listener=listener,
        )
        self.gate = AdmissionGate(
            self.admission, self.metrics, wait_timeout_s=admission.wait_timeout_s
        )
        self.pool = UpstreamPool(connect_timeout=5.0, idle_timeout=30.0)
        self.clients = {
            e.name: EngineClient(
                e, self.pool, forward_client_authorization=config.forwards_client_authorization(e)
            )
            for e in config.engines
        }
        # Engines' tokenize endpoints size prompts only where the count decides something.
        self.sizer = WorkloadSizer(
            load_sizer(config.tokenizer), use_engine=predictive and config.tokenizer is None
        )
        self.dispatcher = Dispatcher(
            config,
            self.metrics,
            self.registry,
            self.scheduler,
            self.gate,
            self.clients,
            self.state,
            check=check,
            lengths=None if self.book is None else self.book.lengths,
            prompt_counted=self.sizer.observe_engine_prompt_tokens,
        )
        self.report = EngineReport(self.registry, self.scheduler)
        api_keys = BearerTokens(config.serving.api_keys)
        front = CompletionFront(
            config, self.metrics, self.dispatcher, self.sizer, self.state, api_keys, self.tracer
        )
        ops = OpsRoutes(config.model, self.metrics, self.dispatcher, self.state, api_keys)
        self.app: web.Application = build_app(
            front, ops, config.serving.max_request_bytes, api_keys
        )
        self.operator = OperatorState(self.registry, self.dispatcher.capacity_changed)
        AdminRoutes(self.operator, self.report, config.serving.admin_token).add_to(self.app)
        self.app.on_startup.append(self._on_startup)
        self.app.on_cleanup.append(self._on_cleanup)
        self._session: aiohttp.ClientSession | None = None  # fleet probes, tokenize calls
        self.monitor: FleetMonitor | None = None
        self.profiler: Profiler | None = None
        self.leadership: Leadership | None = None
        self.loop_monitor = LoopMonitor(self.metrics.registry)

    async def _on_startup(self, app: web.Application) -> None:
        await self.loop_monitor.start()
        session = self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
            auto_decompress=False,
        )
        monitor = FleetMonitor(
            self.config.engines,
            self.config.fleet,
            session,
            self.metrics.registry,
            model=self.config.model,
        )
        for name, entry in self.registry.entries.items():
            entry.health = monitor.health(name)
        self.registry.set_health_predicate(monitor.is_placeable)
        monitor.subscribe(self.dispatcher.capacity_changed)
        self.dispatcher.monitor = self.report.monitor = self.monitor = monitor
        self.sizer.attach_remote(EngineTokenizer(session, self._tokenize_candidates))
        await monitor.start()
        self.dispatcher.capacity_changed()  # the state of maintenance and monitoring
        if self.book is not None:
            self.profiler = Profiler(
                self.registry,
                self.clients,
                model=self.config.model,
                changed=self.dispatcher.capacity_changed,
            )
            await self.profiler.start(PROFILE_WAIT_S)
        if self.config.ha.backend == "etcd":
            await self._start_leadership(session)

    async def _start_leadership(self, session: aiohttp.ClientSession) -> None:
        ha = self.config.ha
        timing = Timing(
            ttl_s=ha.lease_ttl_s,
            renew_interval_s=ha.renew_interval,
            margin_s=ha.margin,
            retry_s=ha.renew_interval / 4,
        )
        # One etcd call never outlasts a renewal interval: a renewal that late is useless.
        client = EtcdClient(ha.endpoints, session, timeout_s=ha.renew_interval)
        self.operator.share(client, ha.key)
        identity = ha.id or f"{socket.gethostname()}:{os.getpid()}"
        self.leadership = Leadership(client, timing, ha.key, identity, self.state, self.operator)
        await self.leadership.start()

    async def stop_admitting(self) -> None:
        """SIGTERM: refuse new work at once and hand leadership to a standby."""
        self.state.set("shutdown", "shutting_down", "stopping")
        if self.leadership is not None:
            await self.leadership.resign()

    async def _on_cleanup(self, app: web.Application) -> None:
        await self.loop_monitor.close()
        if self.leadership is not None:
            await self.leadership.resign()  # idempotent: SIGTERM resigned already
        if self.profiler is not None:
            await self.profiler.close()
        if self.monitor is not None:
            await self.monitor.close()
        if self._session is not None:
            await self._session.close()
        await self.pool.close()
        # The spans still queued go out last (in a thread: export is blocking I/O).
        await asyncio.to_thread(self.tracer.close)

    def _tokenize_candidates(self) -> list[TokenizeCandidate]:
        """Engines that may count a prompt: healthy ones (placeability aside); the
        tokenizer itself skips dialects without a tokenize endpoint."""
        return [
            TokenizeCandidate(
                entry.name,
                entry.config.url.rstrip("/"),
                entry.config.dialect,
                entry.config.authorization,
            )
            for entry in self.registry.entries.values()
            if entry.health is not None and entry.health.healthy
        ]


def _profiled(entry: EngineEntry) -> bool:
    return entry.model is not None and entry.model.profiled


def _prefix_cache(config: Config) -> PrefixCache | None:
    """The engines' prefix indexes, for `fleet.policy: cache_aware` only."""
    if config.fleet.policy != "cache_aware":
        return None
    settings = config.fleet.prefix_index
    return PrefixCache(
        [e.name for e in config.engines],
        block_chars=settings.block_chars,
        max_blocks=settings.max_blocks,
        accuracy=AccuracyPolicy(
            threshold=settings.drift_threshold, forget_after_s=settings.forget_after_s
        ),
    )
