"""Taking a validated request to an engine and back.

Until engines are placed (the engine path), no engine is placement-eligible and every
valid request gets the seed's 503 `backend_unavailable` with Retry-After: 1.
"""

from __future__ import annotations

from aiohttp import web

from narwhal.api.service import RequestContext
from narwhal.config import Config
from narwhal.errors import BackendUnavailable
from narwhal.metrics import RouterMetrics
from narwhal.protocol.requests import CompletionRequest


class Dispatcher:
    def __init__(self, config: Config, metrics: RouterMetrics) -> None:
        self._config = config
        self._metrics = metrics

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    def readiness(self) -> str | None:
        return "no_engines"

    async def serve(
        self, request: CompletionRequest, context: RequestContext, http: web.Request
    ) -> tuple[web.StreamResponse, str]:
        raise BackendUnavailable("No placement-eligible engine serves this request.")
