"""Operations endpoints: /health, /ready, /metrics and /v1/models."""

from __future__ import annotations

import time

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from narwhal.api.responses import json_response
from narwhal.api.service import CompletionService
from narwhal.errors import ModelNotFound
from narwhal.metrics import RouterMetrics
from narwhal.state import RouterState


class OpsRoutes:
    def __init__(
        self, model: str, metrics: RouterMetrics, service: CompletionService, state: RouterState
    ) -> None:
        self._model = model
        self._metrics = metrics
        self._service = service
        self._state = state
        self._created = int(time.time())

    async def health(self, request: web.Request) -> web.Response:
        return json_response({"status": "ok"})

    async def ready(self, request: web.Request) -> web.Response:
        reason = self._service.readiness()  # the router state's reason first, then engines
        if reason is not None:
            return json_response({"ready": False, "reason": reason}, status=503)
        return json_response({"ready": True, "role": "active", "revision": self._state.revision})

    async def metrics(self, request: web.Request) -> web.Response:
        response = web.Response(body=self._metrics.render())
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def models(self, request: web.Request) -> web.Response:
        return json_response({"object": "list", "data": [self._card()]})

    async def model(self, request: web.Request) -> web.Response:
        """GET /v1/models/{model}, as the OpenAI client's `models.retrieve` asks."""
        name = request.match_info["model"]
        if name != self._model:
            error = ModelNotFound(name)
            return json_response(error.envelope(), status=error.status)
        return json_response(self._card())

    def _card(self) -> dict[str, object]:
        return {
            "id": self._model,
            "object": "model",
            "created": self._created,
            "owned_by": "narwhal",
        }
