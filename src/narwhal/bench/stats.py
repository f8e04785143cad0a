"""Statistics over measured requests: pure functions of records, no clock, no I/O.

Percentiles use linear interpolation between closest ranks (NumPy's default
`linear` method): for n sorted values the p-th percentile sits at rank
r = p/100 * (n - 1); with r = i + f it is v[i] + f * (v[i+1] - v[i]). No values
give NaN; one value gives that value for every p.

Every distribution has its mean, p50, p90, p99, minimum and maximum, and the
percentiles asked for (`--percentiles`) besides.

TPOT is the time per output token after the first:
(last token time - first token time) / (tokens - 1). Tokens that arrived in one
event share its arrival time (see `scanner`), so this equals the mean gap
between consecutive tokens. A request with fewer than two tokens has none.
vLLM's `vllm bench serve` computes the same: its request latency ends at the
last chunk that carries tokens.

ITL (inter-token latency) is the distribution of the gaps between successive
output events of every successful streamed request (see `scanner`), counted in a
`LogHistogram`: one value per gap, so long replies weigh more than short ones
(TPOT weighs every request once), as in vLLM's ITL. E2E latency (`latency`) runs
from send to the end of the whole response.

Throughput: over the stage's measured window (its first request's send to the
end of its last response, see `runner`), and over successful requests:
requests, output tokens, input tokens (each request's prompt as the server's
usage counted it, else as the bench sized it, about 4 characters a token) and
their total, per second.

SLOs: a request meets them when it succeeded, its TTFT is at most `ttft_s` (if
set) and its TPOT at most `tpot_s` (if set; a request without a TPOT passes
that half). With no SLO set, every success meets them. Attainment is the
fraction of all the stage's requests (errors included) that meet them; goodput
is how many met them per second of the stage's window (its start to its last
response): requests per second completed within the SLOs. Token goodput is the
tokens of those requests (prompt, as for input tokens below, plus output) per
second of the same window.

Admission (see `admission`): offered = admitted + refused + rejected, over the
stage's recorded requests. Admitted attainment is the fraction of the admitted
requests that succeeded with TTFT at most `ttft_s` (success alone without it):
the promise a TTFT admission makes, so `tpot_s` is not part of it, and an
admitted request that failed is a miss. Successful requests are all admitted,
so the stage's TTFT distribution is that of the admitted successes. Offered
attainment is the fraction of all offered requests that were admitted and met
that promise (admitted attainment times admitted over offered). Refusal
latency is over refused requests, send to the whole 429; Retry-After over the
`ttft_budget_exceeded` refusals that carried one.

Conversations: turns per conversation counts the turns recorded for each
conversation that recorded any; TTFT by turn is over the successful requests of
each turn number (turn 1 is a conversation's first request, with no history to
reuse). How conversations ended comes from the runner (`ConversationCounts`).

Prompt cache: where the server's usage reported `cached_tokens`, the share of
those responses' prompt tokens that were cached (NaN when none reported it).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from narwhal.bench.admission import ADMITTED, REFUSAL_CODES, REFUSED, TTFT_BUDGET, outcome
from narwhal.bench.conversation import ConversationCounts
from narwhal.bench.histogram import LogHistogram
from narwhal.bench.record import Record, error_key

NAN = math.nan
DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """The p-th percentile (0 <= p <= 100) of values sorted ascending."""
    n = len(sorted_values)
    if n == 0:
        return NAN
    rank = (n - 1) * p / 100.0
    low = math.floor(rank)
    high = min(low + 1, n - 1)
    frac = rank - low
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * frac


def percentile_label(p: float) -> str:
    """How a percentile is named in the table and the JSON: p50, p99.9."""
    return f"p{p:.10g}"


@dataclass(frozen=True, slots=True)
class Distribution:
    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    min: float
    max: float
    # The percentiles asked for, (p, value) in their order (p50, p90 and p99 are
    # above whatever was asked: the sweep table and older readers of the JSON use them).
    percentiles: tuple[tuple[float, float], ...] = ()

    def at(self, p: float) -> float:
        """The p-th percentile if it was computed, else NaN."""
        for q, value in self.percentiles:
            if q == p:
                return value
        return {50.0: self.p50, 90.0: self.p90, 99.0: self.p99}.get(p, NAN)


def _empty(percentiles: Sequence[float]) -> Distribution:
    return Distribution(0, NAN, NAN, NAN, NAN, NAN, NAN, tuple((p, NAN) for p in percentiles))


def distribution(
    values: Iterable[float], percentiles: Sequence[float] = DEFAULT_PERCENTILES
) -> Distribution:
    """Mean, percentiles and extremes of the values that are not NaN."""
    kept = sorted(v for v in values if not math.isnan(v))
    if not kept:
        return _empty(percentiles)
    return Distribution(
        count=len(kept),
        mean=math.fsum(kept) / len(kept),
        p50=percentile(kept, 50),
        p90=percentile(kept, 90),
        p99=percentile(kept, 99),
        min=kept[0],
        max=kept[-1],
        percentiles=tuple((p, percentile(kept, p)) for p in percentiles),
    )


def histogram_distribution(
    histogram: LogHistogram, percentiles: Sequence[float] = DEFAULT_PERCENTILES
) -> Distribution:
    """The same figures from a histogram (its percentiles within half a bin)."""
    if not histogram.count:
        return _empty(percentiles)
    return Distribution(
        count=histogram.count,
        mean=histogram.mean,
        p50=histogram.percentile(50),
        p90=histogram.percentile(90),
        p99=histogram.percentile(99),
        min=histogram.min,
        max=histogram.max,
        percentiles=tuple((p, histogram.percentile(p)) for p in percentiles),
    )


def tpot(first_token: float, last_token: float, tokens: int) -> float:
    """Time per output token after the first; NaN with fewer than two tokens."""
    if tokens < 2 or math.isnan(first_token) or math.isnan(last_token):
        return NAN
    return (last_token - first_token) / (tokens - 1)


def record_tpot(record: Record) -> float:
    return tpot(record.ttft, record.last_token, record.tokens)


def token_times(marks: Sequence[float]) -> list[float]:
    """Per-token arrival times from (time, tokens) pairs: k tokens at each event's time."""
    times: list[float] = []
    for i in range(0, len(marks) - 1, 2):
        times.extend([marks[i]] * int(marks[i + 1]))
    return times


