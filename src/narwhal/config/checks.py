"""What the configuration's types cannot express: each section's checks, once that section
is well typed (`narwhal.config.config_from_mapping` runs them), each a list of `Problem`s
named by their dotted paths: an engine's URL (a base, not one ending in /v1), the
prefill/decode handshake of its dialect, names and URLs unique, a disaggregated fleet's
two halves, the fleet's timings, high availability's lease, the tracing endpoint, and
secrets given once, in a form a bearer header can carry."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from msgspec import Struct

from narwhal.config.credentials import secret_problem
from narwhal.config.schema import Path, Problem
from narwhal.protocol.dialects import capabilities

if TYPE_CHECKING:
    from narwhal.config import (
        EngineConfig,
        FleetConfig,
        HAConfig,
        ServingConfig,
        TracingConfig,
    )


def _check_serving(serving: ServingConfig) -> list[Problem]:
    path: Path = ("serving",)
    problems = _one_source(path, "admin_token", serving)
    if serving.admin_token is not None:
        problems += _secret_problems((*path, "admin_token"), serving.admin_token)
    for i, key in enumerate(serving.api_keys):
        problems += _secret_problems((*path, "api_keys", i), key)
    if serving.tls_cert is not None and serving.tls_key is None:
        problems.append(Problem((*path, "tls_key"), "required with serving.tls_cert (HTTPS)"))
    if serving.tls_key is not None and serving.tls_cert is None:
        problems.append(Problem((*path, "tls_cert"), "required with serving.tls_key (HTTPS)"))
    return problems


def check_engines(engines: Sequence[tuple[int, EngineConfig]], *, whole: bool) -> list[Problem]:
    """Each well-typed engine's own checks, and names and URLs unique among them; with the
    `whole` list well typed, the fleet's too: at least one engine, and a disaggregated
    fleet with both halves."""
    problems: list[Problem] = []
    for i, engine in engines:
        path: Path = ("engines", i)
        problems += url_problems((*path, "url"), engine.url)
        if engine.role != "both" and not capabilities(engine.dialect).disaggregates:
            problems.append(
                Problem(
                    (*path, "role"),
                    f"a {engine.role} engine takes the prefill/decode handshake "
                    f"(kv_transfer_params: dialect vllm or sglang), which dialect "
                    f"{engine.dialect} has not; give it role both",
                )
            )
        problems += _one_source(path, "api_key", engine)
        if engine.api_key is not None:
            problems += _secret_problems((*path, "api_key"), engine.api_key)
    problems += _duplicates(engines, "name", lambda e: e.name)
    problems += _duplicates(engines, "url", _engine_address)
    if not whole:
        return problems
    if not engines:
        problems.append(Problem(("engines",), "at least one engine is required"))
    roles = {engine.role for _, engine in engines}
    if "prefill" in roles and "decode" not in roles:
        problems.append(Problem(("engines",), "prefill engines need at least one decode engine"))
    if "decode" in roles and "prefill" not in roles:
        problems.append(Problem(("engines",), "decode engines need at least one prefill engine"))
    return problems


def url_problems(path: Path, written: str) -> list[Problem]:
    """An engine's URL is its base: scheme, host, port (and a path prefix where a proxy
    puts it), to which Narwhal adds /v1/chat/completions, /health, /metrics ... itself. The
    OpenAI habit of a base URL ending in /v1 would send every request to /v1/v1/..."""
    url = urlsplit(written)
    if url.scheme not in ("http", "https") or not url.hostname:
        return [Problem(path, f"expected an http:// or https:// URL, got {json.dumps(written)}")]
    prefix = url.path.rstrip("/")
    if prefix == "/v1" or prefix.endswith("/v1"):
        base = written.rstrip("/").removesuffix("/v1")
        return [
            Problem(
                path,
                f"ends in /v1, which Narwhal adds itself (and /health, /metrics, /tokenize "
                f"beside it): give the engine's base URL, {json.dumps(base)}",
            )
        ]
    return []


def _duplicates(
    engines: Iterable[tuple[int, EngineConfig]], key: str, identity: Callable[[EngineConfig], str]
) -> list[Problem]:
    """Engines after the first with the same `identity` (its `key` shown)."""
    first: dict[str, tuple[int, EngineConfig]] = {}
    problems: list[Problem] = []
    for i, engine in engines:
        j, earlier = first.setdefault(identity(engine), (i, engine))
        if j != i:
            value = json.dumps(getattr(engine, key))
            message = f"duplicate engine {key} {value} (engines.{j}, {earlier.name}, has it)"
            problems.append(Problem(("engines", i, key), message))
    return problems


def _engine_address(engine: EngineConfig) -> str:
    """One engine's URL however it is written: scheme and host in any case, the default
    port written or not, a trailing slash or not."""
    url = urlsplit(engine.url)
    try:
        port = url.port or {"http": 80, "https": 443}.get(url.scheme.lower())
    except ValueError:  # a port that is not a number: the URL is its own identity
        return engine.url
    return f"{url.scheme.lower()}://{(url.hostname or '').lower()}:{port}{url.path.rstrip('/')}"


def _check_fleet(fleet: FleetConfig) -> list[Problem]:
    problems = []
    if fleet.stale_after_s < fleet.probe_interval_s:
        problems.append(
            Problem(
                ("fleet", "stale_after_s"),
                f"must be at least fleet.probe_interval_s ({fleet.probe_interval_s}), "
                f"got {fleet.stale_after_s}",
            )
        )
    sizes = fleet.probe_prompt_tokens
    if sizes is not None and len(set(sizes)) < 2:
        problems.append(
            Problem(
                ("fleet", "probe_prompt_tokens"),
                "must hold at least two different lengths (the prefill fit needs short and "
                f"long prompts), got {list(sizes)}",
            )
        )
    return problems


def _check_ha(ha: HAConfig) -> list[Problem]:
    if ha.backend != "etcd":
        return []
    if not ha.endpoints:
        return [Problem(("ha", "endpoints"), "required when ha.backend is etcd")]
    problems: list[Problem] = []
    for i, endpoint in enumerate(ha.endpoints):
        url = urlsplit(endpoint)
        if url.scheme not in ("http", "https") or not url.hostname:
            problems.append(
                Problem(
                    ("ha", "endpoints", i),
                    "expected an http:// or https:// URL of an etcd client port, "
                    f"got {json.dumps(endpoint)}",
                )
            )
    if ha.margin >= ha.lease_ttl_s:
        problems.append(
            Problem(
                ("ha", "fence_margin_s"),
                f"must be below ha.lease_ttl_s ({ha.lease_ttl_s}), got {ha.margin:g}",
            )
        )
    elif ha.renew_interval >= ha.lease_ttl_s - ha.margin:
        problems.append(
            Problem(
                ("ha", "renew_interval_s"),
                "must be below ha.lease_ttl_s - ha.fence_margin_s "
                f"({ha.lease_ttl_s - ha.margin:g} s), so that a renewal comes before the "
                f"leader fences itself; got {ha.renew_interval:g}",
            )
        )
    return problems


def _check_tracing(tracing: TracingConfig) -> list[Problem]:
    endpoint = tracing.otlp_endpoint
    if endpoint is None:
        return []
    url = urlsplit(endpoint)
    if url.scheme in ("http", "https") and url.hostname:
        return []
    return [
        Problem(
            ("tracing", "otlp_endpoint"),
            "expected an http:// or https:// URL of an OTLP/HTTP collector, "
            f"got {json.dumps(endpoint)}",
        )
    ]


SECTION_CHECKS: dict[str, Callable[[Any], list[Problem]]] = {
    "serving": _check_serving,
    "fleet": _check_fleet,
    "ha": _check_ha,
    "tracing": _check_tracing,
}


def _one_source(path: Path, key: str, section: Struct) -> list[Problem]:
    """At most one of `key`, `key_env` and `key_file` may be set."""
    given = [k for k in (key, f"{key}_env", f"{key}_file") if getattr(section, k) is not None]
    if len(given) <= 1:
        return []
    return [Problem((*path, given[1]), f"give only one of {', '.join(given)}")]


def _secret_problems(path: Path, value: str) -> list[Problem]:
    problem = secret_problem(value)
    return [] if problem is None else [Problem(path, problem)]
