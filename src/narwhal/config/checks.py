"""What the configuration's types cannot express: each section's checks, once that section
is well typed (`narwhal.config.config_from_mapping` runs them), each a list of `Problem`s
named by their dotted paths: an engine's URL (a base, not one ending in /v1), the
prefill/decode handshake of its dialect, names and URLs unique, a disaggregated fleet's
two halves, the fleet's timings, high availability's lease and its Kubernetes label (a
label key and value Kubernetes accepts), the tracing endpoint, and secrets given once, in
a form a bearer header can carry."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from msgspec import Struct

from narwhal.config.credentials import secret_problem
from narwhal.config.schema import Path, Problem
from narwhal.protocol.dialects import capabilities

if TYPE_CHECKING:
    from narwhal.config import (
        AdmissionConfig,
        ApiKeyConfig,
        EngineConfig,
        FleetConfig,
        HAConfig,
        KubernetesLabelConfig,
        ServingConfig,
        TenantConfig,
        TracingConfig,
    )

DEFAULT_TENANT = "default"  # (narwhal.config's: imported from there it would be a cycle)


def _check_serving(serving: ServingConfig) -> list[Problem]:
    path: Path = ("serving",)
    problems = _one_source(path, "admin_token", serving)
    if serving.admin_token is not None:
        problems += _secret_problems((*path, "admin_token"), serving.admin_token)
    for i, entry in enumerate(serving.api_keys):
        where: Path = (*path, "api_keys", i)
        if isinstance(entry, str):
            problems += _secret_problems(where, entry)
            continue
        problems += _one_source(where, "key", entry)
        if entry.key is None and entry.key_env is None and entry.key_file is None:
            problems.append(Problem(where, "give the key: one of key, key_env, key_file"))
        if entry.key is not None:
            problems += _secret_problems((*where, "key"), entry.key)
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
        dialect = capabilities(engine.dialect)
        if engine.scheduling_policy == "priority" and not dialect.priority_scheduling:
            problems.append(
                Problem(
                    (*path, "scheduling_policy"),
                    f"priority scheduling is vLLM's (--scheduling-policy priority); an "
                    f"engine of dialect {engine.dialect} takes fcfs",
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
    problems = [] if ha.kubernetes_label is None else _check_kubernetes_label(ha.kubernetes_label)
    if ha.backend != "etcd":
        return problems
    if not ha.endpoints:
        return [*problems, Problem(("ha", "endpoints"), "required when ha.backend is etcd")]
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


# Kubernetes' own rules (apimachinery's IsQualifiedName and IsValidLabelValue): a name of at
# most 63 characters, alphanumeric at both ends; an optional prefix that is a DNS subdomain.
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_RESERVED_PREFIXES = ("kubernetes.io", "k8s.io")
# A container's environment variable as Kubernetes has always accepted one.
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_NAME_RULE = (
    "at most 63 characters, letters, digits, '-', '_' and '.', beginning and ending with "
    "a letter or digit"
)


def _check_kubernetes_label(label: KubernetesLabelConfig) -> list[Problem]:
    path: Path = ("ha", "kubernetes_label")
    problems = []
    problem = label_key_problem(label.key)
    if problem is not None:
        problems.append(
            Problem((*path, "key"), f"{json.dumps(label.key)} is not a label key: {problem}")
        )
    if label.value and (len(label.value) > 63 or not _LABEL_NAME.match(label.value)):
        problems.append(
            Problem(
                (*path, "value"),
                f"{json.dumps(label.value)} is not a label value: empty, or {_NAME_RULE}",
            )
        )
    if not _ENV_NAME.match(label.pod_name_env):
        problems.append(
            Problem(
                (*path, "pod_name_env"),
                f"{json.dumps(label.pod_name_env)} is not an environment variable's name",
            )
        )
    return problems


def label_key_problem(key: str) -> str | None:
    """What is wrong with `key` as a Kubernetes label key, or None."""
    prefix, slash, name = key.rpartition("/")
    if slash and "/" in prefix:
        return "at most one '/', between a prefix and a name"
    if len(name) > 63 or not _LABEL_NAME.match(name):
        return f"the name (after any prefix/) must be {_NAME_RULE}"
    if slash:
        if len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix):
            return (
                "the prefix (before /) must be a DNS subdomain: lowercase letters, digits, "
                "'-' and '.', at most 253 characters"
            )
        if prefix in _RESERVED_PREFIXES:
            return f"the prefix {prefix}/ is reserved for Kubernetes' own components"
    return None


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


def _check_admission(admission: AdmissionConfig) -> list[Problem]:
    path: Path = ("admission",)
    classes = admission.classes
    problems = [
        Problem((*path, "classes", i), f"{json.dumps(name)} is listed twice")
        for i, name in enumerate(classes)
        if name in classes[:i]
    ]
    if admission.default_class is not None and admission.default_class not in classes:
        problems.append(_unknown_class((*path, "default_class"), admission.default_class, classes))
    for name in admission.reserved_prefill:
        if name not in classes:
            problems.append(_unknown_class((*path, "reserved_prefill", name), name, classes))
    reserved = sum(admission.reserved_prefill.values())
    if reserved >= admission.phase_concurrency.prefill:
        problems.append(
            Problem(
                (*path, "reserved_prefill"),
                f"reserves {reserved} prefill slots, which must leave some of "
                f"admission.phase_concurrency.prefill ({admission.phase_concurrency.prefill}) "
                "to every class",
            )
        )
    return problems


def check_tenants(
    tenants: Mapping[str, TenantConfig],
    classes: Sequence[str] | None,
    api_keys: Sequence[str | ApiKeyConfig] | None,
) -> list[Problem]:
    """Each tenant's classes among admission.classes (None: not known, unchecked), and
    every tenant a client key names declared."""
    problems: list[Problem] = []
    for name, tenant in tenants.items():
        for key in ("max_class", "default_class"):
            value = getattr(tenant, key)
            if classes is not None and value is not None and value not in classes:
                problems.append(_unknown_class(("tenants", name, key), value, classes))
        if (
            classes is not None
            and tenant.max_class is not None
            and tenant.default_class is not None
            and tenant.max_class in classes
            and tenant.default_class in classes
            and classes.index(tenant.default_class) < classes.index(tenant.max_class)
        ):
            problems.append(
                Problem(
                    ("tenants", name, "default_class"),
                    f"{tenant.default_class} is above the tenant's max_class ({tenant.max_class})",
                )
            )
    for i, entry in enumerate(api_keys or ()):
        if isinstance(entry, str) or entry.tenant is None or entry.tenant in tenants:
            continue
        if entry.tenant == DEFAULT_TENANT:
            continue
        declared = f"declared: {', '.join(tenants)}" if tenants else "none is declared"
        problems.append(
            Problem(
                ("serving", "api_keys", i, "tenant"),
                f"tenant {json.dumps(entry.tenant)} is not declared under tenants ({declared})",
            )
        )
    return problems


def _unknown_class(path: Path, name: str, classes: Sequence[str]) -> Problem:
    listed = ", ".join(classes)
    return Problem(path, f"{json.dumps(name)} is not a class (admission.classes: {listed})")


SECTION_CHECKS: dict[str, Callable[[Any], list[Problem]]] = {
    "admission": _check_admission,
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
