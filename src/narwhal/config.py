"""Narwhal's configuration: one frozen, typed tree read from YAML.

Every default is declared once, on its field. Unknown keys are errors, and every error
names the key by its dotted path and says what was expected, for example
`admission.queue_limit: expected int >= 0, got "ten"`. Only reading the file is I/O here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import msgspec
import yaml
from msgspec import Meta, Struct

from narwhal.protocol.assembly import DEFAULT_MAX_RESPONSE_BYTES
from narwhal.protocol.dialects import Dialect
from narwhal.protocol.sse import DEFAULT_MAX_EVENT_BYTES

NonNegativeInt = Annotated[int, Meta(ge=0)]
PositiveInt = Annotated[int, Meta(ge=1)]
PositiveSeconds = Annotated[float, Meta(gt=0)]
Port = Annotated[int, Meta(ge=0, le=65535)]
# Below this an engine's ordinary events (a few hundred bytes, a usage chunk) would not fit.
ByteLimit = Annotated[int, Meta(ge=4096)]
Name = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]

Role = Literal["prefill", "decode", "both"]


class ServingConfig(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    host: str = "127.0.0.1"
    port: Port = 8000
    max_request_bytes: PositiveInt = 1_048_576
    max_retained: PositiveInt = 4096
    request_timeout_s: PositiveSeconds = 600.0
    admin_token: str | None = None
    # How long admitted requests may run on after SIGTERM before the router exits.
    drain_timeout_s: PositiveSeconds = 30.0


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
    # How to choose among eligible engines: by load (Narwhal's own in-flight work corrected
    # by the engines' metrics; projected TTFT in predictive mode), by load with the
    # prompt tokens each engine has in its prefix cache priced off (cache_aware), or round
    # robin (for comparison; what simple proxies do).
    policy: Literal["load", "round_robin", "cache_aware"] = "load"
    prefix_index: PrefixIndexConfig = PrefixIndexConfig()
    # The longest SSE event taken from an engine (its bytes, blank line included), and what
    # an unfinished one may hold: past it the attempt fails. Null: `Config.max_event_bytes`.
    max_event_bytes: ByteLimit | None = None
    # What a non-streaming answer may be assembled from: its events' data, in bytes (it is
    # held whole until the end). Null: `Config.max_response_bytes`.
    max_response_bytes: ByteLimit | None = None


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


class Config(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    model: Annotated[str, Meta(min_length=1)]
    engines: tuple[EngineConfig, ...]
    serving: ServingConfig = ServingConfig()
    admission: AdmissionConfig = AdmissionConfig()
    tokenizer: str | None = None
    fleet: FleetConfig = FleetConfig()
    ha: HAConfig = HAConfig()

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


class ConfigError(ValueError):
    """A configuration that cannot be used; str() names the key and the reason."""


def load_config(path: str) -> Config:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from e
    return parse_config(text)


def parse_config(text: str) -> Config:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"invalid YAML: {e}") from e
    return config_from_mapping(raw)


def config_from_mapping(raw: object) -> Config:
    if not isinstance(raw, dict):
        raise ConfigError("the configuration must be a mapping of keys (model, engines, ...)")
    try:
        config = msgspec.convert(raw, Config, strict=True)
    except msgspec.ValidationError as e:
        raise ConfigError(_explain(e, raw)) from None
    _check_combinations(config)
    return config


def config_to_builtins(config: Config) -> dict[str, Any]:
    """The configuration as plain data, with the defaults derived from other keys resolved
    (what the router will use, not null)."""
    result: dict[str, Any] = msgspec.to_builtins(config)
    result["fleet"]["max_event_bytes"] = config.max_event_bytes
    result["fleet"]["max_response_bytes"] = config.max_response_bytes
    if config.ha.backend == "etcd":
        result["ha"]["renew_interval_s"] = config.ha.renew_interval
        result["ha"]["fence_margin_s"] = config.ha.margin
    return result


def _check_combinations(config: Config) -> None:
    """Refuse what types cannot express: duplicate names, bad URLs, a half PD fleet."""
    seen: set[str] = set()
    for i, engine in enumerate(config.engines):
        if engine.name in seen:
            raise ConfigError(f"engines.{i}.name: duplicate engine name {json.dumps(engine.name)}")
        seen.add(engine.name)
        url = urlsplit(engine.url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ConfigError(
                f"engines.{i}.url: expected an http:// or https:// URL, "
                f"got {json.dumps(engine.url)}"
            )
    roles = {engine.role for engine in config.engines}
    if "prefill" in roles and "decode" not in roles:
        raise ConfigError("engines: prefill engines need at least one decode engine")
    if "decode" in roles and "prefill" not in roles:
        raise ConfigError("engines: decode engines need at least one prefill engine")
    if config.fleet.stale_after_s < config.fleet.probe_interval_s:
        raise ConfigError(
            "fleet.stale_after_s: must be at least fleet.probe_interval_s "
            f"({config.fleet.probe_interval_s}), got {config.fleet.stale_after_s}"
        )
    _check_ha(config.ha)


def _check_ha(ha: HAConfig) -> None:
    if ha.backend != "etcd":
        return
    if not ha.endpoints:
        raise ConfigError("ha.endpoints: required when ha.backend is etcd")
    for i, endpoint in enumerate(ha.endpoints):
        url = urlsplit(endpoint)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ConfigError(
                f"ha.endpoints.{i}: expected an http:// or https:// URL of an etcd client "
                f"port, got {json.dumps(endpoint)}"
            )
    if ha.margin >= ha.lease_ttl_s:
        raise ConfigError(
            f"ha.fence_margin_s: must be below ha.lease_ttl_s ({ha.lease_ttl_s}), got {ha.margin:g}"
        )
    if ha.renew_interval >= ha.lease_ttl_s - ha.margin:
        raise ConfigError(
            "ha.renew_interval_s: must be below ha.lease_ttl_s - ha.fence_margin_s "
            f"({ha.lease_ttl_s - ha.margin:g} s), so that a renewal comes before the leader "
            f"fences itself; got {ha.renew_interval:g}"
        )


# --- turning msgspec's validation errors into messages that name the key --------------------


def _explain(error: msgspec.ValidationError, raw: object) -> str:
    message = str(error)
    text, _, where = message.partition(" - at `$")
    path = _parse_path(where.rstrip("`")) if where else []
    dotted = ".".join(str(p) for p in path)
    if text.startswith("Object contains unknown field"):
        key = text.split("`")[1]
        full = f"{dotted}.{key}" if dotted else key
        allowed = _field_names(path)
        hint = f" (expected one of: {', '.join(allowed)})" if allowed else ""
        return f"{full}: unknown key{hint}"
    if text.startswith("Object missing required field"):
        key = text.split("`")[1]
        full = f"{dotted}.{key}" if dotted else key
        return f"{full}: required key missing"
    expected = _describe(_type_at(path))
    got = _lookup(raw, path)
    return f"{dotted or '(top level)'}: expected {expected}, got {_show(got)}"


def _parse_path(where: str) -> list[str | int]:
    """`.admission.queue_limit` or `.engines[0].url` -> ["admission", "queue_limit"] etc."""
    parts: list[str | int] = []
    for piece in where.replace("[", ".[").split("."):
        if not piece:
            continue
        if piece.startswith("[") and piece.endswith("]"):
            parts.append(int(piece[1:-1]))
        else:
            parts.append(piece)
    return parts


def _type_at(path: Sequence[str | int]) -> msgspec.inspect.Type:
    node: msgspec.inspect.Type = msgspec.inspect.type_info(Config)
    for part in path:
        node = _unwrap(node)
        if isinstance(node, msgspec.inspect.StructType) and isinstance(part, str):
            fields = {f.encode_name: f.type for f in node.fields}
            node = fields.get(part, msgspec.inspect.AnyType())
        elif isinstance(node, msgspec.inspect.VarTupleType | msgspec.inspect.ListType):
            node = node.item_type
        else:
            return msgspec.inspect.AnyType()
    return node


def _unwrap(node: msgspec.inspect.Type) -> msgspec.inspect.Type:
    if isinstance(node, msgspec.inspect.UnionType):
        rest = [t for t in node.types if not isinstance(t, msgspec.inspect.NoneType)]
        if len(rest) == 1:
            return rest[0]
    return node


def _field_names(path: Sequence[str | int]) -> list[str]:
    node = _unwrap(_type_at(path))
    if isinstance(node, msgspec.inspect.StructType):
        return [f.encode_name for f in node.fields]
    return []


def _describe(node: msgspec.inspect.Type) -> str:
    if isinstance(node, msgspec.inspect.UnionType):
        parts = [_describe(t) for t in node.types]
        return " or ".join(parts)
    if isinstance(node, msgspec.inspect.NoneType):
        return "null"
    if isinstance(node, msgspec.inspect.BoolType):
        return "true or false"
    if isinstance(node, msgspec.inspect.IntType):
        return "int" + _bounds(node.ge, node.gt, node.le, node.lt)
    if isinstance(node, msgspec.inspect.FloatType):
        return "number" + _bounds(node.ge, node.gt, node.le, node.lt)
    if isinstance(node, msgspec.inspect.StrType):
        return "string" + (f" of at least {node.min_length} chars" if node.min_length else "")
    if isinstance(node, msgspec.inspect.LiteralType):
        return "one of " + ", ".join(json.dumps(v) for v in node.values)
    if isinstance(node, msgspec.inspect.StructType):
        return "a mapping"
    if isinstance(node, msgspec.inspect.VarTupleType | msgspec.inspect.ListType):
        return "a list"
    return "a valid value"


def _bounds(ge: float | None, gt: float | None, le: float | None, lt: float | None) -> str:
    parts = []
    if ge is not None:
        parts.append(f">= {ge}")
    if gt is not None:
        parts.append(f"> {gt}")
    if le is not None:
        parts.append(f"<= {le}")
    if lt is not None:
        parts.append(f"< {lt}")
    return (" " + " and ".join(parts)) if parts else ""


def _lookup(raw: object, path: Sequence[str | int]) -> object:
    node = raw
    for part in path:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            return None
    return node


def _show(value: object) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return json.dumps(value, default=str)
