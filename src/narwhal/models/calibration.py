"""How one engine's TTFT projections turn out, and the bound admission uses (sans-IO).

Every request placed on an engine is projected there at placement (`raw`, seconds from
placement to its first token) and measured at its first token. The error is neither
purely multiplicative (a rate the model has wrong: long projections are off by more) nor
purely additive (a step in progress, a scheduling hiccup of the host: short projections
are off by a few milliseconds that would be a large ratio). So the error is followed as

    r = (measured + s) / (raw + s)          s = a share of the budget

which is a ratio for projections much longer than s and a difference for shorter ones.
Its distribution is kept in decayed histograms (`narwhal.models.histogram`), so it
follows an engine that changes, and gives

    expected(raw) = (raw + s) * median(r) - s
    upper(raw)    = (raw + s) * q(r) - s,   q the `quantile` (0.995) of r

The error is not the same for all projections: a short one is mostly a step's rounding,
a long one a queue's, which averages over many prompts. Admission decides by the long
ones (a request is refused when its bound nears the budget), so the distribution is kept
per class of projection (`_CLASSES`, shares of the budget) as well as over all of them,
and a class's own distribution is read once it has `_OWN` samples; before, the overall
one stands for it. Each class has its own s (`_ADDITIVE`): the error of a short
projection is what joins its step (on a chunked engine a long prompt that arrives before
the step starts shares it, and adds its own prefill, a tenth of a second or more, whatever
the projection was), a difference over the whole class, which a ratio at a tenth of the
budget would read as 3x on its shortest projections and 1.7x on its longest, bounding the
first too tight and the last too wide (in virtual time over the sim's disciplines, 3 seeds
at 0.5x-3x and a step: over bound pooled 1.06% with one s, 0.97% with these).
Projections made while the engine had nothing of Narwhal's in flight are a class of their
own, and only they: an idle engine's first token is its prompt's
prefill, which the probes measured, whatever queues have done to the other classes (so
an engine that queueing made look hopeless can still take a prompt when it is idle, and
be learned again; without it, a bound that refused everything would never see the
measurement that lowers it). Among them, those that nothing joined before their first
token are a class again (`alone`): the prompt's own prefill, which the prompt-alone 429
is about (read from `_OWN` samples on; the prior margin before, since that 429 is not to
be retried); an idle engine's first token is often later, since what arrives during a
prefill can share its steps, and the idle class bounds what is admitted there.

Before `_FIRM` samples a bound cannot be read from a histogram alone (the 99.5th
percentile of 20 samples is their maximum, and says little): it is the larger of the
histogram's value and a prior margin that fades as samples come (`prior` at none, 1 at
`_FIRM`; wider for the classes of a queue's wait than for a prompt's own prefill), so a
new engine is admitted cautiously and not forever; and the histogram's
value is read at a quantile that leaves out the largest sample until the quantile lies
between samples (400 of them at 99.5%), so that one outlier does not set the bound.

Quantiles are read lazily, every `_REFRESH` samples of a histogram: O(1) per projection.
"""

from __future__ import annotations

import bisect
import math
from typing import Final

from narwhal.models.histogram import DecayedHistogram

