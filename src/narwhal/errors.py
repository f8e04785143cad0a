"""Every error Narwhal answers with, and the one function that renders them.

    NarwhalError                       500 server_error (router bug)   outcome: internal_error
    ├── InvalidRequest                 400 invalid_request_error       outcome: invalid
    │   ├── InvalidSamplingWidth       400 "Invalid sampling width"     (n, best_of > 1)
    │   ├── UnsupportedOption          400 audio / modality / tool requests
    │   └── ContextLengthExceeded      400 context_length_exceeded     (prompt + max_tokens
    │                                      beyond the engines' max_model_len)
    ├── InvalidApiKey                  401 invalid_api_key              outcome: invalid
    ├── ModelNotFound                  404 model_not_found              outcome: invalid
    ├── RequestTooLarge                413 request_too_large            outcome: invalid
    ├── UnsupportedMediaType           415 not JSON (Content-Type), or compressed (Content-Encoding)
    ├── CapacityRejected               429 rate_limit_exceeded          outcome: rejected
    │   └── TenantQuotaExceeded        429 tenant_quota_exceeded        outcome: rejected
    ├── TtftBudgetExceeded             429 ttft_budget_exceeded         outcome: refused
    ├── PromptExceedsTtftBudget        429 prompt_exceeds_ttft_budget   outcome: refused
    │                                      (x-should-retry: false: the same prompt never fits)
    ├── UpstreamError                  502 upstream_error               outcome: upstream_error
    ├── BackendUnavailable             503 backend_unavailable          outcome: unavailable
    ├── RouterUnavailable              503 router_unavailable           outcome: unavailable
    └── TerminalExpiry                 504 terminal_expiry              outcome: expired

Each class knows its HTTP status, OpenAI `type` and `code`, the terminal outcome it
is counted as (`Outcome`), and its `Retry-After` (seconds, or None). The base class is
raised on purpose only for a router bug ("Internal router error."). The envelope is
OpenAI's: `{"error": {"message", "type", "param", "code"}}` with a string (or null)
`code`, never vLLM's integer one.

`message` is the operator's text (the log's), in the words of the layer that failed:
an engine's failure may name its address. A client reads it through `redact`
(`narwhal.api.redaction`: the completion front passes its engines' redaction to every
rendering, before and after the response started).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Literal

import msgspec

Outcome = Literal[
    "completed",
    "invalid",
    "rejected",
    "refused",
    "expired",
    "unavailable",
    "upstream_error",
    "internal_error",
    "client_gone",
]
"""How a request on a completion route ended: each one ends in exactly one, counted once
in `narwhal_outcomes_total{outcome}` (DESIGN.md §3)."""

_encoder = msgspec.json.Encoder()
Redact = Callable[[str], str]
"""What a client-facing message passes before it is rendered (`EngineRedaction.redact`)."""


class NarwhalError(Exception):
    status: ClassVar[int] = 500
    error_type: ClassVar[str] = "server_error"
    code: ClassVar[str | None] = None
    outcome: ClassVar[Outcome] = "internal_error"
    default_retry_after: ClassVar[int | None] = None

    def __init__(
        self, message: str, *, param: str | None = None, retry_after: int | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.retry_after = retry_after if retry_after is not None else self.default_retry_after

    def envelope(self, redact: Redact | None = None) -> dict[str, dict[str, str | None]]:
        """The OpenAI error envelope, its message through `redact` (engine addresses:
        errors that may quote an engine's failure are rendered with one)."""
        return {
            "error": {
                "message": self.message if redact is None else redact(self.message),
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }

    def body(self, redact: Redact | None = None) -> bytes:
        """The JSON error envelope, as the response body."""
        return _encoder.encode(self.envelope(redact))

    def sse_event(self, redact: Redact | None = None) -> bytes:
        """The envelope as one SSE event, for errors after the response headers went out."""
        return b"data: " + self.body(redact) + b"\n\n"

    def headers(self) -> dict[str, str]:
        if self.retry_after is None:
            return {}
        return {"Retry-After": str(self.retry_after)}

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as what it holds, not as the call that built it: a refusal crosses from
        the decision process to a relay worker (`narwhal.transport`), and subclasses take
        other arguments than the message they pass on (`CapacityRejected`'s reason)."""
        return (_rebuilt, (type(self), self.args, dict(self.__dict__)))


def _rebuilt(cls: type[NarwhalError], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class InvalidRequest(NarwhalError):
    status = 400
    error_type = "invalid_request_error"
    outcome = "invalid"


class InvalidSamplingWidth(InvalidRequest):
    def __init__(self, param: str) -> None:
        super().__init__("Invalid sampling width", param=param)


class UnsupportedOption(InvalidRequest):
    pass


class ContextLengthExceeded(InvalidRequest):
    """The prompt plus its output cap cannot fit the model's context (the smallest
    `max_model_len` among the engines): refused before any engine work, as OpenAI
    refuses it, with `param` the field to change."""

    code = "context_length_exceeded"


class InvalidApiKey(InvalidRequest):
    """No client API key, or not one of `serving.api_keys`: OpenAI's own answer (401,
    `invalid_request_error`, `invalid_api_key`), which its clients raise as
    AuthenticationError. Given before the body is read, so the connection is not reused."""

    status = 401
    code = "invalid_api_key"

    def __init__(self, *, missing: bool) -> None:
        super().__init__(
            "This router needs an API key: send it as Authorization: Bearer <key>."
            if missing
            else "The API key is not valid for this router."
        )

    def headers(self) -> dict[str, str]:
        # RFC 6750 section 3: the scheme a client should use, on every 401.
        return {**super().headers(), "WWW-Authenticate": 'Bearer realm="narwhal"'}


class ModelNotFound(InvalidRequest):
    status = 404
    code = "model_not_found"

    def __init__(self, model: str) -> None:
        if len(model) > 256:  # a refusal is never the size of the body that caused it
            model = f"{model[:240]}… ({len(model)} characters)"
        super().__init__(
            f"The model `{model}` does not exist or you do not have access to it.", param="model"
        )


class RequestTooLarge(InvalidRequest):
    status = 413
    code = "request_too_large"

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"Request body exceeds the limit of {limit} bytes (serving.max_request_bytes)."
        )


class UnsupportedMediaType(InvalidRequest):
    """A body the router will not read: a Content-Type other than JSON, or a Content-Encoding
    other than identity (RFC 9110 §15.5.16: then Accept-Encoding says what would do)."""

    status = 415

    def headers(self) -> dict[str, str]:
        headers = super().headers()
        if self.param == "Content-Encoding":
            headers["Accept-Encoding"] = "identity"
        return headers


class CapacityRejected(NarwhalError):
    status = 429
    error_type = "rate_limit_error"
    code = "rate_limit_exceeded"
    outcome = "rejected"
    default_retry_after = 1

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class TenantQuotaExceeded(CapacityRejected):
    """A tenant's request or token rate limit (`tenants.<name>.requests_per_min`,
    `tokens_per_min`); `Retry-After` is when its bucket holds enough again."""

    code = "tenant_quota_exceeded"

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message, reason="tenant_quota")
        self.retry_after = retry_after


class TtftBudgetExceeded(NarwhalError):
    status = 429
    error_type = "rate_limit_error"
    code = "ttft_budget_exceeded"
    outcome = "refused"
    default_retry_after = 1


class PromptExceedsTtftBudget(NarwhalError):
    status = 429
    error_type = "invalid_request_error"
    code = "prompt_exceeds_ttft_budget"
    outcome = "refused"

    def headers(self) -> dict[str, str]:
        # The same prompt is refused again however often it comes: the official OpenAI
        # clients retry a 429 (twice, with backoff) unless this header says not to.
        return {**super().headers(), "x-should-retry": "false"}


class UpstreamError(NarwhalError):
    status = 502
    error_type = "server_error"
    code = "upstream_error"
    outcome = "upstream_error"


class TruncatedStream(UpstreamError):
    """The engine's stream ended before every choice finished (retryable before headers)."""


class BackendUnavailable(NarwhalError):
    status = 503
    error_type = "server_error"
    code = "backend_unavailable"
    outcome = "unavailable"
    default_retry_after = 1


class RouterUnavailable(NarwhalError):
    status = 503
    error_type = "server_error"
    code = "router_unavailable"
    outcome = "unavailable"
    default_retry_after = 1

    @classmethod
    def not_admitting(cls, reason: str) -> RouterUnavailable:
        """The 503 of a router that is not admitting, by the reason its state gives."""
        return cls(f"This router is not serving requests ({reason}).")


class TerminalExpiry(NarwhalError):
    status = 504
    error_type = "timeout_error"
    code = "terminal_expiry"
    outcome = "expired"
