"""Admission outcomes from what a server said."""

from __future__ import annotations

import math

import pytest

from narwhal import errors
from narwhal.bench.admission import (
    ADMITTED,
    PROMPT_OVER_BUDGET,
    RATE_LIMIT,
    REFUSED,
    REJECTED,
    TTFT_BUDGET,
    error_code,
    outcome,
    retry_after,
)
from narwhal.bench.record import ERROR_EVENT, HTTP, TIMEOUT, Record, error_key


def answer(
    status: int,
    code: str | None = None,
    *,
    latency: float = 0.002,
    retry: float = math.nan,
    error: str | None = HTTP,
) -> Record:
    r = Record(0, 0, 10, 4)
    r.status, r.code, r.latency, r.retry_after, r.error = status, code, latency, retry, error
    return r


def served(ttft: float, *, error: str | None = None, last_token: float = 0.5) -> Record:
    r = Record(0, 0, 10, 4)
    r.status, r.error, r.ttft, r.last_token, r.tokens = 200, error, ttft, last_token, 4
    return r


def test_codes_are_narwhals() -> None:
    assert errors.TtftBudgetExceeded.code == TTFT_BUDGET
    assert errors.PromptExceedsTtftBudget.code == PROMPT_OVER_BUDGET
    assert errors.CapacityRejected.code == RATE_LIMIT
    body = errors.TtftBudgetExceeded("over budget", retry_after=3).body()
    assert error_code(body) == TTFT_BUDGET


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b'{"error": {"message": "m", "type": "t", "param": null, "code": "x_y"}}', "x_y"),
        (b'{"error": {"message": "m", "code": null}}', None),
        (b'{"error": {"message": "busy", "code": 429}}', None),  # vLLM: the status, no reason
        (b'{"object": "error", "message": "m", "code": 429}', None),  # SGLang's flat shape
        (b'{"error": "busy"}', None),
        (b'{"error": {"code": "cut', None),  # a body cut at the read limit
        (b"<html>Too Many Requests</html>", None),
        (b"[1, 2]", None),
        (b"", None),
    ],
)
def test_error_code(body: bytes, code: str | None) -> None:
    assert error_code(body) == code


def test_retry_after_takes_delay_seconds_only() -> None:
    assert retry_after("2") == 2.0
    assert retry_after(" 30 ") == 30.0
    for value in (None, "", "1.5", "-1", "soon", "Wed, 21 Oct 2015 07:28:00 GMT", "²"):
        assert math.isnan(retry_after(value)), value


def test_outcome_and_error_key() -> None:
    cases = [
        (served(0.1), ADMITTED, None),
        (served(0.1, error=ERROR_EVENT), ADMITTED, "error_event"),
        (answer(503, "backend_unavailable"), ADMITTED, "HTTP 503"),  # other keys unchanged
        (answer(429, TTFT_BUDGET), REFUSED, "HTTP 429 ttft_budget_exceeded"),
        (answer(429, PROMPT_OVER_BUDGET), REFUSED, "HTTP 429 prompt_exceeds_ttft_budget"),
        (answer(429, RATE_LIMIT), REJECTED, "HTTP 429 rate_limit_exceeded"),
        (answer(429, "something_else"), REJECTED, "HTTP 429 something_else"),
        (answer(429), REJECTED, "HTTP 429"),
        (answer(429, error=TIMEOUT), REJECTED, "timeout"),  # its body never came
    ]
    for record, expected, key in cases:
        assert (outcome(record), error_key(record)) == (expected, key)