# A new engine's bounds, before its projections have been seen: of a prompt's own prefill
# (which the probes measured) and of every other projection (a queue's wait, which they
# did not: on a real vLLM at 3x, 7 of the 10 first tokens later than their bound in a run
# came in its first 1.5 s, up to 1.7x later than projected, before the lane and the fits
# had learnt the load). Wider still did worse on a sim whose errors come in runs: with no
# early miss to widen it, the bound met its first run of misses as the prior faded.
PRIOR_MARGIN: Final = 1.3
QUEUE_PRIOR_MARGIN: Final = 1.65
_CLASSES: Final = (0.2, 0.5)  # class edges, in shares of the budget
# Each class's s (see above), in shares of the budget, from the shortest projections to
# the longest: a short projection is off by what the prompts that join its step add,
# seconds whatever it was, where a long one is off by a rate. The other distributions
# (all, idle, alone) keep a tenth: a prior margin is a ratio on raw + s, and a wider s
# would widen a new engine's bound on an idle engine's short prompt by as much again.
_ADDITIVE: Final = (0.4, 0.25, 0.1)
_OWN: Final = 60  # samples from which a class's own distribution is read
_FIRM: Final = 400  # samples after which a histogram alone says the bound
_REFRESH: Final = 8  # samples between two readings of a histogram's quantiles
_HALF_LIFE: Final = 1500.0  # samples
# The bound's own coverage, followed: a first token later than its bound widens the
# class's bounds by _STEP (in log terms), each one within narrows them by _STEP x target,
# so they settle where about target of the first tokens exceed them, whatever the
# histogram missed (errors that come in runs: the prompts that join a step, a burst; a
# class read from another's samples). Misses come together (a host stall, an engine's
# hiccup: every request in flight is late at once), so the misses of one _RUN_S window
# widen once, and the widening is bounded by _INFLATION: one stall must not hold the
# bounds wide for the next thousand requests. The coverage promised is per request,
# though: a run of five misses is five late first tokens. So the target per run is the
# target per request over the mean length of the runs seen (a decayed mean, weight
# _RUN_WEIGHT, within _RUN_LENGTH): where misses come five at a time, the bound settles
# where a fifth as many runs begin.
_STEP: Final = 0.15
_RUN_S: Final = 1.0
_RUN_WEIGHT: Final = 0.25
_RUN_LENGTH: Final = (1.0, 10.0)
_INFLATION: Final = (0.8, 1.6)
_LOWEST: Final = 0.05
_HIGHEST: Final = 50.0


class _Errors:
    """The error distribution of one class of projections, its median and bound."""

    __slots__ = (
        "_histogram",
        "_last_miss",
        "_prior",
        "_run",
        "_since",
        "additive_s",
        "inflation",
        "median",
        "run_length",
        "upper",
    )

    def __init__(self, prior: float, additive_s: float) -> None:
        self._prior = prior
        self.additive_s = additive_s
        self._histogram = DecayedHistogram(
            _LOWEST, _HIGHEST, ratio=2 ** (1 / 16), half_life=_HALF_LIFE
        )
        self._since = 0
        self.median = 1.0
        self.upper = prior
        self.inflation = 1.0
        self._last_miss = -math.inf
        self._run = 0  # misses in the run that began at _last_miss
        self.run_length = 1.0  # misses per run, a decayed mean

    def outcome(self, exceeded: bool, target: float, now: float) -> None:
        """Whether a first token (at `now`) came later than the bound it was admitted
        under; `target`: the share of first tokens that may."""
        in_run = now - self._last_miss < _RUN_S
        if self._run and not in_run:
            # The run is over: its length joins the mean.
            low, high = _RUN_LENGTH
            mean = self.run_length + _RUN_WEIGHT * (self._run - self.run_length)
            self.run_length = min(high, max(low, mean))
            self._run = 0
        if exceeded:
            self._run += 1
            if in_run:
                return  # the same run of misses: it widened when it began
            self._last_miss = now
        target /= self.run_length
        step = _STEP * ((1.0 - target) if exceeded else -target)
        self.inflation = min(_INFLATION[1], max(_INFLATION[0], self.inflation * math.exp(step)))

    @property
    def samples(self) -> int:
        return self._histogram.samples

    def add(self, raw: float, measured: float, quantile: float) -> None:
        s = self.additive_s
        histogram = self._histogram
        histogram.add((measured + s) / (raw + s))
        self._since += 1
        if self._since < _REFRESH and histogram.samples > _REFRESH:
            return
        self._since = 0
        median = histogram.quantile(0.5)
        # Over few samples the quantile is their largest: one request a host stall held
        # for a second would set every bound for the next hundreds. Until there are enough
        # for the quantile to lie between samples, the second largest stands for it (the
        # prior covers the few).
        upper = histogram.quantile(min(quantile, 1.0 - 2.0 / max(4, histogram.samples)))
        if median is None or upper is None:
            return
        # A prior that fades linearly over the first _FIRM samples.
        firm = min(1.0, histogram.samples / _FIRM)
        self.median = median
        prior = self._prior
        self.upper = max(upper, prior + (1.0 - prior) * firm, median)


