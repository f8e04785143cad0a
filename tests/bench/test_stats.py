"""Statistics on hand-built records and synthetic timings."""

from __future__ import annotations

import itertools
import math

import pytest

from narwhal.bench.conversation import ConversationCounts
from narwhal.bench.record import HTTP, TIMEOUT, TRUNCATED, Record
from narwhal.bench.stats import (
    Slo,
    attainment,
    distribution,
    error_counts,
    goodput,
    meets_slo,
    percentile,
    prompt_cache,
    record_tpot,
    summarize,
    token_times,
    tpot,
)


def rec(
    ttft: float = 0.1,
    last_token: float = 0.5,
    tokens: int = 5,
    *,
    error: str | None = None,
    status: int = 200,
    latency: float = 0.6,
    events: int = 6,
) -> Record:
    r = Record(0, 0, 10, tokens)
    r.ttft, r.last_token, r.tokens, r.latency = ttft, last_token, tokens, latency
    r.error, r.status, r.events = error, status, events
    return r


def test_percentile_linear_between_closest_ranks() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    # rank = p/100 * (n - 1): p50 -> 1.5, p90 -> 2.7, p99 -> 2.97
    assert percentile(values, 50) == pytest.approx(2.5)
    assert percentile(values, 90) == pytest.approx(3.7)
    assert percentile(values, 99) == pytest.approx(3.97)
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile([10.0, 20.0, 30.0, 40.0, 50.0], 25) == pytest.approx(20.0)


def test_percentile_edge_cases() -> None:
    assert math.isnan(percentile([], 50))
    assert percentile([7.0], 0) == percentile([7.0], 50) == percentile([7.0], 99) == 7.0
    assert percentile([1.0, 3.0], 50) == 2.0


def test_distribution_skips_nan_and_handles_empty() -> None:
    d = distribution([0.3, math.nan, 0.1, 0.2])
    assert d.count == 3
    assert d.mean == pytest.approx(0.2)
    assert d.p50 == pytest.approx(0.2)
    assert d.p90 == pytest.approx(0.28)
    assert (d.min, d.max) == (0.1, 0.3)
    empty = distribution([math.nan])
    assert empty.count == 0 and math.isnan(empty.mean) and math.isnan(empty.p99)
    assert math.isnan(empty.min) and math.isnan(empty.max)


def test_tpot_from_token_times() -> None:
    # events at 0.10 (1 id), 0.13 (3 ids), 0.19 (1 id), 0.22 (2 ids): 7 tokens
    marks = [0.10, 1, 0.13, 3, 0.19, 1, 0.22, 2]
    times = token_times(marks)
    assert times == [0.10, 0.13, 0.13, 0.13, 0.19, 0.22, 0.22]
    assert tpot(times[0], times[-1], len(times)) == pytest.approx(0.12 / 6)
    # equal to the mean gap between consecutive tokens
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert tpot(times[0], times[-1], len(times)) == pytest.approx(sum(gaps) / len(gaps))
    assert math.isnan(tpot(0.1, 0.1, 1))
    assert math.isnan(tpot(math.nan, 0.2, 5))
    assert record_tpot(rec(ttft=0.1, last_token=0.5, tokens=5)) == pytest.approx(0.1)


def test_meets_slo_each_half_and_errors() -> None:
    slo = Slo(ttft_s=0.2, tpot_s=0.05)
    assert meets_slo(rec(ttft=0.2, last_token=0.4, tokens=5), slo)  # tpot 0.05: inclusive
    assert not meets_slo(rec(ttft=0.21, last_token=0.3, tokens=5), slo)
    assert not meets_slo(rec(ttft=0.1, last_token=0.9, tokens=5), slo)  # tpot 0.2
    assert meets_slo(rec(ttft=0.1, last_token=0.1, tokens=1), slo)  # no TPOT: passes that half
    assert not meets_slo(rec(ttft=math.nan, tokens=0), slo)  # no first token: fails TTFT
    assert not meets_slo(rec(error=HTTP, status=429), slo)
    assert meets_slo(rec(ttft=9.0, last_token=99.0), Slo())  # no SLO: success only
    assert meets_slo(rec(ttft=0.1, last_token=9.0), Slo(ttft_s=0.2))


