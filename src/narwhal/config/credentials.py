"""Reading the secrets a configuration names: environment variables and files.

A secret (the admin token, an engine's `api_key`) may be written in the configuration
itself or, to keep it out of the file, named there: `..._env: NAME` reads the environment
variable NAME, `..._file: PATH` reads a file (as Kubernetes mounts a Secret; surrounding
whitespace, such as the trailing newline `echo` leaves, is dropped). A file of client keys
holds one key a line; blank lines and lines starting with `#` are skipped. Relative paths
are read from the working directory, like every path given to the command line.

Every secret goes into an `Authorization: Bearer` header, so it must be a bearer token:
printable ASCII without spaces. Messages never quote a secret's value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

_BEARER_TOKEN: Final = re.compile(r"[\x21-\x7e]+")


class SecretError(ValueError):
    """A secret that cannot be had; str() says why, without its value."""


def secret_problem(value: str) -> str | None:
    """Why `value` cannot be a bearer token, or None when it can."""
    if _BEARER_TOKEN.fullmatch(value):
        return None
    return "must be printable ASCII without spaces (it is sent as a bearer token)"


def from_env(name: str, environ: Mapping[str, str]) -> str:
    value = environ.get(name)
    if value is None:
        raise SecretError(f"environment variable {name} is not set")
    value = value.strip()
    if not value:
        raise SecretError(f"environment variable {name} is empty")
    _check(value, f"environment variable {name}")
    return value


def from_file(path: str) -> str:
    value = _read(path).strip()
    if not value:
        raise SecretError(f"{path} is empty")
    _check(value, path)
    return value


def key_list_from_file(path: str) -> tuple[str, ...]:
    """The keys of a file of keys, one a line. A file with none is refused: read as "no
    keys", it would switch authentication off without a word."""
    keys: list[str] = []
    for number, line in enumerate(_read(path).splitlines(), 1):
        key = line.strip()
        if not key or key.startswith("#"):
            continue
        _check(key, f"{path} line {number}")
        keys.append(key)
    if not keys:
        raise SecretError(f"{path} holds no keys")
    return tuple(keys)


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise SecretError(f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise SecretError(f"{path} is not UTF-8 text") from None


def _check(value: str, where: str) -> None:
    problem = secret_problem(value)
    if problem is not None:
        raise SecretError(f"the secret in {where} {problem}")
