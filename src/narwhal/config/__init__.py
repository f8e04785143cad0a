"""Narwhal's configuration: one frozen, typed tree read from YAML.

Every default is declared once, on its field. Unknown keys are errors, and every error
names the key by its dotted path and says what was expected, for example
`admission.queue_limit: expected int >= 0, got "ten"`; a file is checked whole, and
`ConfigError` holds every problem found (`schema.py` for types, `checks.py` for what
types cannot say). I/O here is reading the file and the secrets it names
(`resolve_secrets`: environment variables and files, `credentials.py`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import msgspec
import yaml
from msgspec import Meta, Struct

from narwhal.config.checks import SECTION_CHECKS, check_engines, check_tenants, url_problems
from narwhal.config.schema import type_problems
from narwhal.protocol.assembly import DEFAULT_MAX_RESPONSE_BYTES
from narwhal.protocol.dialects import Dialect
from narwhal.protocol.sse import DEFAULT_MAX_EVENT_BYTES

NonNegativeInt = Annotated[int, Meta(ge=0)]
PositiveInt = Annotated[int, Meta(ge=1)]
PositiveSeconds = Annotated[float, Meta(gt=0)]
NonNegativeSeconds = Annotated[float, Meta(ge=0)]
Port = Annotated[int, Meta(ge=0, le=65535)]
# Below this an engine's ordinary events (a few hundred bytes, a usage chunk) would not fit.
ByteLimit = Annotated[int, Meta(ge=4096)]
Name = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
NonEmpty = Annotated[str, Meta(min_length=1)]

Role = Literal["prefill", "decode", "both"]
REDACTED = "<redacted>"
# The tenant of a request whose key names none, and of every request without client keys.
DEFAULT_TENANT = "default"
DEFAULT_CLASSES = ("critical", "standard", "sheddable")


class ApiKeyConfig(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A client key that names its tenant: inline, or an environment variable's or a
    file's (at most one of the three)."""

    key: NonEmpty | None = None
    key_env: NonEmpty | None = None
    key_file: NonEmpty | None = None
    tenant: Name | None = None  # declared under `tenants:`; null: the default tenant


