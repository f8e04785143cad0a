"""How fast an engine clears the prefills Narwhal has waiting there, learned (sans-IO).

Whatever an engine's scheduler (chunked prefill with any step budget, one prompt at a
time, prefill batches that stall decoding, no continuous batching at all), the prefills
Narwhal places on it are cleared in roughly the order they were placed, and a prompt's
first token cannot come before the prompt tokens ahead of it have been prefilled. So

    TTFT(n) >= (tokens still ahead + n) x seconds per prompt token

where the seconds per prompt token are what the engine spends *while it has Narwhal's
prefills waiting* (its busy time), and are measured rather than derived from any
scheduler's rules. They grow with the sequences decoding there (decode steps share the
engine with prefill, or stall it), so they are fitted as

    seconds per token = alpha + beta x decoding / 100

by least squares over the busy intervals between first tokens (each: the busy seconds
since the last one, the prompt tokens that finished, the mean decode batch meanwhile),
decayed with busy time (`_TAU_S`) and anchored to a prior worth `_PRIOR_S` seconds (the
profile's prefill alone for alpha; beta from the profile's load slope, weakly held).

The work ahead of a new prompt will be decoding by the time it prefills, so a projection
prices its tokens at the decode batch of now plus the prompts ahead of it (capped by the
engine's sequence slots).

Two things are known before any first token says so, from the prompts still waiting:

- a busy period that has lasted `elapsed` seconds with `done` tokens finished and the
  head prompt of `head` tokens not finished shows at least elapsed / (done + head) seconds
  per token: the projection never prices below that (a censored observation), so an
  engine that slows down, or the onset of an overload it serves more slowly than it
  served light load, is seen while its requests wait, not a budget later when their
  first tokens come;
- the work ahead is what is waiting less the head's progress by the model, never less
  than the prompts after the head.

O(1) per placement and finish; the prompts waiting are kept in placement order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final

_TAU_S: Final = 4.0  # seconds of busy time: how fast the fit follows the engine
_PRIOR_S: Final = 0.5  # the prior's weight, in busy seconds
_BETA_STRENGTH: Final = 0.05  # the load slope's prior weight, relative to alpha's
_MAX_SECONDS_PER_TOKEN: Final = 1.0  # a stalled engine stays finite


@dataclass(slots=True)
class PrefillThroughput:
    alpha_prior: float  # seconds per prompt token, nothing decoding (the profile)
    beta_prior: float = 0.0  # more seconds per token per 100 sequences decoding
    max_sequences: int = 256
    _waiting: dict[object, int] = field(default_factory=dict)  # placement order
    _waiting_tokens: int = 0
    _busy_since: float | None = None
    _done: int = 0  # tokens finished in this busy period
    _last: float = 0.0  # the last event's time
    _interval_s: float = 0.0  # busy seconds since the last first token
    _decoding_s: float = 0.0  # their integral of the decode batch (sequence-seconds)
    _decoding: float = 0.0  # the decode batch at the last event
    # Decayed normal equations of  seconds = tokens * alpha + tokens * d * beta.
    _sxx: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])  # 11, 12, 22
    _sxy: list[float] = field(default_factory=lambda: [0.0, 0.0])
    _weight: float = 0.0  # decayed busy seconds the sums hold
    _theta: tuple[float, float] = (0.0, 0.0)

    def __post_init__(self) -> None:
        self._theta = (self.alpha_prior, self.beta_prior)

    def reset(self, alpha_prior: float, beta_prior: float) -> None:
        """A new baseline (a profile): what was learned goes, what waits stays."""
        self.alpha_prior = alpha_prior
        self.beta_prior = beta_prior
        self._sxx = [0.0, 0.0, 0.0]
        self._sxy = [0.0, 0.0]
        self._weight = 0.0
        self._theta = (alpha_prior, beta_prior)

    # --- what happened ------------------------------------------------------------------------

    def placed(self, key: object, tokens: int, now: float, decoding: float) -> None:
        if key in self._waiting:
            self.dropped(key, now, decoding)
        self._advance(now, decoding)
        if not self._waiting:
            self._busy_since = now
            self._done = 0
            self._interval_s = self._decoding_s = 0.0
        tokens = max(1, int(tokens))
        self._waiting[key] = tokens
        self._waiting_tokens += tokens

    def finished(self, key: object, now: float, decoding: float) -> None:
        """The prefill of `key` is done (its first token came at `now`)."""
        tokens = self._waiting.pop(key, None)
        if tokens is None:
            return
        self._advance(now, decoding)
        self._waiting_tokens -= tokens
        self._done += tokens
        if self._interval_s > 0:
            self._learn(tokens, self._interval_s, self._decoding_s / self._interval_s)
        self._interval_s = self._decoding_s = 0.0
        if not self._waiting:
            self._busy_since = None

    def dropped(self, key: object, now: float, decoding: float) -> None:
        """A prefill that will not finish here (failed, cancelled): not a measurement."""
        tokens = self._waiting.pop(key, None)
        if tokens is None:
            return
        self._advance(now, decoding)
        self._waiting_tokens -= tokens
        if not self._waiting:
            self._busy_since = None

    def _advance(self, now: float, decoding: float) -> None:
        elapsed = now - self._last
        if elapsed > 0:
            if self._busy_since is not None:
                self._interval_s += elapsed
                self._decoding_s += elapsed * self._decoding
            self._last = now
        self._decoding = max(0.0, decoding)

    def _learn(self, tokens: int, seconds: float, decoding: float) -> None:
        keep = math.exp(-seconds / _TAU_S)
        x1 = float(tokens)
        x2 = tokens * decoding / 100.0
        # Each interval weighs by 1 / its length, so that in the sums it counts as the
        # busy seconds it lasted (seconds^2 / seconds): long intervals count for their time.
        w = 1.0 / seconds
        sxx, sxy = self._sxx, self._sxy
        sxx[0] = sxx[0] * keep + w * x1 * x1
        sxx[1] = sxx[1] * keep + w * x1 * x2
        sxx[2] = sxx[2] * keep + w * x2 * x2
        sxy[0] = sxy[0] * keep + w * x1 * seconds
        sxy[1] = sxy[1] * keep + w * x2 * seconds
        self._weight = self._weight * keep + seconds
        self._solve()

    def _solve(self) -> None:
        # The prior as pseudo-observations worth _PRIOR_S busy seconds at the prior's
        # slope: its weight per coefficient is that time over the seconds one token takes.
        a0, b0 = self.alpha_prior, self.beta_prior
        k1 = _PRIOR_S / max(a0, 1e-9) ** 2
        k2 = k1 * _BETA_STRENGTH
        sxx, sxy = self._sxx, self._sxy
        m11, m12, m22 = sxx[0] + k1, sxx[1], sxx[2] + k2
        v1, v2 = sxy[0] + k1 * a0, sxy[1] + k2 * b0
        det = m11 * m22 - m12 * m12
        if det <= 0:
            return
        alpha = (v1 * m22 - m12 * v2) / det
        beta = (m11 * v2 - m12 * v1) / det
        # A fit that says decoding makes prefill faster, or that a token costs nothing,
        # is noise on too few intervals: the prior's share holds.
        self._theta = (max(alpha, 0.3 * a0), max(beta, 0.0))

    # --- projections --------------------------------------------------------------------------

    def seconds_per_token(self, decoding: float) -> float:
        alpha, beta = self._theta
        return min(_MAX_SECONDS_PER_TOKEN, alpha + beta * max(0.0, decoding) / 100.0)

    def censored(self, now: float) -> float:
        """Seconds per token the waiting prompts show already (0 when none waits)."""
        since = self._busy_since
        if since is None or not self._waiting:
            return 0.0
        head = next(iter(self._waiting.values()))
        return max(0.0, now - since) / (self._done + head)

    def ahead(self, now: float) -> float:
        """Prompt tokens still to prefill before a prompt placed now could start."""
        if not self._waiting:
            return 0.0
        since = self._busy_since
        assert since is not None
        head = next(iter(self._waiting.values()))
        per_token = max(self.seconds_per_token(self._decoding), self.censored(now))
        progress = max(0.0, now - since) / per_token - self._done
        return self._waiting_tokens - min(max(0.0, progress), head - 1)

    def projection(self, tokens: int, now: float, decoding: float) -> float:
        """Seconds until a prompt of `tokens` placed now is prefilled, by the fit alone:
        its tokens and those ahead at the decode batch there will be by then."""
        batch = min(float(self.max_sequences), decoding + len(self._waiting))
        per_token = max(self.seconds_per_token(batch), self.censored(now))
        return (self.ahead(now) + max(1, tokens)) * per_token

    def view(self) -> dict[str, float]:
        alpha, beta = self._theta
        return {
            "seconds_per_1k_tokens": alpha * 1000.0,
            "per_100_decoding": beta * 1000.0,
            "busy_s": self._weight,
        }

    def __len__(self) -> int:
        return len(self._waiting)
