"""The composition root: builds every component from the configuration, in order.

No component reaches another through globals: each gets its collaborators here, through
its constructor. Start-up runs in dependency order and shutdown in reverse.
"""

from __future__ import annotations

from aiohttp import web

from narwhal.api.admin import AdminRoutes
from narwhal.api.app import build_app
from narwhal.api.completions import CompletionFront
from narwhal.api.ops import OpsRoutes
from narwhal.config import Config
from narwhal.dispatch import Dispatcher
from narwhal.metrics import RouterMetrics
from narwhal.sizing import WorkloadSizer, load_sizer
from narwhal.state import RouterState


class Router:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.metrics = RouterMetrics()
        self.state = RouterState()
        self.dispatcher = Dispatcher(config, self.metrics)
        sizer = WorkloadSizer(load_sizer(config.tokenizer), remote=None, use_engine=False)
        front = CompletionFront(config, self.metrics, self.dispatcher, sizer, self.state)
        ops = OpsRoutes(config.model, self.metrics, self.dispatcher, self.state)
        self.app: web.Application = build_app(front, ops, config.serving.max_request_bytes)
        AdminRoutes(self.dispatcher, config.serving.admin_token).add_to(self.app)
        self.app.on_startup.append(self._on_startup)
        self.app.on_cleanup.append(self._on_cleanup)

    async def _on_startup(self, app: web.Application) -> None:
        await self.dispatcher.start()

    async def _on_cleanup(self, app: web.Application) -> None:
        await self.dispatcher.close()
