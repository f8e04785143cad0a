"""Bearer tokens (RFC 6750): which requests carry one of the configured tokens.

Used for client API keys (`serving.api_keys`, checked on /v1/*) and the admin token. The
check takes the same time whichever token matches, or none: the offered token and every
configured one are compared as SHA-256 digests (equal lengths, so `hmac.compare_digest`
leaks nothing about length either), and every configured token is compared, the loop
never stopping at a match (a client key's tenant is kept as it matches). The scheme is
case-insensitive (RFC 9110 section 11.1), the token is not.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from narwhal.config import DEFAULT_TENANT
from narwhal.errors import InvalidApiKey


class BearerTokens:
    __slots__ = ("_digests",)

    def __init__(self, tokens: Iterable[str | tuple[str, str]]) -> None:
        """`tokens`: each token, or (token, tenant) for a client key of a tenant's."""
        self._digests = _digests(tokens)

    def replace(self, tokens: Iterable[str | tuple[str, str]]) -> None:
        """Check against `tokens` from now on (a configuration reload); every holder of
        this object sees the change at once."""
        self._digests = _digests(tokens)

    def __bool__(self) -> bool:
        """Whether any token is configured (none: nothing to check)."""
        return bool(self._digests)

    def admit(self, authorization: str | None) -> bool:
        """Whether an `Authorization` header value carries one of the tokens."""
        return self.tenant_of(authorization) is not None

    def tenant_of(self, authorization: str | None) -> str | None:
        """The tenant of the token an `Authorization` header value carries, or None when
        it carries none of them."""
        token = bearer_token(authorization)
        offered = _digest(token or "")
        matched: str | None = None
        for digest, tenant in self._digests:
            if hmac.compare_digest(offered, digest):
                matched = tenant  # (the loop goes on: every token is compared)
        return matched if token is not None else None


def require_api_key(api_keys: BearerTokens, authorization: str | None) -> str:
    """The tenant of the request's key (the default tenant when no key is configured);
    InvalidApiKey when keys are configured and the header carries none of them."""
    if not api_keys:
        return DEFAULT_TENANT
    tenant = api_keys.tenant_of(authorization)
    if tenant is None:
        raise InvalidApiKey(missing=authorization is None)
    return tenant


def bearer_token(authorization: str | None) -> str | None:
    """The token of `Bearer <token>`, or None for no header or another scheme."""
    if authorization is None:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.lstrip(" ")
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def _digests(tokens: Iterable[str | tuple[str, str]]) -> tuple[tuple[bytes, str], ...]:
    pairs = ((t, DEFAULT_TENANT) if isinstance(t, str) else t for t in tokens)
    return tuple((_digest(token), tenant) for token, tenant in pairs)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", errors="replace")).digest()
