"""The two HTTP probes of an engine, each turned into an outcome and never an exception.

Transport errors are mapped onto the most specific outcome (see `state.HealthCheck`):
`ClientConnectorError` (refused, unroutable, unresolvable) means nothing is listening;
`TimeoutError` (aiohttp's `ServerTimeoutError` is one) means it did not answer in time;
any other `aiohttp.ClientError` or `OSError` is a broken exchange. Anything else is a
bug and propagates, for the monitor to log.

Each request carries its own total timeout, covering connecting, headers and body, and
sets `raise_for_status=False` so that statuses are read here whatever the shared
session was built with. `headers` are the engine's own (its `Authorization: Bearer`
when it has an api_key: vLLM leaves /health and /metrics open but guards /v1/models,
SGLang guards everything but /health and /metrics; every request carries the key).
"""

from __future__ import annotations

from collections.abc import Mapping

import aiohttp

from narwhal.fleet.scrape import parse_engine_metrics
from narwhal.fleet.state import HealthCheck, MetricsFailure, ScrapeResult
from narwhal.protocol.dialects import Dialect, capabilities

Headers = Mapping[str, str]
_NO_HEADERS: Headers = {}


class Refused:
    """The engine answered 401 or 403: it wants an API key the router did not send (or
    sent wrong)."""

    def __repr__(self) -> str:
        return "REFUSED"


REFUSED = Refused()

# 404 from /metrics: the engine has no such endpoint (transformers serve, DESIGN.md §4).
_NOT_FOUND = 404
# 503 from /health: the engine reports itself dead (PROTOCOL.md §5.2, §6.3).
_UNAVAILABLE = 503
# 401 or 403: the engine was started with --api-key, and the router's is missing or wrong.
_REFUSED_CREDENTIALS = (401, 403)


async def check_health(
    session: aiohttp.ClientSession,
    base_url: str,
    per_request: aiohttp.ClientTimeout,
    headers: Headers = _NO_HEADERS,
) -> HealthCheck:
    try:
        async with session.get(
            base_url + "/health", timeout=per_request, raise_for_status=False, headers=headers
        ) as response:
            # Read the (tiny) body so the connection goes back to the pool for reuse.
            await response.read()
            status = response.status
    except TimeoutError:
        return HealthCheck.TIMEOUT
    except aiohttp.ClientConnectorError:
        return HealthCheck.UNREACHABLE
    except (aiohttp.ClientError, OSError):
        return HealthCheck.ERROR
    if 200 <= status < 300:
        return HealthCheck.OK
    return HealthCheck.UNHEALTHY if status == _UNAVAILABLE else HealthCheck.BAD_STATUS


async def scrape_metrics(
    session: aiohttp.ClientSession,
    base_url: str,
    dialect: Dialect,
    per_request: aiohttp.ClientTimeout,
    headers: Headers = _NO_HEADERS,
) -> ScrapeResult:
    try:
        async with session.get(
            base_url + "/metrics", timeout=per_request, raise_for_status=False, headers=headers
        ) as response:
            body = await response.read()
            status = response.status
    except TimeoutError:
        return MetricsFailure.TIMEOUT
    except aiohttp.ClientConnectorError:
        return MetricsFailure.UNREACHABLE
    except (aiohttp.ClientError, OSError):
        return MetricsFailure.ERROR
    if status == _NOT_FOUND:
        return MetricsFailure.ABSENT
    if status != 200:
        return MetricsFailure.BAD_STATUS
    # The exposition format is UTF-8; a stray bad byte must not cost the whole page.
    scrape = parse_engine_metrics(body.decode("utf-8", errors="replace"), dialect)
    if scrape is not None:
        return scrape
    # A generic OpenAI server may serve /metrics for something else entirely (its own
    # process metrics): for the scheduler that is the same as having none.
    if capabilities(dialect).metrics_optional:
        return MetricsFailure.ABSENT
    return MetricsFailure.UNREADABLE


async def list_models(
    session: aiohttp.ClientSession,
    base_url: str,
    per_request: aiohttp.ClientTimeout,
    headers: Headers = _NO_HEADERS,
) -> dict[str, int | None] | Refused | None:
    """The model ids of the engine's GET /v1/models, each with its context length when
    the card says (vLLM's `max_model_len`); REFUSED when the engine refused the router's
    credentials, None when it cannot tell."""
    body = await _get_json(session, base_url + "/v1/models", per_request, headers)
    if body is REFUSED:
        return REFUSED
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return None
    models: dict[str, int | None] = {}
    for card in data:
        if isinstance(card, dict) and isinstance(card.get("id"), str):
            context = card.get("max_model_len")
            valid = type(context) is int and context > 0
            models[card["id"]] = context if valid else None
    return models


async def engine_version(
    session: aiohttp.ClientSession,
    base_url: str,
    per_request: aiohttp.ClientTimeout,
    headers: Headers = _NO_HEADERS,
) -> str | None:
    """The engine's GET /version (vLLM: `{"version": "0.33.0"}`), or None when it cannot
    tell."""
    body = await _get_json(session, base_url + "/version", per_request, headers)
    version = body.get("version") if isinstance(body, dict) else None
    return version if isinstance(version, str) else None


async def _get_json(
    session: aiohttp.ClientSession, url: str, per_request: aiohttp.ClientTimeout, headers: Headers
) -> object:
    """The JSON body of a 200 answer to GET `url`, REFUSED for 401 or 403, or None for
    anything else."""
    try:
        async with session.get(
            url, timeout=per_request, raise_for_status=False, headers=headers
        ) as response:
            if response.status in _REFUSED_CREDENTIALS:
                return REFUSED
            if response.status != 200:
                return None
            body: object = await response.json(content_type=None)
            return body
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
        return None