@dataclass(frozen=True, slots=True)
class Slo:
    ttft_s: float | None = None
    tpot_s: float | None = None


def meets_slo(record: Record, slo: Slo) -> bool:
    if record.error is not None:
        return False
    if slo.ttft_s is not None and not record.ttft <= slo.ttft_s:  # NaN fails
        return False
    if slo.tpot_s is not None:
        t = record_tpot(record)
        if not math.isnan(t) and t > slo.tpot_s:
            return False
    return True


def attainment(records: Sequence[Record], slo: Slo) -> float:
    """Fraction of the requests that met the SLOs; NaN without requests."""
    if not records:
        return NAN
    return sum(1 for r in records if meets_slo(r, slo)) / len(records)


def goodput(records: Iterable[Record], slo: Slo, window_s: float) -> float:
    """Requests per second that met the SLOs."""
    if window_s <= 0:
        return NAN
    return sum(1 for r in records if meets_slo(r, slo)) / window_s


def token_goodput(records: Iterable[Record], slo: Slo, window_s: float) -> float:
    """Prompt plus output tokens per second of the requests that met the SLOs."""
    if window_s <= 0:
        return NAN
    return sum(input_tokens(r) + r.tokens for r in records if meets_slo(r, slo)) / window_s


def error_counts(records: Iterable[Record]) -> dict[str, int]:
    """Errors by key, most frequent first (ties by name)."""
    counts = Counter(k for k in map(error_key, records) if k is not None)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


@dataclass(frozen=True, slots=True)
class AdmissionSummary:
    offered: int
    admitted: int
    refused: int
    refused_by_code: dict[str, int]  # every refusal code, 0 included
    rejected: int
    admitted_attainment: float
    # The JSON's names (the report encodes this dataclass as it is).
    refusal_latency_s: Distribution
    retry_after_s: Distribution  # of ttft_budget_exceeded refusals

    @property
    def saw_429(self) -> bool:
        return self.refused + self.rejected > 0

    @property
    def offered_attainment(self) -> float:
        """Fraction of all offered requests admitted and within the promise; NaN without
        requests (a property, so the JSON, which encodes the fields, is as it was)."""
        if not self.offered:
            return NAN
        if not self.admitted:
            return 0.0
        return self.admitted_attainment * self.admitted / self.offered


def admission_summary(records: Sequence[Record], slo: Slo) -> AdmissionSummary:
    by_outcome: dict[str, list[Record]] = {}
    for r in records:
        by_outcome.setdefault(outcome(r), []).append(r)
    admitted = by_outcome.get(ADMITTED, [])
    refused = by_outcome.get(REFUSED, [])
    return AdmissionSummary(
        offered=len(records),
        admitted=len(admitted),
        refused=len(refused),
        refused_by_code={c: sum(1 for r in refused if r.code == c) for c in REFUSAL_CODES},
        rejected=len(records) - len(admitted) - len(refused),
        admitted_attainment=attainment(admitted, Slo(ttft_s=slo.ttft_s)),
        refusal_latency_s=distribution(r.latency for r in refused),
        retry_after_s=distribution(r.retry_after for r in refused if r.code == TTFT_BUDGET),
    )


@dataclass(frozen=True, slots=True)
class TurnTtft:
    turn: int  # 1 = a conversation's first request
    ttft: Distribution


@dataclass(frozen=True, slots=True)
class ConversationSummary:
    started: int
    completed: int
    failed: int  # ended by a failed turn
    unreadable: int  # ended by a reply whose text could not be read
    cut: int  # ended by the stage's end or an interrupt
    turns: Distribution  # turns recorded per conversation
    ttft_by_turn: tuple[TurnTtft, ...]  # successful turns, by turn number


