"""Statistics on hand-built records and synthetic timings."""

from __future__ import annotations

import itertools
import math

import pytest

from narwhal.bench.conversation import ConversationCounts
from narwhal.bench.histogram import LogHistogram
from narwhal.bench.record import HTTP, TIMEOUT, TRUNCATED, Record
from narwhal.bench.scanner import StreamScanner
from narwhal.bench.stats import (
    Slo,
    attainment,
    distribution,
    error_counts,
    goodput,
    measured_window,
    meets_slo,
    percentile,
    percentile_label,
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


def test_itl_from_known_event_times() -> None:
    """Two streams' output events at known times: ITL is every gap between successive
    events, over both requests (the longer weighs more), while TPOT is one per request."""
    first = [0.100, 0.110, 0.130, 0.160]  # gaps 10, 20, 30 ms
    second = [0.200, 0.240, 0.240]  # gaps 40 ms, then 0 (two events in one read)
    itl = LogHistogram()
    records = []
    for times in (first, second):
        scanner = StreamScanner()
        for i, now in enumerate(times):
            scanner.feed(f'data: {{"choices":[{{"token_ids":[{i}]}}]}}\n\n'.encode(), now)
        scanner.close(times[-1])
        itl.add_all(scanner.gaps, scanner.zero_gaps)
        records.append(rec(ttft=times[0], last_token=times[-1], tokens=len(times)))
    s = summarize(records, 1.0, 0.0, Slo(), itl=itl, percentiles=(50, 95))
    assert s.itl.count == 5 and s.itl.min == 0.0 and s.itl.max == pytest.approx(0.040)
    assert s.itl.mean == pytest.approx((0.010 + 0.020 + 0.030 + 0.040) / 5)
    # sorted gaps 0, 10, 20, 30, 40 ms: p50 is the middle, p95 at rank 3.8
    assert s.itl.p50 == pytest.approx(0.020, rel=0.012)
    assert s.itl.at(95) == pytest.approx(0.030 + 0.8 * 0.010, rel=0.012)
    assert s.tpot.count == 2 and s.tpot.mean == pytest.approx((0.060 / 3 + 0.040 / 2) / 2)
    none = summarize(records, 1.0, 0.0, Slo())  # no histogram (--no-stream): no ITL
    assert none.itl.count == 0 and math.isnan(none.itl.p50)


def test_input_output_and_total_token_throughput() -> None:
    records = [rec(tokens=4), rec(tokens=6), rec(tokens=8), rec(error=TIMEOUT, tokens=3)]
    for r, (usage, sized) in zip(records, [(100, 96), (-1, 50), (120, 1), (99, 99)], strict=True):
        r.usage_prompt_tokens, r.prompt_tokens = usage, sized
    s = summarize(records, window_s=2.0, cpu_s=0.0, slo=Slo())
    # successful requests only; the server's usage when it reported one, else as sized
    assert (s.input_tokens, s.input_from_usage, s.output_tokens) == (270, 2, 18)
    assert s.input_tokens_per_s == pytest.approx(135.0)
    assert s.output_tokens_per_s == pytest.approx(9.0)
    assert s.total_tokens_per_s == pytest.approx(144.0)
    assert math.isnan(summarize(records, 0.0, 0.0, Slo()).total_tokens_per_s)


def test_token_goodput_counts_prompt_and_output_tokens_within_the_slos() -> None:
    records = [rec(ttft=0.1, tokens=4), rec(ttft=0.3, tokens=6), rec(ttft=0.9, tokens=8)]
    records.append(rec(ttft=0.1, tokens=3, error=TIMEOUT))  # failed: never good
    for r, usage in zip(records, [100, -1, 120, 99], strict=True):
        r.usage_prompt_tokens = usage  # the second is as sized: 10
    s = summarize(records, window_s=2.0, cpu_s=0.0, slo=Slo(ttft_s=0.5))
    assert s.goodput_per_s == pytest.approx(1.0)  # two within, over 2 s
    assert s.token_goodput_per_s == pytest.approx(((100 + 4) + (10 + 6)) / 2.0)
    assert summarize(records, 2.0, 0.0, Slo()).token_goodput_per_s == pytest.approx(
        (104 + 16 + 128) / 2.0
    )  # no SLO: every success
    assert math.isnan(summarize(records, 0.0, 0.0, Slo()).token_goodput_per_s)


def test_chosen_percentiles_and_their_labels() -> None:
    d = distribution([float(v) for v in range(1, 101)], (50, 95, 99.9))
    assert [p for p, _ in d.percentiles] == [50, 95, 99.9]
    assert d.at(95) == pytest.approx(95.05) and d.at(99.9) == pytest.approx(99.901)
    assert d.at(90) == d.p90  # always computed
    assert math.isnan(d.at(12.5))  # not asked for
    assert [percentile_label(p) for p in (50, 95.0, 99.9, 99.99)] == [
        "p50", "p95", "p99.9", "p99.99",
    ]  # fmt: skip
    empty = distribution([], (95,))
    assert empty.count == 0 and math.isnan(empty.at(95))


def test_measured_window_is_first_send_to_last_response_end() -> None:
    records = [rec(latency=0.5), rec(latency=0.2), rec(latency=2.0)]
    for r, start in zip(records, [1.0, 1.1, 0.9], strict=True):
        r.start = start
    assert measured_window(records, 99.0) == pytest.approx(2.9 - 0.9)
    assert measured_window([], 3.5) == 3.5