class Calibration:
    __slots__ = (
        "_all",
        "_alone",
        "_budget_s",
        "_classes",
        "_edges",
        "_idle",
        "_prior",
        "additive_s",
        "prior",
        "quantile",
        "queue_prior",
    )

    def __init__(
        self,
        *,
        budget_s: float,
        quantile: float = 0.995,
        prior: float = PRIOR_MARGIN,
        queue_prior: float = QUEUE_PRIOR_MARGIN,
    ) -> None:
        if not (budget_s > 0 and 0.5 < quantile < 1 and prior >= 1 and queue_prior >= 1):
            raise ValueError("need budget_s > 0, 0.5 < quantile < 1 and priors >= 1")
        # Errors much smaller than a tenth of the budget decide nothing: below that they
        # count as differences, above it as ratios.
        self.additive_s = 0.1 * budget_s
        self.quantile = quantile
        self.prior = prior
        self.queue_prior = queue_prior
        self._edges = tuple(edge * budget_s for edge in _CLASSES)
        self._budget_s = budget_s
        self._prior = _Errors(prior, self.additive_s)  # never fed: the prior margin alone
        self.reset()

    @property
    def samples(self) -> int:
        return self._all.samples

    def add(
        self,
        raw: float,
        measured: float,
        *,
        idle: bool = False,
        alone: bool = False,
        upper: float | None = None,
        now: float = 0.0,
    ) -> None:
        """A projection (seconds) and what it turned into (seconds, same origin); `idle`:
        made while the engine had nothing of Narwhal's in flight; `alone`: idle, and
        nothing placed there either until its first token (its prompt's own prefill);
        `upper`: the bound it was given then; `now`: when its first token came."""
        if not (math.isfinite(raw) and math.isfinite(measured)) or raw < 0 or measured < 0:
            return
        if upper is not None and math.isfinite(upper):
            self._errors(raw, idle).outcome(measured > upper, 1.0 - self.quantile, now)
        quantile = self.quantile
        if idle:
            self._idle.add(raw, measured, quantile)
            if alone:
                self._alone.add(raw, measured, quantile)
            return
        self._all.add(raw, measured, quantile)
        self._classes[bisect.bisect_right(self._edges, raw)].add(raw, measured, quantile)

    def _errors(self, raw: float, idle: bool = False, alone: bool = False) -> _Errors:
        if alone:
            # The prompt-alone 429 says "do not retry": it reads its class once the class
            # has _OWN samples, and the prior until then. A few prompts alone on a host
            # busy for a moment would otherwise refuse every long prompt for good.
            return self._alone if self._alone.samples >= _OWN else self._prior
        if idle:
            return self._idle
        index = bisect.bisect_right(self._edges, raw)
        for errors in reversed(self._classes[: index + 1]):
            if errors.samples >= _OWN:
                return errors
        return self._all

    @property
    def factor(self) -> float:
        """The ratio the bound applies over all projections (for operators)."""
        return self._all.upper

    @property
    def bias(self) -> float:
        return self._all.median

    def expected(self, raw: float, *, idle: bool = False) -> float:
        errors = self._errors(raw, idle)
        s = errors.additive_s
        return max(0.0, (raw + s) * errors.median - s)

    def upper(
        self, raw: float, lateness: float = 1.0, *, idle: bool = False, alone: bool = False
    ) -> float:
        """The bound: `lateness` (>= 1) widens it further while the engine's requests in
        flight are already later than their own bounds said (see `EngineModel`). `alone`:
        of the prompt's own prefill, nothing beside it (the prompt-alone 429's)."""
        errors = self._errors(raw, idle, alone)
        s = errors.additive_s
        factor = max(errors.median, errors.upper * errors.inflation)
        return max(raw, (raw + s) * factor * max(1.0, lateness) - s)

    def reset(self) -> None:
        """A new engine behind the name (its first profile, or it restarted)."""
        s, budget = self.additive_s, self._budget_s
        self._all = _Errors(self.queue_prior, s)
        self._classes = [_Errors(self.queue_prior, share * budget) for share in _ADDITIVE]
        self._idle = _Errors(self.queue_prior, s)
        self._alone = _Errors(self.prior, s)
