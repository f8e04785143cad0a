"""The sim's `--api-key`, as the engines guard their routes, and `--authorization-log`.

With a key, a request to a guarded route without `Authorization: Bearer <key>` gets 401
`{"error": "Unauthorized"}`, the body both vLLM and SGLang answer. Which routes are
guarded follows the engine the dialect stands for:

- vllm, openai: every path under /v1 (vLLM's `--api-key`); /health, /metrics, /tokenize,
  /version stay open;
- sglang: every path but /health... and /metrics... (SGLang's `--api-key`).

The sim's own /sim/ routes (the KV pull between two sims, the state page) are never
guarded: they stand for the engines' side channels, not their HTTP API.

`--authorization-log FILE` appends a line per request answered: method, path, status and
the Authorization header as it came (`-` when absent), so tests can see what a router sent
and what it got for it.
"""

from __future__ import annotations

import hmac

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from narwhal.sim.options import SimOptions

_SIM_PATHS = "/sim/"


def auth_middlewares(options: SimOptions) -> list[Middleware]:
    middlewares: list[Middleware] = []
    if options.authorization_log is not None:
        middlewares.append(_authorization_log(options.authorization_log))
    if options.api_key is not None:
        middlewares.append(_require_key(options.api_key, options.dialect))
    return middlewares


def _guarded(path: str, dialect: str) -> bool:
    if path.startswith(_SIM_PATHS):
        return False
    if dialect == "sglang":
        return not path.startswith(("/health", "/metrics"))
    return path.startswith("/v1")


def _require_key(api_key: str, dialect: str) -> Middleware:
    expected = f"Bearer {api_key}".encode()

    @web.middleware
    async def require_key(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method != "OPTIONS" and _guarded(request.path, dialect):
            offered = request.headers.get("Authorization", "").encode(errors="replace")
            if not hmac.compare_digest(offered, expected):
                return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    return require_key


def _authorization_log(path: str) -> Middleware:
    @web.middleware
    async def log_authorization(request: web.Request, handler: Handler) -> web.StreamResponse:
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as e:  # aiohttp's own 404 and 405
            status = e.status
            raise
        finally:
            authorization = request.headers.get("Authorization", "-")
            _append(path, f"{request.method} {request.path} {status} {authorization}\n")

    return log_authorization


def _append(path: str, line: str) -> None:
    # A line to a local file, for tests: as --arrival-log, not worth a thread.
    with open(path, "a", encoding="utf-8") as log:
        log.write(line)
