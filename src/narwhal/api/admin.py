"""Admin routes: the engine registry, the tenants' shares and quotas (`GET /admin/tenants`),
drain and undrain, maintenance waves, and reloading the configuration file
(`POST /admin/reload`, as SIGHUP does: `narwhal.ops.reload`).

Without `serving.admin_token` they answer only on loopback (anything else gets 403), so a
router bound to a public address does not hand its fleet to whoever finds the port. With
it, every admin request must carry `Authorization: Bearer <token>`, loopback included
(401 otherwise): behind a sidecar or a reverse proxy on the same host every client is
loopback. The token is compared in constant time (`auth.py`). It may be given inline,
or through `serving.admin_token_env` or `serving.admin_token_file` (config.py reads it).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from narwhal.api.auth import BearerTokens
from narwhal.api.responses import json_response
from narwhal.errors import InvalidRequest, NarwhalError, RequestTooLarge
from narwhal.ops.operator_state import OperatorState
from narwhal.ops.reload import ReloadRefused
from narwhal.protocol.jsonbody import decode_object


class _Forbidden(NarwhalError):
    status = 403
    error_type = "permission_error"
    code = "forbidden"


class _Unauthorized(NarwhalError):
    status = 401
    error_type = "authentication_error"
    code = "invalid_admin_token"


class _UnknownEngine(NarwhalError):
    status = 404
    error_type = "invalid_request_error"
    code = "engine_not_found"


class AdminRoutes:
    def __init__(
        self,
        operator: OperatorState,
        report: Callable[[], list[dict[str, Any]]],
        admin_token: str | None,
        reload: Callable[[], Awaitable[list[str]]] | None = None,
        tenants: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        """`reload()`: re-read the configuration file and apply it; what changed, or a
        NarwhalError saying why nothing did. `tenants()`: GET /admin/tenants's body."""
        self._operator = operator
        self._report = report
        self._tenants = tenants
        self._reload = reload
        self._token: BearerTokens | None = None
        self.set_admin_token(admin_token)

    def set_admin_token(self, admin_token: str | None) -> None:
        """Guard the routes with `admin_token` from now on (None: loopback only)."""
        self._token = None if admin_token is None else BearerTokens([admin_token])

    def add_to(self, app: web.Application) -> None:
        app.router.add_get("/admin/engines", self.engines)
        if self._tenants is not None:
            app.router.add_get("/admin/tenants", self.tenants)
        app.router.add_post("/admin/engines/{name}/drain", self.drain)
        app.router.add_post("/admin/engines/{name}/undrain", self.undrain)
        app.router.add_post("/admin/maintenance", self.maintenance)
        if self._reload is not None:
            app.router.add_post("/admin/reload", self.reload)

    async def engines(self, request: web.Request) -> web.StreamResponse:
        return await self._guarded(request, self._engines)

    async def tenants(self, request: web.Request) -> web.StreamResponse:
        return await self._guarded(request, self._tenants_report)

    async def drain(self, request: web.Request) -> web.StreamResponse:
        return await self._guarded(request, self._set_drained, True)

    async def undrain(self, request: web.Request) -> web.StreamResponse:
        return await self._guarded(request, self._set_drained, False)

    async def maintenance(self, request: web.Request) -> web.StreamResponse:
        return await self._guarded(request, self._maintenance)

    async def reload(self, request: web.Request) -> web.StreamResponse:
        return await self._guarded(request, self._reloaded)

    async def _guarded(
        self,
        request: web.Request,
        handler: Callable[..., Awaitable[web.Response]],
        *args: object,
    ) -> web.Response:
        try:
            self._authorize(request)
            return await handler(request, *args)
        except NarwhalError as error:
            response = json_response(error.envelope(), status=error.status)
            if isinstance(error, _Unauthorized):
                response.headers["WWW-Authenticate"] = 'Bearer realm="narwhal-admin"'
            return response

    def _authorize(self, request: web.Request) -> None:
        if self._token is not None:
            if self._token.admit(request.headers.get("Authorization")):
                return
            raise _Unauthorized("Admin routes need Authorization: Bearer <serving.admin_token>.")
        if _is_loopback(request.remote):
            return
        raise _Forbidden("Admin routes answer on loopback only (no serving.admin_token is set).")

    async def _engines(self, request: web.Request) -> web.Response:
        return json_response({"engines": self._report()})

    async def _tenants_report(self, request: web.Request) -> web.Response:
        assert self._tenants is not None, "the route is added only with a report"
        return json_response(self._tenants())

    async def _set_drained(self, request: web.Request, drained: bool) -> web.Response:
        name = request.match_info["name"]
        if not await self._operator.set_drained(name, drained):
            raise _UnknownEngine(f"No engine named {name!r}.", param="name")
        return json_response({"name": name, "drained": drained})

    async def _maintenance(self, request: web.Request) -> web.Response:
        try:
            raw = await request.read()  # at most serving.max_request_bytes (client_max_size)
        except web.HTTPRequestEntityTooLarge:
            raise RequestTooLarge(request.client_max_size) from None
        except (ConnectionError, HttpProcessingError, web.RequestPayloadError):
            raise InvalidRequest("The request body ended early.") from None
        body = decode_object(raw)
        wave = body.get("wave")
        action = body.get("action")
        if not isinstance(wave, int) or isinstance(wave, bool) or wave < 0:
            raise InvalidRequest("'wave' must be a nonnegative integer.", param="wave")
        if action not in ("start", "end"):
            raise InvalidRequest("'action' must be 'start' or 'end'.", param="action")
        waves = await self._operator.set_wave(wave, action == "start")
        return json_response({"active_waves": sorted(waves)})

    async def _reloaded(self, request: web.Request) -> web.Response:
        assert self._reload is not None, "the route is added only with a reload"
        try:
            changes = await self._reload()
        except ReloadRefused as refused:
            # The envelope, and the problems one by one for tools.
            body = {**refused.envelope(), "problems": list(refused.problems)}
            return json_response(body, status=refused.status)
        return json_response({"reloaded": True, "changes": changes})


def _is_loopback(remote: str | None) -> bool:
    if remote is None:
        return False
    try:
        return ipaddress.ip_address(remote).is_loopback
    except ValueError:
        return False
