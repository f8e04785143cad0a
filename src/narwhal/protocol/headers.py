"""The request headers the completion routes interpret, checked before the body is read.

Each check takes every value the client sent for the header (all its field lines), so a
header sent twice with different values is refused rather than read one way here and
another way by a proxy in front (RFC 9110 §5.3: a singleton field must appear once).
Content-Length and Transfer-Encoding are the HTTP parser's (aiohttp refuses duplicates and
conflicts before a handler runs).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from narwhal.errors import InvalidRequest, UnsupportedMediaType

REQUEST_TIMEOUT = "X-Request-Timeout"
PRIORITY = "X-Narwhal-Priority"  # the request's priority class (admission/classes.py)
CONTENT_TYPE = "Content-Type"
CONTENT_ENCODING = "Content-Encoding"

# Seconds as a plain decimal: "30", "0.5", ".25". Not Python's float syntax, which also
# takes "1_0", "inf", "nan", "1e3" and digits of any script.
_DECIMAL = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+", re.ASCII)
_SHOWN_CHARS = 40


def request_timeout(values: Sequence[str], limit: float) -> float:
    """Seconds until the original deadline: `limit`, or less if the client asked for less."""
    value = _single(REQUEST_TIMEOUT, values)
    if value is None:
        return limit
    stripped = value.strip(" \t")  # HTTP's optional whitespace only (RFC 9110 §5.6.3)
    asked = float(stripped) if _DECIMAL.fullmatch(stripped) else math.nan
    if not math.isfinite(asked) or asked <= 0:
        raise InvalidRequest(
            f"{REQUEST_TIMEOUT} must be a positive decimal number of seconds, got {_shown(value)}.",
            param=REQUEST_TIMEOUT,
        )
    return min(asked, limit)


def check_content_type(values: Sequence[str]) -> None:
    """The body must be JSON: application/json or application/*+json, or no Content-Type
    at all (read as JSON, as vLLM's FastAPI front does)."""
    value = _single(CONTENT_TYPE, values)
    if value is None or not value.strip():
        return
    media_type = value.split(";", 1)[0].strip().lower()
    kind, _, subtype = media_type.partition("/")
    if kind == "application" and (subtype == "json" or subtype.endswith("+json")):
        return
    raise UnsupportedMediaType(
        f"The body must be JSON (Content-Type: application/json), got {_shown(value)}.",
        param=CONTENT_TYPE,
    )


def check_content_encoding(values: Sequence[str]) -> None:
    """The body must not be compressed: the router neither inflates bodies (a small gzip
    body can inflate past any memory bound) nor forwards them compressed."""
    codings = [c.strip().lower() for value in values for c in value.split(",")]
    unsupported = [c for c in codings if c and c != "identity"]
    if unsupported:
        raise UnsupportedMediaType(
            f"Content-Encoding {_shown(', '.join(unsupported))} is not supported; "
            "send the body uncompressed.",
            param=CONTENT_ENCODING,
        )


def _single(name: str, values: Sequence[str]) -> str | None:
    """The one value of a singleton header; repeating the same value is harmless."""
    distinct = {v.strip() for v in values}
    if len(distinct) > 1:
        raise InvalidRequest(f"{name} is given more than once, with different values.", param=name)
    return values[0] if values else None


def _shown(value: str) -> str:
    text = repr(value)
    if len(text) <= _SHOWN_CHARS:
        return text
    return f"{text[: _SHOWN_CHARS - 1]}…"