def test_attainment_and_goodput() -> None:
    slo = Slo(ttft_s=0.5, tpot_s=0.1)
    records = [
        rec(ttft=0.1, last_token=0.5, tokens=5),  # meets (tpot 0.1)
        rec(ttft=0.4, last_token=0.8, tokens=9),  # meets (tpot 0.05)
        rec(ttft=0.6, last_token=0.7, tokens=3),  # TTFT too slow
        rec(ttft=0.1, last_token=2.1, tokens=5),  # TPOT 0.5 too slow
        rec(error=TIMEOUT),
    ]
    assert attainment(records, slo) == pytest.approx(2 / 5)
    assert goodput(records, slo, window_s=4.0) == pytest.approx(0.5)
    assert math.isnan(attainment([], slo))
    assert math.isnan(goodput(records, slo, 0.0))


def test_error_grouping_by_status_and_kind() -> None:
    records = [
        rec(),
        rec(error=HTTP, status=429),
        rec(error=HTTP, status=503),
        rec(error=HTTP, status=429),
        rec(error=TRUNCATED),
        rec(error=TIMEOUT),
    ]
    counts = error_counts(records)
    assert counts == {"HTTP 429": 2, "HTTP 503": 1, "timeout": 1, "truncated": 1}
    assert list(counts) == ["HTTP 429", "HTTP 503", "timeout", "truncated"]


def test_summarize_counts_add_up() -> None:
    records = [rec(tokens=5, events=7), rec(tokens=3, events=4), rec(error=TRUNCATED, events=2)]
    s = summarize(records, window_s=2.0, cpu_s=0.003, slo=Slo(ttft_s=1.0))
    assert (s.requests, s.ok, s.errors) == (3, 2, 1)
    assert s.ok + s.errors == s.requests
    assert s.requests_per_s == pytest.approx(1.0)
    assert s.output_tokens == 8 and s.output_tokens_per_s == pytest.approx(4.0)
    assert s.events_per_s == pytest.approx(13 / 2)
    assert s.ttft.count == 2 and s.latency.count == 2
    assert s.attainment == pytest.approx(2 / 3)
    assert s.cpu_per_request_s == pytest.approx(0.001)
    empty = summarize([], 0.0, 0.0, Slo())
    assert empty.requests == 0 and math.isnan(empty.cpu_per_request_s)


def turn(conversation: int, number: int, ttft: float, *, error: str | None = None) -> Record:
    r = rec(ttft=ttft, error=error, status=200 if error is None else 429)
    r.conversation, r.turn = conversation, number
    return r


def test_conversation_summary_counts_turns_and_ttft_by_turn() -> None:
    records = [
        turn(0, 1, 0.30), turn(0, 2, 0.10), turn(0, 3, 0.12),
        turn(1, 1, 0.50), turn(1, 2, 9.0, error=HTTP),  # failed: not in turn 2's TTFT
        turn(2, 1, 0.40),
    ]  # fmt: skip
    counts = ConversationCounts(started=4, completed=1, failed=1, cut=2)
    s = summarize(records, 1.0, 0.0, Slo(), counts)
    c = s.conversations
    assert c is not None
    assert (c.started, c.completed, c.failed, c.unreadable, c.cut) == (4, 1, 1, 0, 2)
    assert (c.turns.count, c.turns.mean, c.turns.max) == (3, 2.0, 3.0)
    assert [(t.turn, t.ttft.count) for t in c.ttft_by_turn] == [(1, 3), (2, 1), (3, 1)]
    assert c.ttft_by_turn[0].ttft.p50 == pytest.approx(0.40)
    assert c.ttft_by_turn[1].ttft.max == pytest.approx(0.10)
    assert summarize(records, 1.0, 0.0, Slo()).conversations is None


def test_prompt_cache_share_from_reported_usage() -> None:
    records = [rec(), rec(), rec(), rec(error=HTTP, status=429)]
    assert math.isnan(prompt_cache(records).cached_share)  # nobody reported it
    for r, (prompt, cached) in zip(records, [(100, 60), (300, 0), (50, -1), (80, 80)], strict=True):
        r.usage_prompt_tokens, r.cached_tokens = prompt, cached
    cache = prompt_cache(records)  # the third reported no cached count, the fourth failed
    assert (cache.responses, cache.prompt_tokens, cache.cached_tokens) == (2, 400, 60)
    assert cache.cached_share == pytest.approx(0.15)
