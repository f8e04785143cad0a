"""Operations endpoints: /health, /ready, /metrics and /v1/models.

/v1/models asks for the client API key when `serving.api_keys` is set, as vLLM's
--api-key guards every /v1 route; /health, /ready and /metrics stay open, for the
orchestrator's probes and Prometheus (they say nothing a client key should guard).
Its card carries `max_model_len` as vLLM's does, once an engine has given it: the
smallest among the engines a request may be placed on, the longest context the router
serves (clients size their prompts by it).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from narwhal.api.auth import BearerTokens, require_api_key
from narwhal.api.request_id import current_request_id
from narwhal.api.responses import error_response, json_response
from narwhal.api.service import CompletionService
from narwhal.errors import InvalidApiKey, ModelNotFound
from narwhal.observability.metrics import RouterMetrics
from narwhal.ops.state import RouterState


class OpsRoutes:
    def __init__(
        self,
        model: str,
        metrics: RouterMetrics,
        service: CompletionService,
        state: RouterState,
        api_keys: BearerTokens,
        context_len: Callable[[], int | None] = lambda: None,
        render: Callable[[], Awaitable[bytes]] | None = None,
    ) -> None:
        """`render()`: the `/metrics` page, where it is more than this process's registry
        (the decision process's, merged with its relay workers')."""
        self._render = render
        self._api_keys = api_keys
        self._context_len = context_len
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
        render = self._render
        body = self._metrics.render() if render is None else await render()
        response = web.Response(body=body)
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def models(self, request: web.Request) -> web.Response:
        refusal = self._without_key(request)
        if refusal is not None:
            return refusal
        return json_response({"object": "list", "data": [self._card()]})

    async def model(self, request: web.Request) -> web.Response:
        """GET /v1/models/{model}, as the OpenAI client's `models.retrieve` asks."""
        refusal = self._without_key(request)
        if refusal is not None:
            return refusal
        name = request.match_info["model"]
        if name != self._model:
            error = ModelNotFound(name)
            return json_response(error.envelope(), status=error.status)
        return json_response(self._card())

    def _without_key(self, request: web.Request) -> web.Response | None:
        """The 401 for a request without a valid API key, or None to go on."""
        try:
            require_api_key(self._api_keys, request.headers.get("Authorization"))
        except InvalidApiKey as error:
            return error_response(error, current_request_id.get())
        return None

    def _card(self) -> dict[str, object]:
        card: dict[str, object] = {
            "id": self._model,
            "object": "model",
            "created": self._created,
            "owned_by": "narwhal",
        }
        context_len = self._context_len()
        if context_len is not None:
            card["max_model_len"] = context_len
        return card