def conversation_summary(
    records: Sequence[Record],
    counts: ConversationCounts,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
) -> ConversationSummary:
    turns: Counter[int] = Counter(r.conversation for r in records if r.conversation >= 0)
    by_turn: dict[int, list[float]] = {}
    for r in records:
        if r.turn > 0 and r.error is None:
            by_turn.setdefault(r.turn, []).append(r.ttft)
    return ConversationSummary(
        started=counts.started,
        completed=counts.completed,
        failed=counts.failed,
        unreadable=counts.unreadable,
        cut=counts.cut,
        turns=distribution(float(n) for n in turns.values()),
        ttft_by_turn=tuple(
            TurnTtft(k, distribution(by_turn[k], percentiles)) for k in sorted(by_turn)
        ),
    )


@dataclass(frozen=True, slots=True)
class PromptCache:
    responses: int  # successful responses whose usage reported cached_tokens
    prompt_tokens: int  # their prompt tokens, as the server counted them
    cached_tokens: int

    @property
    def cached_share(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens > 0 else NAN


def prompt_cache(records: Iterable[Record]) -> PromptCache:
    reported = [
        r for r in records if r.error is None and r.cached_tokens >= 0 and r.usage_prompt_tokens > 0
    ]
    return PromptCache(
        responses=len(reported),
        prompt_tokens=sum(r.usage_prompt_tokens for r in reported),
        cached_tokens=sum(r.cached_tokens for r in reported),
    )


@dataclass(frozen=True, slots=True)
class StageSummary:
    requests: int
    ok: int
    errors: int
    error_counts: dict[str, int]
    window_s: float
    requests_per_s: float  # successful requests
    output_tokens: int
    output_tokens_per_s: float
    events_per_s: float
    ttft: Distribution
    tpot: Distribution
    latency: Distribution  # end to end
    attainment: float
    goodput_per_s: float
    admission: AdmissionSummary
    cpu_s: float
    cpu_per_request_s: float
    prompt_cache: PromptCache
    conversations: ConversationSummary | None = None
    input_tokens: int = 0  # successful requests' prompts
    input_from_usage: int = 0  # successful requests whose prompt the server's usage counted
    itl: Distribution = field(default_factory=lambda: _empty(()))
    health: Distribution = field(default_factory=lambda: _empty(()))  # --health-probe
    token_goodput_per_s: float = NAN  # prompt + output tokens of the requests within the SLOs

    @property
    def input_tokens_per_s(self) -> float:
        return _rate(self.input_tokens, self.window_s)

    @property
    def total_tokens_per_s(self) -> float:
        """Input and output tokens per second."""
        return _rate(self.input_tokens + self.output_tokens, self.window_s)


def measured_window(records: Sequence[Record], fallback: float) -> float:
    """From the first request's send to the end of the last response; `fallback` (the
    stage's own span) when nothing was recorded."""
    if not records:
        return fallback
    first = min(r.start for r in records)
    last = max(r.start + r.latency for r in records)
    return last - first


def _rate(count: float, window_s: float) -> float:
    return count / window_s if window_s > 0 else NAN


def input_tokens(record: Record) -> int:
    """The request's prompt tokens: as the server's usage counted them, else as sized."""
    return record.usage_prompt_tokens if record.usage_prompt_tokens >= 0 else record.prompt_tokens


def summarize(
    records: Sequence[Record],
    window_s: float,
    cpu_s: float,
    slo: Slo,
    conversations: ConversationCounts | None = None,
    *,
    itl: LogHistogram | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    health_latency_s: Sequence[float] = (),
) -> StageSummary:
    """Everything the report shows for one stage."""
    ok = [r for r in records if r.error is None]
    tokens = sum(r.tokens for r in ok)
    return StageSummary(
        requests=len(records),
        ok=len(ok),
        errors=len(records) - len(ok),
        error_counts=error_counts(records),
        window_s=window_s,
        requests_per_s=_rate(len(ok), window_s),
        output_tokens=tokens,
        output_tokens_per_s=_rate(tokens, window_s),
        events_per_s=_rate(sum(r.events for r in records), window_s),
        ttft=distribution((r.ttft for r in ok), percentiles),
        tpot=distribution((record_tpot(r) for r in ok), percentiles),
        latency=distribution((r.latency for r in ok), percentiles),
        attainment=attainment(records, slo),
        goodput_per_s=goodput(records, slo, window_s),
        admission=admission_summary(records, slo),
        cpu_s=cpu_s,
        cpu_per_request_s=cpu_s / len(records) if records else NAN,
        prompt_cache=prompt_cache(records),
        conversations=None
        if conversations is None
        else conversation_summary(records, conversations, percentiles),
        input_tokens=sum(input_tokens(r) for r in ok),
        input_from_usage=sum(1 for r in ok if r.usage_prompt_tokens >= 0),
        itl=histogram_distribution(itl if itl is not None else LogHistogram(), percentiles),
        health=distribution(health_latency_s, percentiles),
        token_goodput_per_s=token_goodput(records, slo, window_s),
    )
