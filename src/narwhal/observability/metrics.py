"""The router's Prometheus metrics, on a registry of their own (no global state).

Names follow DESIGN.md section 3. Label values come from configuration or from fixed
sets declared here, never from client input, so the number of series stays bounded.
Every series of a fixed label set is created at start, so a dashboard sees zeros
rather than missing series.

Besides Narwhal's own series the registry carries `narwhal_build_info{version}` and
prometheus_client's process and platform collectors (`process_*`, `python_info`), on
this registry rather than the library's global one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, get_args

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)

from narwhal import installed_version
from narwhal.errors import Outcome
from narwhal.observability.exposition import Exposition
from narwhal.protocol.requests import Route

OUTCOMES: Final[tuple[Outcome, ...]] = get_args(Outcome)
ROUTES: Final[tuple[Route, ...]] = get_args(Route)
REJECT_REASONS = ("retention", "queue", "tenant_quota")
# prompt: the prompt alone exceeds the TTFT budget; projected: the projected TTFT does.
REFUSE_REASONS = ("prompt", "projected")
# `shutdown`: a stream still running at the drain deadline after SIGTERM (`drain.py`).
EXPIRY_STAGES = ("admission_wait", "deadline_before_headers", "deadline_streaming", "shutdown")
TOKEN_SOURCES = ("token_ids", "usage", "events")
FAILURE_STAGES = ("before_headers", "after_headers")
# The class and tenant of a request that ended before either was known.
UNKNOWN: Final = "none"
# Which phase timeout ended an attempt (engines/timeouts.py).
TIMEOUT_PHASES = ("first_event", "idle")

_LATENCY_BUCKETS = (
    0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
_TPOT_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05,
    0.075, 0.1, 0.2, 0.3, 0.5, 1.0, 2.5,
)  # fmt: skip
# Whole requests: a few tokens in tens of milliseconds up to long generations of minutes;
# the last bound is the default request deadline (serving.request_timeout_s).
_DURATION_BUCKETS = (
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class EngineSeries:
    ttft: Histogram
    tpot: Histogram
    output_tokens: dict[str, Counter]
    failures: dict[str, Counter]
    timeouts: dict[str, Counter]


@dataclass(frozen=True, slots=True)
class RequestSeries:
    """One route's series for streaming or for non-streaming requests."""

    completed: Histogram  # duration of requests whose outcome is `completed`
    not_completed: Histogram  # duration of every other outcome
    prompt_tokens: Counter
    completion_tokens: Counter


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._exposition = Exposition(self.registry)
        r = self.registry
        self.offered = Counter(
            "narwhal_offered", "Requests that reached a completion route.", registry=r
        )
        self.unsized_offered = Counter(
            "narwhal_unsized_offered",
            "Offered requests whose body ended before workload sizing.",
            registry=r,
        )
        self.invalid_requests = Counter(
            "narwhal_invalid_requests", "Requests refused for a malformed body.", registry=r
        )
        self.rejected = Counter(
            "narwhal_rejected", "Capacity rejections (429).", ["reason"], registry=r
        )
        self.refused = Counter(
            "narwhal_refused", "Predictive refusals (429).", ["reason"], registry=r
        )
        self.expired = Counter(
            "narwhal_expired", "Requests ended by a deadline (504).", ["stage"], registry=r
        )
        self.outcomes = Counter(
            "narwhal_outcomes",
            "Terminal outcome of every offered request.",
            ["outcome"],
            registry=r,
        )
        # By priority class and tenant (labels from the configuration; `none` for a
        # request that ended before its class and tenant were known: no valid key, a
        # malformed X-Narwhal-Priority). Offered equals the sum of outcomes per pair.
        self.class_offered = Counter(
            "narwhal_class_offered",
            "Offered requests by priority class and tenant.",
            ["class", "tenant"],
            registry=r,
        )
        self.class_outcomes = Counter(
            "narwhal_class_outcomes",
            "Terminal outcome of every offered request, by priority class and tenant.",
            ["class", "tenant", "outcome"],
            registry=r,
        )
        self.class_refusals = Counter(
            "narwhal_class_refusals",
            "Rejections and predictive refusals (429) by priority class, tenant and reason.",
            ["class", "tenant", "reason"],
            registry=r,
        )
        self.class_ttft = Counter(
            "narwhal_class_ttft",
            "Completed requests that had a first token, by priority class, tenant and "
            "whether it came within the TTFT budget (attainment).",
            ["class", "tenant", "within_budget"],
            registry=r,
        )
        self.ttft = Histogram(
            "narwhal_ttft_seconds",
            "Time from arrival to the first output token, by engine (in a disaggregated pair "
            "the decode engine; narwhal_prefill_seconds has the prefill engine's part).",
            ["engine"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "narwhal_tpot_seconds",
            "Time per output token after the first, from validated token ids, by engine.",
            ["engine"],
            buckets=_TPOT_BUCKETS,
            registry=r,
        )
        self.output_tokens = Counter(
            "narwhal_output_tokens",
            "Output tokens relayed, by engine and how they were counted.",
            ["engine", "source"],
            registry=r,
        )
        self.engine_failures = Counter(
            "narwhal_engine_failures",
            "Attempts an engine failed, by engine and whether the response had started "
            "(before_headers attempts may be retried elsewhere; after_headers end the stream).",
            ["engine", "stage"],
            registry=r,
        )
        self.upstream_timeouts = Counter(
            "narwhal_upstream_timeouts",
            "Attempts ended by a phase timeout, by engine and phase: first_event (no event "
            "within fleet.first_event_timeout_s: retried elsewhere) or idle (a silence past "
            "fleet.idle_timeout_s after the first event). Each is an engine failure too.",
            ["engine", "phase"],
            registry=r,
        )
        self.retained = Gauge(
            "narwhal_retained_requests", "Requests the router holds right now.", registry=r
        )
        self.queue_depth = Gauge(
            "narwhal_admission_queue_depth", "Requests waiting for a prefill slot.", registry=r
        )
        self.prefill_slots = Gauge(
            "narwhal_prefill_slots_in_use", "Requests between dispatch and first token.", registry=r
        )
        self.decode_slots = Gauge(
            "narwhal_decode_slots_in_use",
            "Requests between first token and last event.",
            registry=r,
        )
        self.engine_requests = Gauge(
            "narwhal_engine_requests",
            "Requests Narwhal has on each engine, by phase: prefill (placed, prefill not "
            "done there) and decode (past the first token).",
            ["engine", "phase"],
            registry=r,
        )
        self.ttft_prediction_error = Histogram(
            "narwhal_ttft_prediction_error_ratio",
            "Predictive admission: |measured - expected| / measured TTFT of admitted requests.",
            buckets=(0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0),
            registry=r,
        )
        self.refusal_latency = Histogram(
            "narwhal_refusal_latency_seconds",
            "Predictive admission: time from a request's arrival to its 429 refusal.",
            buckets=(0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.5),
            registry=r,
        )
        self.admission_wait = Histogram(
            "narwhal_admission_wait_seconds",
            "Time from admission to a prefill slot (zero when one was free).",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        # `completed` rather than the full outcome: without a split, millisecond refusals
        # drag the served requests' quantiles down; nine outcomes would be 36 series of 18
        # samples each on every scrape (rendered on the event loop, ~2.8 ms) for durations
        # that matter little beyond served or not (the counts by outcome are above).
        self.request_duration = Histogram(
            "narwhal_request_duration_seconds",
            "Time from a completion request's arrival to the end of its response (a stream's "
            "last write, a JSON body's handover to the connection), every outcome, by route, "
            "stream (as the body asked; false when it could not be parsed) and completed "
            "(true: outcome completed; false: any other, counted by outcome in "
            "narwhal_outcomes_total).",
            ["route", "stream", "completed"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "narwhal_prompt_tokens",
            "Prompt tokens of requests an engine answered, by route and stream: the engine's "
            "usage.prompt_tokens, or the router's sizing where the engine sent no usage (the "
            "count the client's usage carries).",
            ["route", "stream"],
            registry=r,
        )
        self.completion_tokens = Counter(
            "narwhal_completion_tokens",
            "Output tokens of requests an engine answered, by route and stream (validated "
            "token IDs; usage or events where the engine supplies no IDs).",
            ["route", "stream"],
            registry=r,
        )
        self.prefill = Histogram(
            "narwhal_prefill_seconds",
            "Disaggregated pairs: time from sending a request to its prefill engine to that "
            "engine's answer (the prefill half of the decode engine's TTFT), by prefill engine.",
            ["engine"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        build_info = Gauge(
            "narwhal_build_info",
            "Always 1; the running Narwhal's version.",
            ["version"],
            registry=r,
        )
        build_info.labels(installed_version()).set(1)
        # The standard process_* and python_info series, on this registry: the library's
        # global one is shared by every router in a process (tests, embedded engines).
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        for outcome in OUTCOMES:
            self.outcomes.labels(outcome)
        for reason in REJECT_REASONS:
            self.rejected.labels(reason)
        for reason in REFUSE_REASONS:
            self.refused.labels(reason)
        for stage in EXPIRY_STAGES:
            self.expired.labels(stage)
        # Resolved once: label lookups take a lock and a dict probe on every call.
        self._outcome_children = {o: self.outcomes.labels(o) for o in OUTCOMES}
        self.offered_count = 0  # as narwhal_offered_total, without a collection
        self.ended = 0  # as the sum of narwhal_outcomes_total
        self._engine_series: dict[str, EngineSeries] = {}
        self._prefill_series: dict[str, Histogram] = {}
        self._request_series = {
            (route, stream): self._resolve_request_series(route, "true" if stream else "false")
            for route in ROUTES
            for stream in (True, False)
        }

    def _resolve_request_series(self, route: Route, stream: str) -> RequestSeries:
        return RequestSeries(
            completed=self.request_duration.labels(route, stream, "true"),
            not_completed=self.request_duration.labels(route, stream, "false"),
            prompt_tokens=self.prompt_tokens.labels(route, stream),
            completion_tokens=self.completion_tokens.labels(route, stream),
        )

    def request_series(self, route: Route, stream: bool) -> RequestSeries:
        return self._request_series[route, stream]

    def observe_duration(
        self, route: Route, stream: bool, outcome: Outcome, seconds: float
    ) -> None:
        series = self._request_series[route, stream]
        histogram = series.completed if outcome == "completed" else series.not_completed
        histogram.observe(seconds)

    def prefill_series(self, engine: str) -> Histogram:
        """A prefill engine's `narwhal_prefill_seconds`, resolved once per engine name."""
        series = self._prefill_series.get(engine)
        if series is None:
            series = self._prefill_series[engine] = self.prefill.labels(engine)
        return series

    def engine_series(self, engine: str) -> EngineSeries:
        """The per-engine series, resolved once per engine name (from configuration)."""
        series = self._engine_series.get(engine)
        if series is None:
            series = self._engine_series[engine] = EngineSeries(
                ttft=self.ttft.labels(engine),
                tpot=self.tpot.labels(engine),
                output_tokens={s: self.output_tokens.labels(engine, s) for s in TOKEN_SOURCES},
                failures={s: self.engine_failures.labels(engine, s) for s in FAILURE_STAGES},
                timeouts={p: self.upstream_timeouts.labels(engine, p) for p in TIMEOUT_PHASES},
            )
        return series

    def count_outcome(self, outcome: Outcome) -> None:
        self._outcome_children[outcome].inc()
        self.ended += 1

    @property
    def counted(self) -> tuple[int, int]:
        """Requests offered and ended so far, cheaply (a relay worker sends its metrics
        when these move)."""
        return self.offered_count, self.ended

    def class_series(self, classes: Iterable[str], tenants: Iterable[str]) -> None:
        """Every class and tenant's series from the start (and each reload's new ones):
        zeros, not gaps."""
        pairs = [(c, t) for c in classes for t in tenants] + [(UNKNOWN, UNKNOWN)]
        for cls, tenant in pairs:
            self.class_offered.labels(cls, tenant)
            for outcome in OUTCOMES:
                self.class_outcomes.labels(cls, tenant, outcome)
            for reason in (*REJECT_REASONS, *REFUSE_REASONS):
                self.class_refusals.labels(cls, tenant, reason)
            for within in ("true", "false"):
                self.class_ttft.labels(cls, tenant, within)

    def count_class(
        self,
        cls: str,
        tenant: str,
        outcome: Outcome,
        *,
        refusal: str | None = None,
        within_budget: bool | None = None,
    ) -> None:
        """One request's end, by its class and tenant: its outcome, why it was refused
        (a 429's reason), whether its first token came within the budget."""
        self.class_offered.labels(cls, tenant).inc()
        self.class_outcomes.labels(cls, tenant, outcome).inc()
        if refusal is not None:
            self.class_refusals.labels(cls, tenant, refusal).inc()
        if within_budget is not None:
            self.class_ttft.labels(cls, tenant, "true" if within_budget else "false").inc()

    def render(self) -> bytes:
        return self._exposition.render()


# The distribution's name on the package index: "narwhal" there is an unrelated project.
