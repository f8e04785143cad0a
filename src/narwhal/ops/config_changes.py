"""What a reloaded configuration changes, and whether it may change it live (sans-IO).

`compare(running, new)` sets two checked configurations side by side (secrets read, as
the router holds them) and says:

- `restart`: a problem for each key that differs and cannot change while the router runs
  (the address it listens on, its certificate, the model, the admission mode, the
  priority classes and the placement policy, which decide what the router is built of,
  the tokenizer, high availability). A reload with any of them applies nothing.
- `engines`: by name, the engines added, removed, replaced (a new URL, dialect or role
  is another engine under the old name: removed, then added) and updated in place
  (wave, limits, credentials).
- `described`: one line per change, for the log and `POST /admin/reload`. Secrets are
  said to have changed, never shown.

Every other key is live: the router applies the new value as it is (`Router.reload`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from narwhal.config import Config, EngineConfig

# Keys (dotted; a section stands for everything under it) that need a restart.
RESTART_KEYS: Final = (
    "model",
    "serving.host",
    "serving.port",
    "serving.tls_cert",
    "serving.tls_key",
    "serving.workers",
    "admission.mode",
    "admission.classes",
    "fleet.policy",
    "fleet.prefix_index",
    "tokenizer",
    "ha",
)
# What makes an engine another engine: the name stays, the engine behind it does not.
IDENTITY_FIELDS: Final = ("url", "dialect", "role")
SECRET_FIELDS: Final = frozenset({"admin_token", "api_keys", "api_key"})


@dataclass(frozen=True, slots=True)
class EngineChanges:
    added: tuple[EngineConfig, ...] = ()
    removed: tuple[str, ...] = ()
    replaced: tuple[EngineConfig, ...] = ()  # the new configuration of each
    updated: tuple[EngineConfig, ...] = ()  # likewise

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.replaced or self.updated)


@dataclass(frozen=True, slots=True)
class ConfigChanges:
    restart: tuple[str, ...] = ()
    engines: EngineChanges = field(default_factory=EngineChanges)
    described: tuple[str, ...] = ()


def compare(running: Config, new: Config) -> ConfigChanges:
    restart: list[str] = []
    described: list[str] = []
    old_tree = msgspec.to_builtins(running)
    new_tree = msgspec.to_builtins(new)
    del old_tree["engines"], new_tree["engines"]
    for path, before, after in _differences(old_tree, new_tree, ()):
        key = ".".join(path)
        if any(key == k or key.startswith(f"{k}.") for k in RESTART_KEYS):
            restart.append(
                f"{key}: cannot change while the router runs (restart to change {key}; "
                "a reload applies only what can change live)"
            )
        else:
            described.append(_change(key, path[-1], before, after))
    engines = _engine_changes(running.engines, new.engines, described)
    return ConfigChanges(tuple(restart), engines, tuple(described))


def _engine_changes(
    running: tuple[EngineConfig, ...], new: tuple[EngineConfig, ...], described: list[str]
) -> EngineChanges:
    before = {e.name: e for e in running}
    after = {e.name: e for e in new}
    added = [e for e in new if e.name not in before]
    removed = [e.name for e in running if e.name not in after]
    replaced: list[EngineConfig] = []
    updated: list[EngineConfig] = []
    for engine in added:
        described.append(f"engine {engine.name} added ({_engine_view(engine)})")
    for name in removed:
        described.append(
            f"engine {name} removed: out of placement now, its requests in flight finish there"
        )
    for engine in new:
        old = before.get(engine.name)
        if old is None or old == engine:
            continue
        identity = [f for f in IDENTITY_FIELDS if getattr(old, f) != getattr(engine, f)]
        if identity:
            replaced.append(engine)
            described.append(
                f"engine {engine.name} replaced ({', '.join(identity)} changed; now "
                f"{_engine_view(engine)}): requests in flight finish on the old one"
            )
            continue
        updated.append(engine)
        old_tree, new_tree = msgspec.to_builtins(old), msgspec.to_builtins(engine)
        for path, was, now in _differences(old_tree, new_tree, ()):
            described.append(_change(f"engine {engine.name}: {'.'.join(path)}", path[-1], was, now))
    return EngineChanges(tuple(added), tuple(removed), tuple(replaced), tuple(updated))


def _engine_view(engine: EngineConfig) -> str:
    return f"{engine.url}, role {engine.role}, dialect {engine.dialect}"


def _differences(
    before: Any, after: Any, path: tuple[str, ...]
) -> Iterator[tuple[tuple[str, ...], Any, Any]]:
    """Each leaf (a value that is not a mapping) that differs, with its path."""
    if isinstance(before, dict) and isinstance(after, dict):
        for key in dict.fromkeys([*before, *after]):
            yield from _differences(before.get(key), after.get(key), (*path, key))
    elif before != after:
        yield path, before, after


def _change(shown: str, field_name: str, before: Any, after: Any) -> str:
    if field_name in SECRET_FIELDS:
        return f"{shown} changed"
    return f"{shown}: {json.dumps(before)} -> {json.dumps(after)}"
