"""The access log: one line per completion request, at INFO on the `narwhal.access` logger.

Written once, when the request's outcome is counted (`completions.py`), with what is
known of it by then:

    request_id          the id the client got in X-Request-Id
    route, stream       chat or completion, and whether the answer was a stream
    status              the HTTP status written; null when none was (the client left)
    outcome             the terminal outcome, as in narwhal_requests_total
    engines             where it was placed (its last attempt: prefill half first)
    prompt_tokens       the engine's usage count, else the router's sizing; null unsized
    completion_tokens   output tokens validated by the router; null when none was served
    ttft_s              arrival to the first output token; null without one
    duration_s          arrival to the end of the response
    upstream_timeout    the phase timeout that last ended one of its attempts, first_event
                        (no event in time: placed elsewhere) or idle (the engine went
                        silent after its first event); null when none did
    tenant, class       its tenant and priority class; null when it ended before either
                        was known (no valid key, a malformed X-Narwhal-Priority)

In text, `key=value` pairs (`-` for null, engines joined with ","); in JSON, fields of
the line's object (`logs.py`); on the request's span, the same facts as attributes.
Never a prompt, an output or a token ID. `logging.
access_log: false` (`--no-access-log`) turns it off; so does a level above INFO. A request
costs nothing here then: the entry is not even built.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from narwhal.errors import Outcome
from narwhal.observability.logs import StructuredMessage
from narwhal.observability.tracing import Attribute
from narwhal.protocol.requests import Route

LOGGER = "narwhal.access"


@dataclass(frozen=True, slots=True)
class AccessEntry(StructuredMessage):
    request_id: str
    route: Route
    stream: bool
    status: int | None
    outcome: Outcome
    engines: tuple[str, ...]
    prompt_tokens: int | None
    completion_tokens: int | None
    ttft_s: float | None
    duration_s: float
    upstream_timeout: str | None = None
    tenant: str | None = None
    priority_class: str | None = None

    message = "completion request"

    def fields(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "route": self.route,
            "stream": self.stream,
            "status": self.status,
            "outcome": self.outcome,
            "engines": list(self.engines),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "ttft_s": None if self.ttft_s is None else round(self.ttft_s, 6),
            "duration_s": round(self.duration_s, 6),
            "upstream_timeout": self.upstream_timeout,
            "tenant": self.tenant,
            "class": self.priority_class,
        }

    def span_attributes(self) -> dict[str, Attribute]:
        """The same facts as the request span's attributes (`tracing.py`)."""
        attributes: dict[str, Attribute] = {
            "narwhal.request_id": self.request_id,
            "narwhal.route": self.route,
            "narwhal.stream": self.stream,
            "narwhal.outcome": self.outcome,
            "narwhal.engines": self.engines,
        }
        if self.status is not None:
            attributes["http.response.status_code"] = self.status
        if self.prompt_tokens is not None:
            attributes["narwhal.prompt_tokens"] = self.prompt_tokens
        if self.completion_tokens is not None:
            attributes["narwhal.completion_tokens"] = self.completion_tokens
        if self.upstream_timeout is not None:
            attributes["narwhal.upstream_timeout"] = self.upstream_timeout
        if self.tenant is not None:
            attributes["narwhal.tenant"] = self.tenant
        if self.priority_class is not None:
            attributes["narwhal.class"] = self.priority_class
        return attributes

    def __str__(self) -> str:
        return (
            f"request_id={self.request_id} route={self.route} "
            f"stream={'true' if self.stream else 'false'} status={_shown(self.status)} "
            f"outcome={self.outcome} engines={','.join(self.engines) or '-'} "
            f"prompt_tokens={_shown(self.prompt_tokens)} "
            f"completion_tokens={_shown(self.completion_tokens)} "
            f"ttft_s={_seconds(self.ttft_s)} duration_s={_seconds(self.duration_s)} "
            f"upstream_timeout={self.upstream_timeout or '-'} "
            f"tenant={self.tenant or '-'} class={self.priority_class or '-'}"
        )


class AccessLog:
    def __init__(self, enabled: bool, logger: logging.Logger | None = None) -> None:
        self._enabled = enabled
        self._log = logger or logging.getLogger(LOGGER)

    @property
    def enabled(self) -> bool:
        """Whether a line would be written (the logger caches its level check)."""
        return self._enabled and self._log.isEnabledFor(logging.INFO)

    def write(self, entry: AccessEntry) -> None:
        # As `info(entry)` but for the lookup of the calling frame (its file and line), a
        # tenth of a line's cost: an access line always comes from the same place.
        log = self._log
        log.handle(log.makeRecord(log.name, logging.INFO, __file__, 0, entry, (), None))


def _shown(value: int | None) -> str:
    return "-" if value is None else str(value)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.6f}"
