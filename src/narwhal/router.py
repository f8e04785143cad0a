"""The composition root: builds every component from the configuration, in order.

No component reaches another through globals, and none builds its own collaborators:
each gets them here, through its constructor. Start-up runs in dependency order (engine
connections, then the fleet monitor's first round), shutdown in reverse.
"""

from __future__ import annotations

import aiohttp
from aiohttp import web

from narwhal.admission.controller import Admission
from narwhal.admission.gate import AdmissionGate
from narwhal.api.admin import AdminRoutes
from narwhal.api.app import build_app
from narwhal.api.completions import CompletionFront
from narwhal.api.engines_report import EngineReport
from narwhal.api.ops import OpsRoutes
from narwhal.config import Config
from narwhal.dispatch import Dispatcher
from narwhal.engines.client import EngineClient
from narwhal.engines.upstream import UpstreamPool
from narwhal.fleet.monitor import FleetMonitor
from narwhal.metrics import RouterMetrics
from narwhal.scheduler.registry import EngineRegistry
from narwhal.scheduler.scheduler import Scheduler
from narwhal.sizing import WorkloadSizer, load_sizer
from narwhal.state import RouterState


class Router:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.metrics = RouterMetrics()
        self.state = RouterState()
        self.registry = EngineRegistry(config.engines)
        self.scheduler = Scheduler(self.registry, round_robin=config.fleet.policy == "round_robin")
        admission = config.admission
        self.admission = Admission(
            self.scheduler,
            max_retained=config.serving.max_retained,
            queue_limit=admission.queue_limit,
            prefill_limit=admission.phase_concurrency.prefill,
            decode_limit=admission.phase_concurrency.decode,
        )
        self.gate = AdmissionGate(
            self.admission, self.metrics, wait_timeout_s=admission.wait_timeout_s
        )
        self.pool = UpstreamPool(connect_timeout=5.0, idle_timeout=30.0)
        clients = {e.name: EngineClient(e, self.pool) for e in config.engines}
        self.dispatcher = Dispatcher(
            config, self.metrics, self.registry, self.scheduler, self.gate, clients
        )
        self.report = EngineReport(self.registry, self.scheduler)
        sizer = WorkloadSizer(load_sizer(config.tokenizer), remote=None, use_engine=False)
        front = CompletionFront(config, self.metrics, self.dispatcher, sizer, self.state)
        ops = OpsRoutes(config.model, self.metrics, self.dispatcher, self.state)
        self.app: web.Application = build_app(front, ops, config.serving.max_request_bytes)
        AdminRoutes(self.dispatcher, self.report, config.serving.admin_token).add_to(self.app)
        self.app.on_startup.append(self._on_startup)
        self.app.on_cleanup.append(self._on_cleanup)
        self._session: aiohttp.ClientSession | None = None  # the fleet monitor's
        self.monitor: FleetMonitor | None = None

    async def _on_startup(self, app: web.Application) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
            auto_decompress=False,
        )
        monitor = FleetMonitor(
            self.config.engines,
            self.config.fleet,
            self._session,
            self.metrics.registry,
            model=self.config.model,
        )
        for name, entry in self.registry.entries.items():
            entry.health = monitor.health(name)
        self.registry.set_health_predicate(monitor.is_placeable)
        monitor.subscribe(self.dispatcher.capacity_changed)
        self.dispatcher.monitor = self.report.monitor = self.monitor = monitor
        await monitor.start()

    async def _on_cleanup(self, app: web.Application) -> None:
        if self.monitor is not None:
            await self.monitor.close()
        if self._session is not None:
            await self._session.close()
        await self.pool.close()
