"""The aiohttp application: routes and the middleware every response passes through."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from narwhal.api.auth import BearerTokens
from narwhal.api.completions import CompletionFront
from narwhal.api.ops import OpsRoutes
from narwhal.api.request_id import HEADER as REQUEST_ID_HEADER
from narwhal.api.request_id import choose_request_id, current_request_id
from narwhal.api.responses import error_response
from narwhal.api.server import request_in_progress
from narwhal.errors import InvalidRequest


@web.middleware
async def request_id_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Give every request an id and every response the X-Request-Id header.

    aiohttp's own HTTP errors (unknown route, wrong method) become OpenAI envelopes too,
    a 405 keeping its Allow header.
    Streaming handlers set the header themselves, before their headers go out.
    """
    request_id = choose_request_id(request.headers.get(REQUEST_ID_HEADER))
    current_request_id.set(request_id)
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        error = InvalidRequest(f"{exc.reason}: {request.method} {request.path}")
        response = error_response(error, request_id)
        response.set_status(exc.status, exc.reason)
        allow = exc.headers.get("Allow")
        if allow is not None:  # a 405 must say which methods the resource has (RFC 9110)
            response.headers["Allow"] = allow
        return response
    if not response.prepared:
        response.headers.setdefault(REQUEST_ID_HEADER, request_id)
    return response


def closing_connections(closing: Callable[[], bool]) -> Middleware:
    """While `closing()` (the router is shutting down), every response not yet started says
    `Connection: close`: a client on a kept-alive connection, which its load balancer no
    longer governs, opens a new one for its next request, and that one goes to a router
    still in the endpoints."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await handler(request)
        if closing() and not response.prepared:
            response.force_close()
        return response

    return middleware


def continue_within(
    limit: Callable[[], int], api_keys: BearerTokens
) -> Callable[[web.Request], Awaitable[None]]:
    """An `Expect: 100-continue` handler that invites only bodies the front will read
    (`limit()`: serving.max_request_bytes as configured now).

    A body declared larger than the limit, or sent without a valid API key (when
    `serving.api_keys` is set), gets no "100 Continue": the completion front answers 413
    or 401 at once, and a well-behaved client never sends the body.
    """

    async def expect_handler(request: web.Request) -> None:
        declared = request.content_length
        if declared is not None and declared > limit():
            return
        if api_keys and not api_keys.admit(request.headers.get("Authorization")):
            return
        if request.headers.get("Expect", "").lower() == "100-continue":
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            request.writer.output_size = 0

    return expect_handler


def build_app(
    front: CompletionFront,
    ops: OpsRoutes,
    max_request_bytes: Callable[[], int],
    api_keys: BearerTokens,
    closing: Callable[[], bool] = lambda: False,
    decision: Handler | None = None,
) -> web.Application:
    """`max_request_bytes()`: the body limit as configured now; `closing()`: whether the
    router is shutting down; `decision`: in a relay worker, the handler that passes
    `/ready`, `/metrics` and `/admin/*` on to the decision process, which answers them
    for the whole router."""
    # Bodies are read by the completion front under serving.max_request_bytes; aiohttp's own
    # limit applies only to request.read() (the admin routes' small bodies), and is the same
    # one, so that every 413 names the limit that refused it.
    app = web.Application(
        # Fixed at start-up: a reload's new limit reaches the completion routes (and the
        # 100-continue check) only; the admin routes' small bodies keep this one.
        client_max_size=max_request_bytes(),
        middlewares=[request_in_progress, closing_connections(closing), request_id_middleware],
        # Bodies are read as sent: aiohttp would inflate a gzip body as it arrives, past any
        # limit (a 1 MiB bomb inflates to 1 GiB) and with a 500 for a corrupt one; the front
        # refuses a Content-Encoding with 415 instead.
        handler_args={"auto_decompress": False},
    )
    expect = continue_within(max_request_bytes, api_keys)
    app.router.add_post("/v1/chat/completions", front.chat, expect_handler=expect)
    app.router.add_post("/v1/completions", front.completions, expect_handler=expect)
    app.router.add_get("/v1/models", ops.models)
    # Any name, slashes and line breaks included ("." stops at a newline): a model that does
    # not exist is the handler's 404 model_not_found, not the router's bare 404.
    app.router.add_get(r"/v1/models/{model:[\s\S]+}", ops.model)
    app.router.add_get("/health", ops.health)
    if decision is not None:
        app.router.add_get("/ready", decision)
        app.router.add_get("/metrics", decision)
        app.router.add_route("*", "/admin/{tail:.*}", decision)
        return app
    app.router.add_get("/ready", ops.ready)
    app.router.add_get("/metrics", ops.metrics)
    return app
