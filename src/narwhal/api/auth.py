"""Bearer tokens (RFC 6750): which requests carry one of the configured tokens.

Used for client API keys (`serving.api_keys`, checked on /v1/*) and the admin token. The
check takes the same time whichever token matches, or none: the offered token and every
configured one are compared as SHA-256 digests (equal lengths, so `hmac.compare_digest`
leaks nothing about length either), and every configured token is compared, the loop
never stopping at a match. The scheme is case-insensitive (RFC 9110 section 11.1), the
token is not.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from narwhal.errors import InvalidApiKey


class BearerTokens:
    __slots__ = ("_digests",)

    def __init__(self, tokens: Iterable[str]) -> None:
        self._digests = tuple(_digest(token) for token in tokens)

    def replace(self, tokens: Iterable[str]) -> None:
        """Check against `tokens` from now on (a configuration reload); every holder of
        this object sees the change at once."""
        self._digests = tuple(_digest(token) for token in tokens)

    def __bool__(self) -> bool:
        """Whether any token is configured (none: nothing to check)."""
        return bool(self._digests)

    def admit(self, authorization: str | None) -> bool:
        """Whether an `Authorization` header value carries one of the tokens."""
        token = bearer_token(authorization)
        offered = _digest(token or "")
        matched = False
        for digest in self._digests:
            matched |= hmac.compare_digest(offered, digest)
        return matched and token is not None


def require_api_key(api_keys: BearerTokens, authorization: str | None) -> None:
    """Raise InvalidApiKey unless no key is configured or the header carries one."""
    if api_keys and not api_keys.admit(authorization):
        raise InvalidApiKey(missing=authorization is None)


def bearer_token(authorization: str | None) -> str | None:
    """The token of `Bearer <token>`, or None for no header or another scheme."""
    if authorization is None:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.lstrip(" ")
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", errors="replace")).digest()
