"""One measured request, kept compact (a slots class of numbers).

Times are seconds. `start` counts from the run's origin (the moment the first
stage began); `ttft`, `last_token` and `latency` count from the moment the
request was sent. A value that was not observed is NaN, never None, so every
field stays a plain float; an integer that was not observed or does not apply is
-1 (a turn number 0).
"""

from __future__ import annotations

import math
from array import array

NAN = math.nan

# Client-side error kinds. An HTTP status other than 200 is the kind `HTTP`.
HTTP = "http"
CONNECT = "connect"  # the connection could not be opened
DISCONNECTED = "disconnected"  # the server closed the connection before answering
TIMEOUT = "timeout"  # --timeout passed first
TRUNCATED = "truncated"  # the body ended before [DONE] or a finish reason
ERROR_EVENT = "error_event"  # an SSE event with a top-level "error" object
CLIENT_ERROR = "client_error"  # any other aiohttp error


class Record:
    """What one request did. `error` is None for a success."""

    __slots__ = (
        "cached_tokens",
        "code",
        "conversation",
        "error",
        "events",
        "index",
        "last_token",
        "latency",
        "marks",
        "max_tokens",
        "prompt_tokens",
        "retry_after",
        "start",
        "status",
        "system_prompt",
        "target",
        "tokens",
        "ttft",
        "turn",
        "usage_prompt_tokens",
    )

    def __init__(self, index: int, target: int, prompt_tokens: int, max_tokens: int) -> None:
        self.index = index
        self.target = target  # which --url
        self.prompt_tokens = prompt_tokens  # as requested (~4 characters per token)
        self.max_tokens = max_tokens
        self.start = NAN
        self.status = 0  # HTTP status, 0 when none arrived
        self.error: str | None = None
        # Read from HTTP error responses only: the body's string `error.code` and the
        # Retry-After header in seconds (see `admission`).
        self.code: str | None = None
        self.retry_after = NAN
        self.ttft = NAN
        self.last_token = NAN
        self.latency = NAN
        self.tokens = 0  # output tokens
        self.events = 0  # streamed data events, [DONE] excluded
        self.marks: array[float] | None = None  # (seconds after send, tokens) pairs
        # What the server's usage said: prompt tokens, and how many of them it had
        # cached (`prompt_tokens_details.cached_tokens`; vLLM reports it only with
        # --enable-prompt-tokens-details); -1 when not reported.
        self.usage_prompt_tokens = -1
        self.cached_tokens = -1
        # Prefix workloads: the conversation's number and the turn's (1 = its first),
        # and which shared system prompt the request starts with.
        self.conversation = -1
        self.turn = 0
        self.system_prompt = -1

    @property
    def ok(self) -> bool:
        return self.error is None


def error_key(record: Record) -> str | None:
    """How an error is grouped: `HTTP 503`, `timeout`, `truncated`, ...; None for a success.

    A 429 that names its code is grouped by it (`HTTP 429 ttft_budget_exceeded`), so an
    admission's refusals and rejections are told apart, each with its own sample.
    """
    if record.error is None:
        return None
    if record.error == HTTP:
        if record.status == 429 and record.code is not None:
            return f"HTTP 429 {record.code}"
        return f"HTTP {record.status}"
    return record.error
