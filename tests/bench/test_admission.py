"""Admission outcomes from what a server said, and a stage's admission figures."""

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
from narwhal.bench.stats import Slo, admission_summary, goodput


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


def test_admission_summary() -> None:
    slo = Slo(ttft_s=0.5, tpot_s=0.01)
    records = [
        served(0.1),  # met (its TPOT of 0.13 s misses --slo-tpot, which admission ignores)
        served(0.5),  # met: inclusive
        served(0.7),  # TTFT miss
        served(0.1, error=ERROR_EVENT),  # admitted, failed: a miss
        answer(503, "backend_unavailable"),  # admitted, failed: a miss
        answer(429, TTFT_BUDGET, latency=0.004, retry=3.0),
        answer(429, TTFT_BUDGET, latency=0.001, retry=1.0),
        answer(429, TTFT_BUDGET, latency=0.002, retry=2.0),
        answer(429, TTFT_BUDGET, latency=0.003),  # no Retry-After
        answer(429, PROMPT_OVER_BUDGET, latency=0.005),
        answer(429, RATE_LIMIT, latency=0.5, retry=9.0),  # a rejection: in neither figure
        answer(429),
    ]
    a = admission_summary(records, slo)
    assert (a.offered, a.admitted, a.refused, a.rejected) == (12, 5, 5, 2)
    assert a.refused_by_code == {TTFT_BUDGET: 4, PROMPT_OVER_BUDGET: 1}
    assert a.admitted_attainment == pytest.approx(2 / 5)
    assert a.refusal_latency_s.count == 5
    assert a.refusal_latency_s.p50 == pytest.approx(0.003)
    assert a.refusal_latency_s.p99 == pytest.approx(0.004 + 0.96 * 0.001)
    assert (a.retry_after_s.count, a.retry_after_s.min) == (3, 1.0)
    assert (a.retry_after_s.p50, a.retry_after_s.max) == (2.0, 3.0)
    assert a.saw_429
    assert a.offered_attainment == pytest.approx(2 / 12)  # admitted and met, of all offered
    # Goodput keeps every SLO: of the two within TTFT, only served(0.5) (TPOT 0) meets TPOT.
    assert goodput(records, slo, 2.0) == pytest.approx(0.5)
    assert goodput(records, Slo(ttft_s=0.5), 2.0) == pytest.approx(1.0)


def test_admission_summary_without_429s_or_slo() -> None:
    plain = admission_summary([served(9.0), served(0.1, error=TIMEOUT)], Slo())
    assert (plain.offered, plain.admitted, plain.refused, plain.rejected) == (2, 2, 0, 0)
    assert plain.refused_by_code == {TTFT_BUDGET: 0, PROMPT_OVER_BUDGET: 0}
    assert plain.admitted_attainment == 0.5  # no --slo-ttft: success only
    assert plain.offered_attainment == 0.5  # all offered were admitted
    assert not plain.saw_429
    assert plain.refusal_latency_s.count == 0 and math.isnan(plain.refusal_latency_s.p99)
    assert plain.retry_after_s.count == 0 and math.isnan(plain.retry_after_s.p50)
    refused_only = admission_summary([answer(429, TTFT_BUDGET)], Slo(ttft_s=1.0))
    assert refused_only.admitted == 0 and math.isnan(refused_only.admitted_attainment)
    assert refused_only.offered_attainment == 0.0  # none admitted, so none within
    assert math.isnan(admission_summary([], Slo()).offered_attainment)
