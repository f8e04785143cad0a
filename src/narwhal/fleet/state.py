"""What the router knows about one engine's health and load, and how checks change it.

Sans-IO: the monitor performs the probes and passes each outcome in with the time
(`time.monotonic()`), so every decision here is exact under test.

Health: an engine starts `unknown` (not placeable) and the monitor checks it at once on
start. One passing /health check makes it `up`. Failures take it `down` after a number
of consecutive failed checks that depends on the latest failure (`STRIKES_TO_DOWN`):
an engine that refuses connections or answers 503 has said it is gone, so one is enough;
a timeout or an odd status may be one slow or garbled answer, so it takes two in a row.

Metrics (DESIGN.md §4): a 404 (or, for the `openai` dialect, a page without any load
metric) before /metrics has ever worked means the engine has none: `unsupported`, not a
failure, and the engine is placed on /health alone. Once /metrics has worked, failing to
read it is a monitoring failure as soon as the last good scrape is older than
`stale_after_s`: the scheduler would be placing work on stale load figures.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Final, Literal

from narwhal.fleet.scrape import EngineScrape
from narwhal.protocol.dialects import DialectCapabilities


class HealthCheck(enum.Enum):
    """The outcome of one GET /health."""

    OK = "ok"  # any 2xx
    UNREACHABLE = "unreachable"  # connection refused, no route, name not resolved
    UNHEALTHY = "unhealthy"  # 503: vLLM's EngineDeadError, transformers' "unhealthy"
    TIMEOUT = "timeout"  # no complete answer within fleet.probe_timeout_s
    BAD_STATUS = "bad_status"  # any other status
    ERROR = "error"  # connection dropped mid-answer, malformed HTTP, ...
    TOO_LARGE = "too_large"  # an answer over fleet.max_probe_answer_bytes


class MetricsFailure(enum.Enum):
    """Why one GET /metrics gave no load figures."""

    ABSENT = "absent"  # 404, or an `openai` engine's page with no load metric on it
    UNREADABLE = "unreadable"  # 200, but none of the dialect's load metrics on the page
    BAD_STATUS = "bad_status"
    TIMEOUT = "timeout"
    UNREACHABLE = "unreachable"
    ERROR = "error"
    TOO_LARGE = "too_large"  # an answer over fleet.max_probe_answer_bytes


ScrapeResult = EngineScrape | MetricsFailure

# Consecutive failed health checks that take an engine out, keyed by the latest failure.
STRIKES_TO_DOWN: Final[dict[HealthCheck, int]] = {
    HealthCheck.UNREACHABLE: 1,
    HealthCheck.UNHEALTHY: 1,
    HealthCheck.TIMEOUT: 2,
    HealthCheck.BAD_STATUS: 2,
    HealthCheck.ERROR: 2,
    HealthCheck.TOO_LARGE: 2,
}

Status = Literal["unknown", "up", "down"]
MetricsState = Literal["ok", "unsupported", "failed", "unknown"]


@dataclass(slots=True)
class EngineHealth:
    """One engine's monitored state. Read it; only the monitor records into it."""

    stale_after_s: float
    status: Status = "unknown"
    last_health_ok_at: float | None = None
    consecutive_failures: int = 0
    last_failure: HealthCheck | None = None
    last_scrape: EngineScrape | None = None  # the last good one
    last_scrape_at: float | None = None
    # Narwhal's own requests on the engine when that scrape answered: the scrape's counts
    # beyond them are work Narwhal did not place (FleetMonitor.count_own_requests).
    own_at_scrape: int = 0
    # None: not known yet; False: the engine has no metrics (not a failure).
    metrics_supported: bool | None = None
    last_scrape_failed: bool = False
    monitoring_failed: bool = False
    # Whether GET /v1/models lists the configured model: None while unknown (not checked,
    # or the engine has no usable list), False keeps the engine out of placement.
    serves_model: bool | None = None
    # The configured model's context length, when the engine's /v1/models says it.
    max_model_len: int | None = None
    # True while GET /v1/models answers 401/403: the engine wants a key the router does
    # not have (engines[].api_key), so every request would fail; out of placement.
    credentials_refused: bool = False
    # The version from GET /version (vLLM), once read: None while unknown.
    version: str | None = None
    # False for a vLLM older than return_token_ids (0.10.2): it sends no token IDs.
    # None: not known. It never takes an engine out of placement (a custom build's
    # version string could be wrong): its capabilities say to ask it for none.
    supplies_token_ids: bool | None = None
    # What the engine can do, resolved from its dialect and what it reported (its
    # version): what every consumer reads (`EngineEntry.capabilities`). None until the
    # monitor resolved it: the dialect's then.
    capabilities: DialectCapabilities | None = None
    # Restarts seen without the engine going down: its metrics' counters (which count
    # from the engine's start) went back. A new process may serve with other limits:
    # `recheck` asks the monitor to read its /v1/models and /version again, and until
    # then the profiler waits for them.
    restarts: int = 0
    recheck: bool = False
    # The last good scrape since the engine was last seen up: what counters are compared
    # with (one from before it went down would find every comeback a restart).
    counters_since_up: EngineScrape | None = None
    # Why each probe whose last answer was refused for its size failed, by path
    # ("/metrics": "/metrics answer over fleet.max_probe_answer_bytes (8388608 bytes)");
    # a path leaves once its probe gets an answer within the bounds again.
    oversized: dict[str, str] = field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        return self.status == "up"

    @property
    def placeable(self) -> bool:
        return (
            self.healthy
            and not self.monitoring_failed
            and self.serves_model is not False
            and not self.credentials_refused
        )

    def record_health(self, check: HealthCheck, now: float) -> None:
        if check is HealthCheck.OK:
            self.status = "up"
            self.last_health_ok_at = now
            self.consecutive_failures = 0
            self.last_failure = None
            return
        self.consecutive_failures += 1
        self.last_failure = check
        if self.consecutive_failures >= STRIKES_TO_DOWN[check]:
            self.status = "down"
            self.counters_since_up = None  # it comes back a new process, already known

    def record_scrape(self, result: ScrapeResult, now: float, own: int = 0) -> None:
        if isinstance(result, EngineScrape):
            self.own_at_scrape = own
            if _counters_went_back(self.counters_since_up, result):
                self.restarts += 1
                self.recheck = True
            self.counters_since_up = result
            self.last_scrape = result
            self.last_scrape_at = now
            self.metrics_supported = True
            self.last_scrape_failed = False
        elif self.metrics_supported:
            # It worked before: whatever the reason now, including a 404, it is broken.
            self.last_scrape_failed = True
        elif result is MetricsFailure.ABSENT:
            self.metrics_supported = False
        # Other failures before /metrics ever worked (the engine not up yet) leave it
        # unknown: nothing has been lost that the scheduler relied on.
        self.refresh(now)

    def refresh(self, now: float) -> None:
        """Re-evaluate what depends on time alone: staleness of the last good scrape."""
        age = self.scrape_age(now)
        self.monitoring_failed = (
            self.last_scrape_failed and age is not None and age > self.stale_after_s
        )

    def scrape_age(self, now: float) -> float | None:
        return None if self.last_scrape_at is None else max(0.0, now - self.last_scrape_at)

    def metrics_state(self) -> MetricsState:
        if self.monitoring_failed:
            return "failed"
        if self.metrics_supported is None:
            return "unknown"
        return "ok" if self.metrics_supported else "unsupported"


def _counters_went_back(before: EngineScrape | None, now: EngineScrape) -> bool:
    """Whether counters that only grow while an engine runs are lower than they were."""
    if before is None:
        return False
    pairs = (
        (before.prefix_cache_queries, now.prefix_cache_queries),
        (before.prefix_cache_hits, now.prefix_cache_hits),
    )
    return any(b is not None and n is not None and n < b for b, n in pairs)
