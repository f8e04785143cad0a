"""Reading the secrets a configuration names (sans-IO but for the files and environment
they name): `resolve_secrets` puts each into its inline key, as every component reads it,
and names every one that cannot be read."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec
from msgspec import Struct

from narwhal.config import DEFAULT_TENANT, ApiKeyConfig, Config, ConfigError
from narwhal.config.credentials import SecretError, from_env, from_file, key_list_from_file
from narwhal.config.schema import Path, Problem


def _keys_of_two_tenants(api_keys: tuple[str | ApiKeyConfig, ...]) -> list[Problem]:
    """A key given twice for two tenants (inline, or read from where it is named): whose
    requests it carries could not be told."""
    owners: dict[str, tuple[int, str]] = {}
    problems: list[Problem] = []
    for i, entry in enumerate(api_keys):
        key = entry if isinstance(entry, str) else entry.key
        if key is None:
            continue
        tenant = DEFAULT_TENANT if isinstance(entry, str) else entry.tenant or DEFAULT_TENANT
        first = owners.setdefault(key, (i, tenant))
        if first[1] != tenant:
            problems.append(
                Problem(
                    ("serving", "api_keys", i),
                    f"the same key as serving.api_keys.{first[0]}, which is tenant "
                    f"{first[1]}'s, names tenant {tenant}: give each tenant keys of its own",
                )
            )
    return problems


def resolve_secrets(config: Config, environ: Mapping[str, str]) -> Config:
    """`config` with every secret it names read into its inline key (`admin_token`,
    `api_keys`, each engine's `api_key`) and the `_env`/`_file` keys that named them
    cleared; ConfigError lists every secret that cannot be read."""
    problems: list[Problem] = []

    def read(path: Path, key: str, section: Struct) -> str | None:
        """The secret `key` of `section` (at `path`), from wherever it is given."""
        env, file = getattr(section, f"{key}_env"), getattr(section, f"{key}_file")
        try:
            if env is not None:
                return from_env(env, environ)
            if file is not None:
                return from_file(file)
        except SecretError as e:
            source = f"{key}_env" if env is not None else f"{key}_file"
            problems.append(Problem((*path, source), str(e)))
        inline: str | None = getattr(section, key)
        return inline

    serving = config.serving
    admin_token = read(("serving",), "admin_token", serving)
    api_keys: tuple[str | ApiKeyConfig, ...] = tuple(
        entry
        if isinstance(entry, str)
        else msgspec.structs.replace(
            entry,
            key=read(("serving", "api_keys", i), "key", entry),
            key_env=None,
            key_file=None,
        )
        for i, entry in enumerate(serving.api_keys)
    )
    if serving.api_keys_file is not None:
        try:
            from_file_keys = key_list_from_file(serving.api_keys_file)
        except SecretError as e:
            problems.append(Problem(("serving", "api_keys_file"), str(e)))
        else:
            api_keys = tuple(dict.fromkeys((*api_keys, *from_file_keys)))
    problems += _keys_of_two_tenants(api_keys)
    serving = msgspec.structs.replace(
        serving,
        admin_token=admin_token,
        admin_token_env=None,
        admin_token_file=None,
        api_keys=api_keys,
        api_keys_file=None,
    )
    engines = tuple(
        msgspec.structs.replace(
            engine,
            api_key=read(("engines", i), "api_key", engine),
            api_key_env=None,
            api_key_file=None,
        )
        for i, engine in enumerate(config.engines)
    )
    if problems:
        raise ConfigError(*(str(p) for p in problems))
    return msgspec.structs.replace(config, serving=serving, engines=engines)
