"""Whether an engine's prefix index still tells the truth (sans-IO, times passed in).

The router predicts, for every request it places on an engine, how many of its prompt
tokens the engine has cached (`prefix_index`). The engine counts the same thing itself:
vLLM's `vllm:prefix_cache_queries_total` (prompt tokens looked up) and
`vllm:prefix_cache_hits_total` (of those, found cached), cumulative token counters read
at every scrape. `PrefixAccuracy` sets the two side by side over a recent window:

    predicted ratio   predicted hit tokens / prompt tokens placed, over the window
    engine ratio      delta hits / delta queries of the engine's counters, same window

and answers, at each scrape, what the caller must do with the engine's index:

    KEEP        nothing
    RESTARTED   a counter went backwards: the engine restarted with an empty cache,
                so the index describes a cache that no longer exists (clear it)
    DRIFTED     the prediction exceeded the engine's ratio by more than `threshold`
                continuously for longer than `forget_after_s` (clear it)

Only over-prediction counts as drift. Clearing the index lowers the prediction; when the
engine hits more than predicted (the cached output tokens of earlier turns, traffic from
elsewhere), clearing could only widen the gap. And a verdict needs enough traffic:
at least `min_tokens` queried on both sides within the window, and the router's share
of the engine's queries at least `min_share` (otherwise the engine's ratio is mostly
about work the router did not send). A scrape without that evidence restarts the clock:
the disagreement must be seen throughout.

Predictions made before a scrape are compared with the counters' change up to that
scrape; the engine counts a prompt when it schedules it, a queue's wait later, which a
window of tens of seconds absorbs.

Engines without the counters (scraped as None): no drift verdict, and restarts are the
caller's to detect; so is a restart the counters cannot show (an engine back past its
old totals by the next scrape), which the fleet monitor sees as the engine going down.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass
from typing import Final


class Verdict(enum.Enum):
    KEEP = "keep"
    RESTARTED = "restarted"
    DRIFTED = "drifted"


@dataclass(frozen=True, slots=True)
class AccuracyPolicy:
    threshold: float = 0.25  # predicted minus engine hit ratio, absolute
    forget_after_s: float = 60.0  # the disagreement must last longer than this
    window_s: float = 30.0  # the ratios are over the scrapes of this last stretch
    min_tokens: int = 32_768  # queried tokens in the window, each side, to judge
    min_share: float = 0.5  # the router's queries / the engine's queries, to judge

    def __post_init__(self) -> None:
        if not self.window_s > 0:
            raise ValueError("window_s must be positive")
        if self.threshold < 0 or self.forget_after_s < 0 or self.min_tokens < 0:
            raise ValueError("threshold, forget_after_s and min_tokens must not be negative")


@dataclass(frozen=True, slots=True)
class _Interval:
    """One scrape interval: what the router predicted and what the engine counted."""

    at: float
    predicted_hits: float
    predicted_queries: float
    engine_hits: float
    engine_queries: float


_EMPTY: Final = _Interval(0.0, 0.0, 0.0, 0.0, 0.0)


class PrefixAccuracy:
    """One engine's predicted and observed prefix-cache hit ratios."""

    def __init__(self, policy: AccuracyPolicy | None = None) -> None:
        self.policy = policy or AccuracyPolicy()
        self._counters: tuple[float, float] | None = None  # the last (hits, queries)
        self._pending_hits = 0.0  # predicted since the last scrape
        self._pending_queries = 0.0
        self._window: deque[_Interval] = deque()
        self._sums = _EMPTY  # the window's totals
        self._disagree_since: float | None = None

    def placed(self, predicted_hit_tokens: int, prompt_tokens: int) -> None:
        """A request was placed on the engine with this predicted cache hit."""
        self._pending_hits += predicted_hit_tokens
        self._pending_queries += prompt_tokens

    def scraped(self, hits_total: float | None, queries_total: float | None, now: float) -> Verdict:
        """The engine's cumulative counters at `now` (None: the page lacks them)."""
        if hits_total is None or queries_total is None:
            return Verdict.KEEP
        last = self._counters
        self._counters = (hits_total, queries_total)
        if last is None:
            # The first sample is the baseline: what was predicted before it has no
            # engine counts to compare with.
            self._restart()
            return Verdict.KEEP
        if hits_total < last[0] or queries_total < last[1]:
            self._restart()
            return Verdict.RESTARTED
        self._add(
            _Interval(
                now,
                self._pending_hits,
                self._pending_queries,
                hits_total - last[0],
                queries_total - last[1],
            )
        )
        self._pending_hits = self._pending_queries = 0.0
        if self._disagrees_too_long(now):
            self._restart()
            return Verdict.DRIFTED
        return Verdict.KEEP

    def predicted_ratio(self) -> float | None:
        """Predicted hit tokens / prompt tokens placed, over the window (None: none)."""
        sums = self._sums
        return sums.predicted_hits / sums.predicted_queries if sums.predicted_queries else None

    def engine_ratio(self) -> float | None:
        """The engine's hits / queries over the window (None: no queries counted)."""
        sums = self._sums
        return sums.engine_hits / sums.engine_queries if sums.engine_queries else None

    def _add(self, interval: _Interval) -> None:
        window = self._window
        window.append(interval)
        horizon = interval.at - self.policy.window_s
        while window[0].at <= horizon:
            window.popleft()
        # Summed afresh (a window holds tens of scrapes): running sums kept by adding and
        # subtracting would leave rounding residue behind once the window empties.
        self._sums = _Interval(
            interval.at,
            sum(i.predicted_hits for i in window),
            sum(i.predicted_queries for i in window),
            sum(i.engine_hits for i in window),
            sum(i.engine_queries for i in window),
        )

    def _disagrees_too_long(self, now: float) -> bool:
        policy = self.policy
        sums = self._sums
        judged = (
            sums.predicted_queries >= policy.min_tokens
            and sums.engine_queries >= policy.min_tokens
            and sums.predicted_queries >= policy.min_share * sums.engine_queries
        )
        predicted = self.predicted_ratio()
        observed = self.engine_ratio()
        if not judged or predicted is None or observed is None:
            self._disagree_since = None
            return False
        if predicted - observed <= policy.threshold:
            self._disagree_since = None
            return False
        since = self._disagree_since
        if since is None:
            self._disagree_since = now
            return False
        return now - since > policy.forget_after_s

    def _restart(self) -> None:
        """Start judging afresh (a new baseline, a restarted engine, a forgotten index);
        the last counters stay the baseline of the next interval."""
        self._pending_hits = self._pending_queries = 0.0
        self._window.clear()
        self._sums = _EMPTY
        self._disagree_since = None