class TenantConfig(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One tenant's share and limits (`narwhal.admission.tenants`)."""

    # Its fair share within a class, against the other tenants' weights, in tokens of work.
    weight: Annotated[float, Meta(gt=0, le=1_000_000)] = 1.0
    # The highest class its requests may choose (X-Narwhal-Priority is clamped to it);
    # null: the highest there is.
    max_class: Name | None = None
    # Its requests' class without the header; null: admission.default_class.
    default_class: Name | None = None
    # Token buckets holding a minute's worth: past them 429 tenant_quota_exceeded.
    requests_per_min: Annotated[float, Meta(gt=0)] | None = None
    tokens_per_min: Annotated[float, Meta(gt=0)] | None = None


class ServingConfig(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    host: str = "127.0.0.1"
    port: Port = 8000
    max_request_bytes: PositiveInt = 1_048_576
    max_retained: PositiveInt = 4096
    request_timeout_s: PositiveSeconds = 600.0
    # The bearer token of the admin routes: inline, or (to keep it out of the file) the
    # name of an environment variable or a file holding it; at most one of the three.
    admin_token: NonEmpty | None = None
    admin_token_env: NonEmpty | None = None
    admin_token_file: NonEmpty | None = None
    # Client bearer tokens for /v1/*: these, plus a file's (one a line, `#` comments).
    # None of either: no client authentication. A key written as a mapping may name its
    # tenant ({key_env: TEAM_A_KEY, tenant: team-a}); the others are the default tenant's.
    api_keys: tuple[NonEmpty | ApiKeyConfig, ...] = ()
    api_keys_file: NonEmpty | None = None
    # HTTPS to clients: a PEM certificate chain and its private key, both or neither.
    tls_cert: NonEmpty | None = None
    tls_key: NonEmpty | None = None
    # After SIGTERM (`shutdown.py`): how long /ready answers 503 shutting_down while the
    # listener stays open, so that load balancers stop sending before connections are
    # refused; then how long admitted requests may run on before the router ends them.
    shutdown_delay_s: NonNegativeSeconds = 5.0
    drain_timeout_s: PositiveSeconds = 30.0
    # Relay worker processes under one decision process (Step 16, `narwhal.supervisor`):
    # above 1, N processes share the client port and do the per-byte work, and one
    # decision process decides for all of them.
    workers: PositiveInt = 1


class PhaseConcurrency(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    prefill: PositiveInt = 64
    decode: PositiveInt = 1024


class EnginePhaseConcurrency(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Per-engine slot limits; an absent limit leaves only the global one."""

    prefill: PositiveInt | None = None
    decode: PositiveInt | None = None


class AdmissionConfig(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    mode: Literal["predictive", "open"] = "predictive"
    ttft_target_s: PositiveSeconds = 2.0
    # Optional: engines whose TPOT would exceed it score worse for new decode work.
    tpot_target_s: PositiveSeconds | None = None
    queue_limit: NonNegativeInt = 1024
    wait_timeout_s: PositiveSeconds = 30.0
    phase_concurrency: PhaseConcurrency = PhaseConcurrency()
    # Predictive, without `tokenizer:`: how long a decision that the estimate's error could
    # flip waits for an engine's own count (then it is taken on the estimate); 0: never.
    sizing_wait_s: NonNegativeSeconds = 0.02
    # Priority classes, highest first, chosen by the X-Narwhal-Priority header
    # (`narwhal.admission.classes`).
    classes: Annotated[tuple[Name, ...], Meta(min_length=1, max_length=16)] = DEFAULT_CLASSES
    # The class of a request without the header whose tenant names none; null: standard
    # when it is a class, else the lowest.
    default_class: Name | None = None
    # Each class below the highest is admitted only while its projected first token fits
    # this much less of the budget than the class above it: under overload the lower
    # classes are refused first and the higher keep their budget.
    class_headroom: Annotated[float, Meta(ge=0, le=0.5)] = 0.25
    # A queued request rises one class for every this many seconds it has waited (the
    # starvation guard); null: never.
    class_aging_s: PositiveSeconds | None = 10.0
    # Prefill slots (of phase_concurrency.prefill) that only a class or a higher one may
    # take, by class.
    reserved_prefill: dict[Name, PositiveInt] = msgspec.field(default_factory=dict)

    @property
    def default_class_name(self) -> str:
        if self.default_class is not None:
            return self.default_class
        return "standard" if "standard" in self.classes else self.classes[-1]


class EngineConfig(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    name: Name
    url: str
    dialect: Dialect = "vllm"
    role: Role = "both"
    wave: NonNegativeInt | None = None
    phase_concurrency: EnginePhaseConcurrency = EnginePhaseConcurrency()
    # The engine's own prefill token budget per step (vLLM --max-num-batched-tokens,
    # SGLang --chunked-prefill-size): predictive admission follows its steps with it.
    max_num_batched_tokens: Annotated[int, Meta(ge=16)] = 8192
    # Its sequence slots (vLLM --max-num-seqs): past them a prefill waits for a decode.
    max_num_seqs: PositiveInt = 256
    # vLLM --scheduling-policy: with `priority` each request's class goes to the engine as
    # its `priority` field (0 for the highest), which vLLM schedules by.
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    # Sent as `Authorization: Bearer <key>` on every request to this engine (vLLM and
    # SGLang --api-key): inline, or an environment variable's or a file's; at most one.
    api_key: NonEmpty | None = None
    api_key_env: NonEmpty | None = None
    api_key_file: NonEmpty | None = None
    # Null: `fleet.forward_client_authorization`.
    forward_client_authorization: bool | None = None

    @property
    def authorization(self) -> str | None:
        """The Authorization header of every request to this engine (None: it has no key;
        `resolve_secrets` reads one given by `api_key_env` or `api_key_file`)."""
        return None if self.api_key is None else f"Bearer {self.api_key}"


class PrefixIndexConfig(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """What cache-aware placement remembers of each engine's prefix cache
    (`scheduler/prefix_cache.py`)."""

    # Characters of canonical prompt text a block: about vLLM's 16-token block at the
    # usual 4 characters a token. Smaller finds shorter shared prefixes, at more hashing.
    block_chars: Annotated[int, Meta(ge=8, le=4096)] = 64
    # The hard cap an engine, whatever its KV cache: about 126 bytes a block, so the
    # default holds 32 MiB an engine at most (16M prompt characters, 4M tokens).
    max_blocks: NonNegativeInt = 262_144
    # An engine's index is forgotten when Narwhal's predicted hit ratio there exceeds
    # the engine's own (vLLM's prefix-cache counters) by more than this, for this long.
    drift_threshold: Annotated[float, Meta(gt=0, le=1)] = 0.25
    forget_after_s: PositiveSeconds = 60.0


class FleetConfig(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    probe_interval_s: PositiveSeconds = 1.0
    stale_after_s: PositiveSeconds = 5.0
    # Generous: a busy engine answers /health late, and a false "down" refuses real work.
    probe_timeout_s: PositiveSeconds = 2.0
    max_attempts: PositiveInt = 2
    # How long an engine that took a request may take to its first event before the
    # attempt is abandoned and the request placed elsewhere (engines/timeouts.py). Null:
    # derived per attempt from the projected TTFT, else the engine's observed first-event
    # times, else 30 s; always within the request's deadline.
    first_event_timeout_s: PositiveSeconds | None = None
    # After the first event, the longest silence (no byte at all) from an engine: past it
    # a stream ends with an error event, a non-streaming attempt fails.
    idle_timeout_s: PositiveSeconds = 60.0
    # How to choose among eligible engines: by load (Narwhal's own in-flight work corrected
    # by the engines' metrics; projected TTFT in predictive mode), by load with the
    # prompt tokens each engine has in its prefix cache priced off (cache_aware), or round
    # robin (for comparison; what simple proxies do).
    policy: Literal["load", "round_robin", "cache_aware"] = "load"
    prefix_index: PrefixIndexConfig = PrefixIndexConfig()
    # The longest SSE event taken from an engine (its bytes, blank line included, with the
    # lines of no event since the one before), and what an unfinished one may hold: past
    # it the attempt fails. Null: `Config.max_event_bytes`.
    max_event_bytes: ByteLimit | None = None
    # What a non-streaming answer may be assembled from: its events' data, in bytes (it is
    # held whole until the end). Null: `Config.max_response_bytes`.
    max_response_bytes: ByteLimit | None = None
    # The longest answer read from an engine outside the request relay: /health, /metrics,
    # /v1/models, /version, /tokenize. Far above any real one (a vLLM /metrics page is tens
    # of KB); past it that probe fails, without reading on (fleet/answers.py).
    max_probe_answer_bytes: ByteLimit = 8 * 1024 * 1024
    # Whether a client's own Authorization header goes to the engines with its request (in
    # place of the engine's api_key): for engines that check per-user keys themselves.
    # Probes always carry the engine's api_key. Per engine: engines[].forward_client_...
    forward_client_authorization: bool = False
    # Profiling probes' prompt lengths, in the engine's own tokens (at least two; more
    # than one length, so that a prefill slope can be fitted). Null: 64, 512, 2048, 64.
    # Either way scaled down together to fit each engine's max_model_len.
    probe_prompt_tokens: (
        Annotated[tuple[Annotated[int, Meta(ge=1, le=1_048_576)], ...], Meta(min_length=2)] | None
    ) = None


class KubernetesLabelConfig(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """On Kubernetes: the label the leader keeps on its own pod, which the clients' Service
    selects, so that every healthy pod can be ready (`ha/pod_label.py`,
    deploy/kubernetes). The label steers traffic only: a standby still refuses with 503."""

    # A Kubernetes label key ([prefix/]name) and value; the Service's selector names both.
    key: NonEmpty = "narwhal.io/leader"
    value: str = "true"
    # The environment variable holding the pod's name (the downward API's metadata.name).
    pod_name_env: NonEmpty = "POD_NAME"
    # controller.kubernetes.io/pod-deletion-cost on the leader's pod, so that a ReplicaSet
    # scaling down (a rollout's old one, `kubectl scale`) removes standbys first; null: not set.
    deletion_cost: Annotated[int, Meta(ge=-(2**31), le=2**31 - 1)] | None = 1000
    # The pod's ServiceAccount (token, ca.crt, namespace): where Kubernetes mounts it, or
    # a projected volume's mount path.
    service_account_dir: NonEmpty = "/var/run/secrets/kubernetes.io/serviceaccount"


class HAConfig(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One active router per fleet, elected through an etcd lease (`ha/election.py`)."""

    backend: Literal["none", "etcd"] = "none"
    endpoints: tuple[str, ...] = ()  # etcd client URLs, members of one cluster
    # The leader key; drains and maintenance waves live under "<key>/".
    key: Annotated[str, Meta(min_length=1)] = "/narwhal/leader"
    # etcd leases are whole seconds; a standby takes over within ttl + one renewal.
    lease_ttl_s: PositiveInt = 3
    # Defaults: a third of the TTL (at least 0.6 s) and a tenth of it (at least 0.1 s).
    renew_interval_s: PositiveSeconds | None = None
    fence_margin_s: PositiveSeconds | None = None
    # How this router names itself in the leader key's value (default: host:pid).
    id: str | None = None
    # On Kubernetes, the leader labels its own pod for the clients' Service; null: off.
    kubernetes_label: KubernetesLabelConfig | None = None

    @property
    def renew_interval(self) -> float:
        """etcd deletes an expired lease's keys in a sweep every 500 ms, so a standby can
        win up to ttl + 0.5 s after the leader's last renewal; renewing no more often than
        every 0.6 s keeps the takeover within ttl + one renewal interval at every TTL."""
        return self.renew_interval_s or max(self.lease_ttl_s / 3, 0.6)

    @property
    def margin(self) -> float:
        """How long before the lease could expire at etcd the leader fences itself."""
        return self.fence_margin_s or max(0.1, self.lease_ttl_s / 10)


class LoggingConfig(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """What the router logs, and how (`logs.py`); `narwhal serve --log-format`,
    `--log-level` and `--no-access-log` override these keys."""

    # text: a line for people; json: one JSON object a line (ts, level, logger, message).
    format: Literal["text", "json"] = "text"
    level: Literal["debug", "info", "warning", "error"] = "info"
    # One line per completion request at INFO on the `narwhal.access` logger: its id,
    # route, status, outcome, engines, token counts, TTFT and duration (never its text).
    access_log: bool = True


class TracingConfig(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The router's own OpenTelemetry spans (`otel.py`; `pip install '.[otel]'`). A client's
    valid W3C traceparent goes to the engines whether or not this is set."""

    # An OTLP/HTTP collector: its traces URL (http://host:4318/v1/traces), or its base URL
    # (http://host:4318), to which /v1/traces is added. Null: the router records no spans.
    otlp_endpoint: NonEmpty | None = None
    service_name: Name = "narwhal"

    @property
    def traces_url(self) -> str | None:
        """Where spans are posted: `otlp_endpoint`, with /v1/traces when it has no path."""
        endpoint = self.otlp_endpoint
        if endpoint is None or urlsplit(endpoint).path.strip("/"):
            return endpoint
        return endpoint.rstrip("/") + "/v1/traces"


class Config(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    model: Annotated[str, Meta(min_length=1)]
    engines: tuple[EngineConfig, ...]
    serving: ServingConfig = ServingConfig()
    admission: AdmissionConfig = AdmissionConfig()
    tokenizer: str | None = None
    fleet: FleetConfig = FleetConfig()
    ha: HAConfig = HAConfig()
    logging: LoggingConfig = LoggingConfig()
    tracing: TracingConfig = TracingConfig()
    # Declared tenants, by name (metric labels stay bounded); `default` may be declared
    # too, to give the default tenant its limits.
    tenants: dict[Name, TenantConfig] = msgspec.field(default_factory=dict)

    @property
    def client_keys(self) -> tuple[tuple[str, str], ...]:
        """Each client key with its tenant (secrets read: `resolve_secrets`)."""
        keys: list[tuple[str, str]] = []
        for entry in self.serving.api_keys:
            if isinstance(entry, str):
                keys.append((entry, DEFAULT_TENANT))
            elif entry.key is not None:
                keys.append((entry.key, entry.tenant or DEFAULT_TENANT))
        return tuple(keys)

    @property
    def max_event_bytes(self) -> int:
        """`fleet.max_event_bytes`, or by default 8 MiB, or 8 bytes a byte of
        `serving.max_request_bytes` when that is more: vLLM's first chunk carries the
        prompt's token IDs (Narwhal always asks for them), at most one a byte of prompt
        and up to 7 bytes each, so the largest real event grows with the request."""
        configured = self.fleet.max_event_bytes
        if configured is not None:
            return configured
        return max(DEFAULT_MAX_EVENT_BYTES, 8 * self.serving.max_request_bytes)

    @property
    def max_response_bytes(self) -> int:
        """`fleet.max_response_bytes`, or by default 64 MiB, or twice the event limit when
        that is more (an answer may hold one largest event and as much again)."""
        configured = self.fleet.max_response_bytes
        if configured is not None:
            return configured
        return max(DEFAULT_MAX_RESPONSE_BYTES, 2 * self.max_event_bytes)

    def forwards_client_authorization(self, engine: EngineConfig) -> bool:
        """Whether the client's Authorization header goes to `engine` with its request."""
        own = engine.forward_client_authorization
        return self.fleet.forward_client_authorization if own is None else own


class ConfigError(ValueError):
    """A configuration that cannot be used: `problems` holds every one found, each naming
    its key and the reason (str() is one a line)."""

    def __init__(self, *problems: str) -> None:
        super().__init__("\n".join(problems))
        self.problems: tuple[str, ...] = problems


def load_config(path: str, environ: Mapping[str, str] | None = None) -> Config:
    """The configuration in the file at `path`, with the secrets it names read (from
    `environ`, by default this process's environment, and from their files)."""
    return resolve_secrets(read_config(path), os.environ if environ is None else environ)


def read_config(path: str) -> Config:
    """The configuration in the file at `path` as written: secrets named by `_env` or
    `_file` keys are not read yet (`resolve_secrets`)."""
    return parse_config(_read_text(path), source=path)


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text: {e.reason} at byte {e.start}") from e


def config_as_written(path: str, running: Config) -> Config:
    """What the file at `path` says of each top-level key, as far as that key can be read,
    whatever is wrong elsewhere: a key that is well typed on its own is converted alone (as
    the whole file would convert it), one the file leaves out takes its default, and one
    that cannot be read, and the engines, keep `running`'s. Unchecked, secrets unread: a
    reload refused for the file's problems still names the restart-only keys it changes.
    `running` itself when the file cannot be read or parsed as a mapping."""
    try:
        raw = yaml.safe_load(_read_text(path))
    except (ConfigError, yaml.YAMLError):
        return running
    if not isinstance(raw, dict):
        return running
    sections: dict[str, Any] = {}
    for field in msgspec.structs.fields(Config):
        name = field.encode_name
        if name in ("engines", "model") and name not in raw:
            continue  # required: the file's problems say it is missing
        if name not in raw:
            sections[field.name] = (
                field.default_factory() if field.default is msgspec.NODEFAULT else field.default
            )
            continue
        try:
            sections[field.name] = msgspec.convert(raw[name], field.type, strict=True)
        except msgspec.ValidationError:
            continue
    sections.pop("engines", None)
    return msgspec.structs.replace(running, **sections)


def parse_config(text: str, *, source: str = "the configuration") -> Config:
    """`source`: what the text is, for a YAML error's message (the file's path)."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(_yaml_error(source, e)) from e
    return config_from_mapping(raw)


def _yaml_error(source: str, error: yaml.YAMLError) -> str:
    """`FILE:LINE:COLUMN: invalid YAML: what` for the place the parser gave up, as
    editors and CI annotations read it; the parser's own text when it names no place."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None)
    if mark is None or problem is None:
        return f"{source}: invalid YAML: {error}"
    where = f"{source}:{mark.line + 1}:{mark.column + 1}"
    context = getattr(error, "context", None)
    context_mark = getattr(error, "context_mark", None)
    opened = ""
    if context is not None and context_mark is not None:
        opened = f" ({context} at line {context_mark.line + 1}, column {context_mark.column + 1})"
    return f"{where}: invalid YAML: {problem}{opened}"


def config_from_mapping(raw: object) -> Config:
    """The typed tree, or ConfigError with every problem: wrong types first, then what
    types cannot express (each section's checks run once that section is well typed, and
    each engine's once that engine is)."""
    if not isinstance(raw, dict):
        raise ConfigError("the configuration must be a mapping of keys (model, engines, ...)")
    problems = type_problems(raw, Config)
    broken = {p.path[:1] for p in problems} | {p.path[:2] for p in problems}
    for name, check in SECTION_CHECKS.items():
        if name in raw and (name,) not in broken:
            section = msgspec.convert(raw[name], _FIELD_TYPES[name], strict=True)
            problems += check(section)
    tenants = raw.get("tenants")
    if isinstance(tenants, dict) and ("tenants",) not in broken:
        admission = raw.get("admission")
        classes: Any = DEFAULT_CLASSES
        if isinstance(admission, dict) and "classes" in admission:
            classes = admission["classes"] if ("admission",) not in broken else None
        serving = raw.get("serving")
        keys = None
        if isinstance(serving, dict) and ("serving",) not in broken:
            keys = msgspec.convert(serving, ServingConfig, strict=True).api_keys
        typed_tenants = msgspec.convert(tenants, _FIELD_TYPES["tenants"], strict=True)
        problems += check_tenants(typed_tenants, classes, keys)
    elif (
        "tenants" not in raw and isinstance(raw.get("serving"), dict) and ("serving",) not in broken
    ):
        keys = msgspec.convert(raw["serving"], ServingConfig, strict=True).api_keys
        problems += check_tenants({}, None, keys)
    engines = raw.get("engines")
    if isinstance(engines, list):
        typed = [
            (i, msgspec.convert(item, EngineConfig, strict=True))
            for i, item in enumerate(engines)
            if ("engines", i) not in broken
        ]
        problems += check_engines(typed, whole=("engines",) not in broken)
        # An engine with another problem still has its URL checked, when that is a string:
        # one run of check-config names everything to fix in it.
        wrong = {p.path for p in problems}
        for i, item in enumerate(engines):
            if ("engines", i) in broken and isinstance(item, dict):
                url = item.get("url")
                if isinstance(url, str) and ("engines", i, "url") not in wrong:
                    problems += url_problems(("engines", i, "url"), url)
    if problems:
        raise ConfigError(*(str(p) for p in problems))
    return msgspec.convert(raw, Config, strict=True)


def config_to_builtins(config: Config) -> dict[str, Any]:
    """The configuration as plain data, with the defaults derived from other keys resolved
    (what the router will use, not null) and every secret written in it shown as
    "<redacted>" (the `_env` and `_file` keys that name the others are shown as they are)."""
    result: dict[str, Any] = msgspec.to_builtins(config)
    result["fleet"]["max_event_bytes"] = config.max_event_bytes
    result["fleet"]["max_response_bytes"] = config.max_response_bytes
    if config.ha.backend == "etcd":
        result["ha"]["renew_interval_s"] = config.ha.renew_interval
        result["ha"]["fence_margin_s"] = config.ha.margin
    serving = result["serving"]
    if serving["admin_token"] is not None:
        serving["admin_token"] = REDACTED
    serving["api_keys"] = [
        REDACTED if isinstance(entry, str) else _redacted_key(entry)
        for entry in serving["api_keys"]
    ]
    for engine in result["engines"]:
        if engine["api_key"] is not None:
            engine["api_key"] = REDACTED
    return result


def _redacted_key(entry: dict[str, Any]) -> dict[str, Any]:
    if entry.get("key") is not None:
        entry["key"] = REDACTED
    return entry


_FIELD_TYPES: dict[str, Any] = {f.encode_name: f.type for f in msgspec.structs.fields(Config)}


def section_problems(name: str, section: Struct) -> list[str]:
    """What the checks of section `name` find in `section` when its values come from
    elsewhere than the file (command-line flags), one problem a string."""
    check = SECTION_CHECKS.get(name)
    return [] if check is None else [str(p) for p in check(section)]


# Reading the secrets the configuration names (`secrets.py`): below everything it reads.
from narwhal.config.secrets import resolve_secrets as resolve_secrets  # noqa: E402
