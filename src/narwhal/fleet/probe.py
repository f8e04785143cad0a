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

Every answer is read within `max_bytes` (`fleet.max_probe_answer_bytes`, see
`engines/answers.py`): past it the probe fails (`HealthCheck.TOO_LARGE`,
`MetricsFailure.TOO_LARGE`, `Oversized`) and the connection is closed. JSON answers are
decoded into the few fields read, so what an engine nests elsewhere is skipped, not
built; and a /v1/models list is decoded only when it can hold at most `MAX_MODELS` cards.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, TypeVar

import aiohttp
import msgspec

from narwhal.config import FleetConfig
from narwhal.engines.answers import AnswerTooLarge, read_bounded
from narwhal.engines.session import HttpSession
from narwhal.fleet.scrape import parse_engine_metrics
from narwhal.fleet.state import HealthCheck, MetricsFailure, ScrapeResult
from narwhal.protocol.dialects import DialectCapabilities

Headers = Mapping[str, str]
_NO_HEADERS: Headers = {}
_T = TypeVar("_T")
# `fleet.max_probe_answer_bytes`' default, for callers that have no configuration.
DEFAULT_MAX_ANSWER_BYTES: Final = FleetConfig().max_probe_answer_bytes


class Refused:
    """The engine answered 401 or 403: it wants an API key the router did not send (or
    sent wrong)."""

    def __repr__(self) -> str:
        return "REFUSED"


REFUSED = Refused()


@dataclass(frozen=True, slots=True)
class Oversized:
    """The answer was over a bound (`reason` says which): the probe failed."""

    reason: str


def too_large(path: str, limit: int) -> str:
    """The reason an answer over `fleet.max_probe_answer_bytes` is given."""
    return f"{path} answer over fleet.max_probe_answer_bytes ({limit} bytes)"


# The cards of /v1/models read at most: a vLLM server lists its model and its LoRA
# adapters, a few hundred at the very most.
MAX_MODELS: Final = 10_000
# Counted before decoding, the JSON objects (`{`) the answer may hold: each card is one
# and a vLLM card nests one more (its `permission`), so eight a card leaves room for any
# server's cards; a list past it is refused as over MAX_MODELS. This keeps what decoding
# builds to a few MB whatever fits in the byte bound (8 MiB of `{},` is 2.8 million cards).
_MAX_MODEL_OBJECTS: Final = 8 * MAX_MODELS
_TOO_MANY_MODELS: Final = f"/v1/models answer lists over {MAX_MODELS} models"

# 404 from /metrics: the engine has no such endpoint (transformers serve, DESIGN.md §4).
_NOT_FOUND = 404
# 503 from /health: the engine reports itself dead (PROTOCOL.md §5.2, §6.3).
_UNAVAILABLE = 503
# 401 or 403: the engine was started with --api-key, and the router's is missing or wrong.
_REFUSED_CREDENTIALS = (401, 403)


async def check_health(
    session: HttpSession,
    base_url: str,
    per_request: aiohttp.ClientTimeout,
    headers: Headers = _NO_HEADERS,
    max_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
) -> HealthCheck:
    try:
        async with session.get(
            base_url + "/health", timeout=per_request, raise_for_status=False, headers=headers
        ) as response:
            # Read the (tiny) body so the connection goes back to the pool for reuse.
            await read_bounded(response, max_bytes)
            status = response.status
    except AnswerTooLarge:
        return HealthCheck.TOO_LARGE
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
    session: HttpSession,
    base_url: str,
    engine: DialectCapabilities,
    per_request: aiohttp.ClientTimeout,
    headers: Headers = _NO_HEADERS,
    max_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
) -> ScrapeResult:
    try:
        async with session.get(
            base_url + "/metrics", timeout=per_request, raise_for_status=False, headers=headers
        ) as response:
            body = await read_bounded(response, max_bytes)
            status = response.status
    except AnswerTooLarge:
        return MetricsFailure.TOO_LARGE
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
    scrape = parse_engine_metrics(body.decode("utf-8", errors="replace"), engine.metrics_vendors)
    if scrape is not None:
        return scrape
    # A generic OpenAI server may serve /metrics for something else entirely (its own
    # process metrics): for the scheduler that is the same as having none.
    if engine.metrics_optional:
        return MetricsFailure.ABSENT
    return MetricsFailure.UNREADABLE


async def list_models(
    session: HttpSession,
    base_url: str,
    per_request: aiohttp.ClientTimeout,
    headers: Headers = _NO_HEADERS,
    max_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
) -> dict[str, int | None] | Refused | Oversized | None:
    """The model ids of the engine's GET /v1/models, each with its context length when
    the card says (vLLM's `max_model_len`); REFUSED when the engine refused the router's
    credentials, Oversized when the answer is over a bound, None when it cannot tell."""
    raw = await _get(session, base_url, "/v1/models", per_request, headers, max_bytes)
    if not isinstance(raw, bytes):
        return raw
    if raw.count(b"{") > _MAX_MODEL_OBJECTS:
        return Oversized(_TOO_MANY_MODELS)
    listing = _decode(raw, _ModelList)
    if listing is None:
        return None
    if len(listing.data) > MAX_MODELS:
        return Oversized(_TOO_MANY_MODELS)
    models: dict[str, int | None] = {}
    for card in listing.data:
        # A card with no usable id is skipped, as is a context length that is not one.
        model = _decode(card.id, str) if card.id else None
        if model is not None:
            context = _decode(card.max_model_len, int) if card.max_model_len else None
            models[model] = context if context is not None and context > 0 else None
    return models


async def engine_version(
    session: HttpSession,
    base_url: str,
    per_request: aiohttp.ClientTimeout,
    headers: Headers = _NO_HEADERS,
    max_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
) -> str | Oversized | None:
    """The engine's GET /version (vLLM: `{"version": "0.33.0"}`), Oversized when the
    answer is over the bound, or None when it cannot tell."""
    raw = await _get(session, base_url, "/version", per_request, headers, max_bytes)
    if isinstance(raw, Oversized):
        return raw
    answer = _decode(raw, _Version) if isinstance(raw, bytes) else None
    return None if answer is None else answer.version


class _Card(msgspec.Struct, gc=False):
    # Raw: each field is decoded on its own, so that one odd card costs only itself.
    id: msgspec.Raw = msgspec.Raw()
    max_model_len: msgspec.Raw = msgspec.Raw()


class _ModelList(msgspec.Struct, gc=False):
    data: list[_Card]


class _Version(msgspec.Struct, gc=False):
    version: str | None = None


def _decode(raw: bytes | msgspec.Raw, kind: type[_T]) -> _T | None:
    """`raw` as a `kind` (unknown fields skipped), or None when it is not one."""
    try:
        return msgspec.json.decode(raw, type=kind)
    except (msgspec.DecodeError, RecursionError):  # (ValidationError is a DecodeError)
        return None


async def _get(
    session: HttpSession,
    base_url: str,
    path: str,
    per_request: aiohttp.ClientTimeout,
    headers: Headers,
    max_bytes: int,
) -> bytes | Refused | Oversized | None:
    """The body of a 200 answer to GET `path`, REFUSED for 401 or 403, Oversized over
    `max_bytes`, or None for anything else."""
    try:
        async with session.get(
            base_url + path, timeout=per_request, raise_for_status=False, headers=headers
        ) as response:
            if response.status in _REFUSED_CREDENTIALS:
                return REFUSED
            if response.status != 200:
                return None
            return await read_bounded(response, max_bytes)
    except AnswerTooLarge:
        return Oversized(too_large(path, max_bytes))
    except (TimeoutError, aiohttp.ClientError, OSError):
        return None
