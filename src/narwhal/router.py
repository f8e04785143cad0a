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

While it runs, `reload(config)` applies a reloaded configuration (`narwhal.ops.reload` reads
and checks the file, on SIGHUP or `POST /admin/reload`): limits, budgets and tokens take
their new values in the components that hold them, and the engines added, removed and
changed go through `FleetMembership`. What only a restart can change is refused by key
(`config_changes`), and then nothing changes. The shutdown's drain deadline (`drain.py`)
is built here too and shared by everything that waits on a request's deadline.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from narwhal.admission.classes import PriorityClasses
from narwhal.admission.controller import Admission, PlacementListener
from narwhal.admission.predictive import PredictiveCheck
from narwhal.admission.tenants import Tenants
from narwhal.api.admin import AdminRoutes
from narwhal.api.app import build_app
from narwhal.api.auth import BearerTokens
from narwhal.api.completions import CompletionFront
from narwhal.api.ops import OpsRoutes
from narwhal.config import Config, ConfigError, resolve_secrets
from narwhal.decision.brain import Brain, BrainSettings
from narwhal.decision.core import InProcessCore
from narwhal.dispatch import Dispatcher
from narwhal.dispatch.gate import AdmissionGate
from narwhal.engines.client import EngineClient
from narwhal.engines.session import SharedSession
from narwhal.engines.upstream import UpstreamPool
from narwhal.fleet.monitor import FleetMonitor
from narwhal.ha.election import Timing
from narwhal.ha.etcd import EtcdClient, EtcdError, EtcdUnavailable
from narwhal.ha.kubernetes import NotInCluster
from narwhal.ha.leadership import Leadership
from narwhal.ha.pod_label import PodLabel, PodMark
from narwhal.models.book import ModelBook
from narwhal.observability.exposition import Exposition
from narwhal.observability.loop_monitor import LoopMonitor
from narwhal.observability.merged import MergedRegistry
from narwhal.observability.metrics import RouterMetrics
from narwhal.observability.model_metrics import ModelCollector
from narwhal.observability.tracing import Tracer, build_tracer
from narwhal.ops.config_changes import compare
from narwhal.ops.drain import Drain
from narwhal.ops.membership import FleetMembership
from narwhal.ops.operator_state import OperatorState, OperatorStateUnavailable
from narwhal.ops.reload import ConfigReloader, Source
from narwhal.ops.state import RouterState
from narwhal.profiling.probe_text import ProbeCounter
from narwhal.profiling.runs import Profiler
from narwhal.scheduler.learning import PlacementLearning
from narwhal.scheduler.metrics import EngineStateCollector
from narwhal.scheduler.predictive import PrefillParts, ProjectingScorer, decoding_on
from narwhal.scheduler.prefix_cache import prefix_cache_for
from narwhal.scheduler.prefix_metrics import PrefixCollector
from narwhal.scheduler.registry import EngineEntry, EngineRegistry
from narwhal.scheduler.report import EngineReport
from narwhal.scheduler.scheduler import Scheduler
from narwhal.sizing import EngineTokenizer, TokenizeCandidate, WorkloadSizer, load_sizer
from narwhal.sizing.metrics import SizingCollector
from narwhal.transport.server import CoreServer

# How long start-up waits for the first profiles before listening (predictive mode).
PROFILE_WAIT_S = 10.0
log = logging.getLogger(__name__)


