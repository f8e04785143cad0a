"""Building HTTP responses: JSON bodies and OpenAI error envelopes."""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from narwhal.api.request_id import HEADER as REQUEST_ID_HEADER
from narwhal.errors import InvalidApiKey, NarwhalError, Redact, RequestTooLarge

_encoder = msgspec.json.Encoder()


def json_response(
    payload: Any, *, status: int = 200, request_id: str | None = None
) -> web.Response:
    headers = {REQUEST_ID_HEADER: request_id} if request_id else None
    return web.Response(
        body=_encoder.encode(payload),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def error_response(
    error: NarwhalError, request_id: str, redact: Redact | None = None
) -> web.Response:
    """`error` as its status and envelope, its message through `redact` (`errors.py`)."""
    headers = {REQUEST_ID_HEADER: request_id, **error.headers()}
    if isinstance(error, RequestTooLarge | InvalidApiKey):
        # The unread rest of the body is still on the wire: do not reuse the connection.
        headers["Connection"] = "close"
    return web.Response(
        body=error.body(redact),
        status=error.status,
        content_type="application/json",
        headers=headers,
    )
