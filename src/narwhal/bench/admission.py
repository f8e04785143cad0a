"""What a server's 429 said, and which admission outcome each request had (pure).

Narwhal's admission answers 429 with OpenAI's envelope
`{"error": {"message", "type", "param", "code"}}`, and the `code` says why:

    ttft_budget_exceeded         refused: the projected TTFT is over the budget
                                 (with Retry-After, integer seconds)
    prompt_exceeds_ttft_budget   refused: the prompt alone would take longer
    rate_limit_exceeded          rejected: no capacity

Every recorded request has exactly one outcome, so offered = admitted +
refused + rejected:

    HTTP 429 with a refusal code    refused
    any other HTTP 429              rejected (rate_limit_exceeded, an unknown or
                                    integer code as vLLM sends, a body that is
                                    not JSON, a body cut off)
    anything else                   admitted: the server took the request,
                                    whether it then succeeded or not

The bench speaks to any OpenAI-compatible server, so it names these codes
itself rather than importing Narwhal's errors (a test checks that they agree).
Only error responses are parsed, so a streamed success costs nothing more.
"""

from __future__ import annotations

import math

import msgspec

from narwhal.bench.record import Record

TTFT_BUDGET = "ttft_budget_exceeded"
PROMPT_OVER_BUDGET = "prompt_exceeds_ttft_budget"
RATE_LIMIT = "rate_limit_exceeded"
REFUSAL_CODES = (TTFT_BUDGET, PROMPT_OVER_BUDGET)

ADMITTED = "admitted"
REFUSED = "refused"
REJECTED = "rejected"


def error_code(body: bytes) -> str | None:
    """`error.code` of an error body when it is a string; None for anything else.

    vLLM and SGLang put the HTTP status in `code` as an integer; that names no
    reason, so it is None like a missing one.
    """
    try:
        doc = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return None
    error = doc.get("error") if isinstance(doc, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


def retry_after(value: str | None) -> float:
    """Seconds from a Retry-After header; NaN when absent or not delay-seconds.

    RFC 9110 §10.2.3 also allows an HTTP-date; Narwhal sends integer seconds, and
    a date would need the server's clock, so it is not interpreted.
    """
    if value is None:
        return math.nan
    value = value.strip()
    return float(value) if value.isascii() and value.isdigit() else math.nan


def outcome(record: Record) -> str:
    """ADMITTED, REFUSED or REJECTED (see the module docstring)."""
    if record.status != 429:
        return ADMITTED
    return REFUSED if record.code in REFUSAL_CODES else REJECTED