class Router:
    def __init__(
        self,
        config: Config,
        *,
        source: Source | None = None,
        tracer: Tracer | None = None,
        core_socket: str | None = None,
    ) -> None:
        """`source(running)`: the configuration file, read and checked again (blocking),
        for a reload; None when there is no file (the embedded default). `tracer`: the spans'
        recorder in place of the one `config.tracing` names."""
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
        self.prefix = prefix_cache_for(config)
        self.book: ModelBook | None = None
        listener: PlacementListener | None = None
        check: PredictiveCheck | None = None
        self.check: PredictiveCheck | None = None
        self.drain = Drain()
        self.shutting_down = False
        # Called with the new configuration after each reload (the server's own settings).
        self.reloaded: list[Callable[[Config], None]] = []
        self.scheduler = Scheduler(self.registry, round_robin=round_robin, prefix=self.prefix)
        classes = self.classes = PriorityClasses.from_config(admission)
        self.tenants = Tenants(config.tenants, classes, time.monotonic())
        self.metrics.class_series(classes.names, self.tenants.names)
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
            parts = PrefillParts()  # the check's projections, for the scorer
            if not round_robin:
                self.scheduler.scorer = ProjectingScorer(
                    book, tpot_target_s=admission.tpot_target_s, prefix=self.prefix, parts=parts
                )
            check = self.check = PredictiveCheck(
                self.registry,
                book,
                ttft_budget_s=admission.ttft_target_s,
                refused=lambda reason: self.metrics.refused.labels(reason).inc(),
                prefix=self.prefix,
                classes=classes,
                standing=self.tenants.standing,
                parts=parts,
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
            reserved_prefill=lambda rank: self.classes.reserved_prefill(rank),
            weight=self.tenants.weight,
            aging_s=classes.aging_s,
        )
        # Every decision behind one seam: the gate, its asyncio shell, speaks to it in
        # values (`narwhal.decision`).
        self.brain = Brain(
            BrainSettings(ttft_target_s=admission.ttft_target_s),
            self.state,
            self.admission,
            check=check,
            lengths=None if self.book is None else self.book.lengths,
            admitted=self.tenants.admitted,
        )
        core = InProcessCore(self.brain)
        self.gate = AdmissionGate(core, self.metrics, wait_timeout_s=admission.wait_timeout_s)
        for entry in self.registry.entries.values():
            self.gate.watch_engine(entry)
        self.gate.refuse_at(self.drain)
        self.pool = UpstreamPool(connect_timeout=5.0, idle_timeout=30.0)
        self.clients: dict[str, EngineClient] = {
            e.name: EngineClient.configured(e, self.pool, config) for e in config.engines
        }
        # The one session of the side calls (probes, scrapes, tokenize, etcd): every
        # component gets it now, and it opens when the router starts.
        self.session = SharedSession()
        monitor = self.monitor = FleetMonitor(
            config.engines,
            config.fleet,
            self.session,
            self.metrics.registry,
            model=config.model,
            own_requests=self._own_requests,
        )
        for name, entry in self.registry.entries.items():
            entry.health = monitor.health(name)
        self.registry.set_health_predicate(monitor.is_placeable)
        # Engines' tokenize endpoints size prompts only where the count decides something.
        self._local_sizer = load_sizer(config.tokenizer)
        self.sizer = WorkloadSizer(
            self._local_sizer,
            EngineTokenizer(self.session, self._tokenize_candidates),
            use_engine=predictive and config.tokenizer is None,
        )
        self.metrics.registry.register(SizingCollector(self.sizer))
        self.dispatcher = Dispatcher(
            config,
            self.metrics,
            core,
            self.gate,
            self.clients,
            self.state,
            monitoring_degraded=monitor.monitoring_degraded,
            prefix=self.prefix,
            prompt_counted=self.sizer.observe_engine_prompt_tokens,
            engine_count=self.sizer.engine_count if self.sizer.calibrating else None,
            drain=self.drain,
        )
        monitor.subscribe(self.dispatcher.capacity_changed)
        self.report = EngineReport(
            self.registry, self.scheduler, monitor, lambda: self.classes.names
        )
        api_keys = self.api_keys = BearerTokens(config.client_keys)
        front = self.front = CompletionFront(
            config,
            self.metrics,
            self.dispatcher,
            self.sizer,
            self.state,
            api_keys,
            self.tenants,
            self.tracer,
        )
        self.core_socket = core_socket
        self.core_server: CoreServer | None = None
        render = None
        if core_socket is not None:
            merged = MergedRegistry(self.metrics.registry)
            entries = self.registry.entries
            core_server = self.core_server = CoreServer(
                self.brain, lambda: list(entries), merged=merged
            )
            exposition = Exposition(merged)

            async def render() -> bytes:
                await core_server.scrape()
                return exposition.render()

        ops = OpsRoutes(
            config.model,
            self.metrics,
            self.dispatcher,
            self.state,
            api_keys,
            context_len=self.registry.max_model_len,
            render=render,
        )
        self.app: web.Application = build_app(
            front,
            ops,
            lambda: self.config.serving.max_request_bytes,
            api_keys,
            closing=lambda: self.shutting_down,
        )
        self.operator = OperatorState(self.registry, self.dispatcher.capacity_changed)
        self.reloader = ConfigReloader(source, lambda: self.config, self.reload)
        self.admin = AdminRoutes(
            self.operator,
            self.report,
            config.serving.admin_token,
            reload=self.reloader.reload,
            tenants=self.tenants_report,
        )
        self.admin.add_to(self.app)
        if self.core_server is not None:
            self.app.router.add_get("/_narwhal/workers", self._workers_connected)
        self.profiler: Profiler | None = None
        if self.book is not None:
            self.profiler = Profiler(
                self.registry,
                self.clients,
                model=config.model,
                changed=self.dispatcher.capacity_changed,
                counter=ProbeCounter(
                    self.session,
                    self._local_sizer.text_counter,
                    model=config.model,
                    max_answer_bytes=lambda: self.config.fleet.max_probe_answer_bytes,
                    learned=self.sizer.learn_text,
                ),
                probe_sizes=lambda: self.config.fleet.probe_prompt_tokens,
            )
        self.membership = FleetMembership(
            registry=self.registry,
            clients=self.clients,
            pool=self.pool,
            monitor=monitor,
            gate=self.gate,
            book=self.book,
            prefix=self.prefix,
            profiler=self.profiler,
            changed=self.dispatcher.capacity_changed,
        )
        self.leadership = self._leadership(config) if config.ha.backend == "etcd" else None
        self.pod_label = self._pod_label(config)
        self.loop_monitor = LoopMonitor(self.metrics.registry)
        self._started = False  # until start-up has run: a reload waits for it
        self.app.on_startup.append(self._on_startup)
        self.app.on_cleanup.append(self._on_cleanup)

    def _leadership(self, config: Config) -> Leadership:
        ha = config.ha
        timing = Timing(
            ttl_s=ha.lease_ttl_s,
            renew_interval_s=ha.renew_interval,
            margin_s=ha.margin,
            retry_s=ha.renew_interval / 4,
        )
        # One etcd call never outlasts a renewal interval: a renewal that late is useless.
        client = EtcdClient(ha.endpoints, self.session, timeout_s=ha.renew_interval)
        self.operator.share(client, ha.key)
        identity = ha.id or f"{socket.gethostname()}:{os.getpid()}"
        return Leadership(client, timing, ha.key, identity, self.state, self.operator)

    def _pod_label(self, config: Config) -> PodLabel | None:
        """On Kubernetes, the leader's label on its own pod, which the clients' Service
        selects (`ha/pod_label.py`): it steers traffic, `self.state` decides admission."""
        label = config.ha.kubernetes_label
        if label is None:
            return None
        try:
            return PodLabel.in_cluster(
                self.state,
                PodMark(label.key, label.value, label.deletion_cost),
                pod_name_env=label.pod_name_env,
                service_account_dir=label.service_account_dir,
                registry=self.metrics.registry,
            )
        except NotInCluster as e:
            raise ConfigError(f"ha.kubernetes_label: {e}") from None

    async def _on_startup(self, app: web.Application) -> None:
        """In dependency order: the session, the engines' first monitoring round, then
        (predictive) their first profiles; with HA, the campaign last, warm."""
        await self.loop_monitor.start()
        if self.pod_label is not None:
            await self.pod_label.start()  # first: a label an earlier process left goes now
        await self.session.open()
        await self.monitor.start()
        self.dispatcher.capacity_changed()  # the state of maintenance and monitoring
        if self.profiler is not None:
            await self.profiler.start(PROFILE_WAIT_S)
        if self.leadership is not None:
            await self.leadership.start()
        if self.core_server is not None and self.core_socket is not None:
            await self.core_server.start(self.core_socket)  # the workers may connect now
        self._started = True

    async def _workers_connected(self, request: web.Request) -> web.Response:
        """For the supervisor (on the decision process's own socket only): how many relay
        workers are connected, so it announces the router once all of them are."""
        assert self.core_server is not None
        return web.json_response({"connected": self.core_server.workers})

    async def stop_admitting(self) -> None:
        """SIGTERM: refuse new work at once (the requests queued too) and hand leadership
        to a standby; what is placed already runs on."""
        self.shutting_down = True
        self.state.set("shutdown", "shutting_down", "stopping")
        if self.pod_label is not None:
            await self.pod_label.withdraw()  # the label off before the lease (at most 1 s)
        if self.leadership is not None:
            await self.leadership.resign()

    async def reload(self, config: Config) -> list[str]:
        """Serve by `config` from now on; a line per change. ConfigError, with nothing
        changed, when it differs in what only a restart can change."""
        config = resolve_secrets(config, os.environ)  # read already when it came from a file
        changes = compare(self.config, config)
        if changes.restart:
            raise ConfigError(*changes.restart)
        if not changes.described:
            return []
        if not self._started:
            raise ConfigError("the router is still starting: reload once it is listening")
        membership = self.membership
        running, self.config = self.config, config
        self._apply_settings(config)
        self.dispatcher.reconfigure(config)
        self.front.reconfigure(config)
        membership.apply(running, config, changes.engines)
        if changes.engines.added or changes.engines.replaced:
            await self._adopt_operator_state()
        for listener in self.reloaded:
            listener(config)
        return list(changes.described)

    def _apply_settings(self, config: Config) -> None:
        """Limits, budgets and tokens: each component takes its new values."""
        serving, admission = config.serving, config.admission
        controller = self.admission
        controller.max_retained = serving.max_retained
        controller.queue.limit = admission.queue_limit
        controller.prefill_limit = admission.phase_concurrency.prefill
        controller.decode_limit = admission.phase_concurrency.decode
        self.gate.wait_timeout_s = admission.wait_timeout_s
        # Classes keep their names (a restart-only key): shares, reserves, aging and the
        # tenants' weights and quotas change under the requests queued, which stay.
        classes = self.classes = PriorityClasses.from_config(admission)
        self.tenants.reconfigure(config.tenants, classes, time.monotonic())
        self.metrics.class_series(classes.names, self.tenants.names)
        controller.queue.aging_s = classes.aging_s
        self.brain.settings.ttft_target_s = admission.ttft_target_s
        if self.book is not None:
            self.book.set_budget(admission.ttft_target_s)
        if self.check is not None:
            self.check.budget = admission.ttft_target_s
            self.check.classes = classes
        if isinstance(self.scheduler.scorer, ProjectingScorer):
            self.scheduler.scorer.tpot_target_s = admission.tpot_target_s
        self.api_keys.replace(config.client_keys)
        self.admin.set_admin_token(serving.admin_token)
        self.monitor.reconfigure(config.fleet)
        # Higher limits may let queued requests start now.
        self.gate.reconsider()

    async def _adopt_operator_state(self) -> None:
        """With high availability, an engine added may be drained in etcd already (it was
        drained before an earlier reload removed it): apply that before it is placed."""
        try:
            await self.operator.load()
        except (EtcdUnavailable, EtcdError, OperatorStateUnavailable) as e:
            log.warning("reload: could not read the drains from etcd (next renewal will): %s", e)

    async def _on_cleanup(self, app: web.Application) -> None:
        if self.core_server is not None:
            await self.core_server.close()
        await self.loop_monitor.close()
        await self.membership.close()
        if self.pod_label is not None:
            await self.pod_label.close()  # the label off (bounded, idempotent), its client
        if self.leadership is not None:
            await self.leadership.resign()  # idempotent: SIGTERM resigned already
        if self.profiler is not None:
            await self.profiler.close()
        await self.monitor.close()
        await self.session.close()
        await self.pool.close()
        # The spans still queued go out last (in a thread: export is blocking I/O).
        await asyncio.to_thread(self.tracer.close)

    def tenants_report(self) -> dict[str, Any]:
        """GET /admin/tenants: the classes, and each tenant's share, queue and quotas."""
        names = self.classes.names
        queued = {
            tenant: {names[rank]: n for rank, n in ranks.items()}
            for tenant, ranks in self.admission.queue.by_tenant().items()
        }
        return {
            "classes": [
                {
                    "name": name,
                    "budget_share": round(self.classes.share(rank), 4),
                    "reserved_prefill": self.classes.reserved[rank],
                }
                for rank, name in enumerate(names)
            ],
            "tenants": self.tenants.report(time.monotonic(), queued),
        }

    def _own_requests(self, name: str) -> int:
        entry = self.registry.get(name)
        return 0 if entry is None else entry.own_requests

    def _tokenize_candidates(self) -> list[TokenizeCandidate]:
        """Engines that may count a prompt: healthy ones (placeability aside); the
        tokenizer itself skips dialects without a tokenize endpoint."""
        return [
            TokenizeCandidate(
                entry.name,
                entry.config.url.rstrip("/"),
                entry.capabilities,
                entry.config.authorization,
            )
            for entry in self.registry.entries.values()
            if entry.health is not None and entry.health.healthy and not entry.retiring
        ]


def _profiled(entry: EngineEntry) -> bool:
    return entry.model is not None and entry.model.profiled
