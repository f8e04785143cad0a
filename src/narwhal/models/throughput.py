"""How fast an engine clears the prefills Narwhal has waiting there, learned (sans-IO).

Whatever an engine's scheduler (chunked prefill with any step budget, one prompt at a
time, prefill batches that stall decoding, no continuous batching at all), the prefills
Narwhal places on it are cleared in roughly the order they were placed, and a prompt's
first token cannot come before the prompt tokens ahead of it have been prefilled. So

    TTFT(n) >= (tokens still ahead + n) x seconds per prompt token + the prompts' own costs

where the seconds per prompt token are what the engine spends *while it has Narwhal's
prefills waiting* (its busy time), and are measured rather than derived from any
scheduler's rules. They grow with the sequences decoding there (decode steps share the
engine with prefill, or stall it), and an engine that prefills one prompt a step pays a
step's fixed cost per prompt, so the busy time is fitted as

    seconds = tokens x (alpha + beta x decoding / 100) + prompts x gamma

by least squares over the busy intervals between first tokens (each: the busy seconds
since the last one, the prompts and their tokens that finished, the mean decode batch
meanwhile), decayed with busy time (`_TAU_S`) and anchored to a prior worth `_PRIOR_S`
seconds (the profile's prefill alone for alpha, its intercept for gamma, its load slope
for beta; gamma and beta weakly held).

The work ahead of a new prompt will be decoding by the time it prefills, so a projection
prices its tokens at the decode batch of now plus the prompts ahead of it (capped by the
engine's sequence slots).

Two things are known before any first token says so, from the prompts still waiting:

- a busy period that has lasted `elapsed` seconds with `done` tokens finished and the
  head prompt of `head` tokens not finished shows at least elapsed / (done + head +
  beside) seconds per token, `beside` the tokens of the prompts after the head that its
  last step may hold as well (the step's budget; none on an engine that serves one
  request at a time; at most those waiting): the projection never prices below that (a
  censored observation), so an engine that slows down, or the onset of an overload it
  serves more slowly than it served light load, is seen while its requests wait, not a
  budget later when their first tokens come. Without `beside`, a batch of prompts
  prefilled in one step would read as an engine that many times slower than it is;
- the work ahead is what is waiting less the head's progress by the model, never less
  than the prompts after the head.

O(1) per placement and finish; the prompts waiting are kept in placement order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final

_TAU_S: Final = 5.0  # seconds of busy time: how fast the fit follows the engine
_PRIOR_S: Final = 0.2  # the prior's weight, in busy seconds
_WEAK: Final = 0.05  # the load slope's prior weight, against alpha's
_MAX_SECONDS_PER_TOKEN: Final = 1.0  # a stalled engine stays finite


@dataclass(slots=True)
class PrefillThroughput:
    alpha_prior: float  # seconds per prompt token, nothing decoding (the profile)
    beta_prior: float = 0.0  # more seconds per token per 100 sequences decoding
    gamma_prior: float = 0.0  # seconds per prompt whatever its length
    max_sequences: int = 256
    _waiting: dict[object, int] = field(default_factory=dict)  # placement order
    _waiting_tokens: int = 0
    _busy_since: float | None = None
    _done: int = 0  # tokens finished in this busy period
    _last: float = 0.0  # the last event's time
    _interval_s: float = 0.0  # busy seconds since the last first token
    _decoding_s: float = 0.0  # their integral of the decode batch (sequence-seconds)
    _decoding: float = 0.0  # the decode batch at the last event
    _finished: int = 0  # prompts finished in the interval
    # Decayed normal equations of  seconds = tokens*alpha + tokens*d*beta + prompts*gamma.
    _sxx: list[list[float]] = field(default_factory=lambda: _zeros(3, 3))
    _sxy: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    _weight: float = 0.0  # decayed busy seconds the sums hold
    _theta: tuple[float, float, float] = (0.0, 0.0, 0.0)
    _last_sample: tuple[float, float] | None = None  # (seconds, decoding) of the last one
    _last_x: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def __post_init__(self) -> None:
        self._theta = (self.alpha_prior, self.beta_prior, self.gamma_prior)

    def reset(self, alpha_prior: float, beta_prior: float, gamma_prior: float) -> None:
        """A new baseline (a profile): what was learned goes, what waits stays."""
        self.alpha_prior = alpha_prior
        self.beta_prior = beta_prior
        self.gamma_prior = gamma_prior
        self._sxx = _zeros(3, 3)
        self._sxy = [0.0, 0.0, 0.0]
        self._weight = 0.0
        self._theta = (alpha_prior, beta_prior, gamma_prior)

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
        else:
            # One step's other first tokens, at the same instant: the step's interval was
            # counted with the first of them; their tokens belong to it as well.
            self._learn_more(tokens)
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
        self._decoding = decoding if math.isfinite(decoding) and decoding > 0 else 0.0

    def _learn(self, tokens: int, seconds: float, decoding: float) -> None:
        keep = math.exp(-seconds / _TAU_S)
        self._last_sample = (seconds, decoding)
        self._add(keep, (float(tokens), tokens * decoding / 100.0, 1.0), seconds)
        self._weight = self._weight * keep + seconds
        self._solve()

    def _learn_more(self, tokens: int) -> None:
        """Another prompt finished with the last one: the last sample held its tokens too.
        Taken back and added again with them (the sums are linear)."""
        last = self._last_sample
        if last is None:
            return
        seconds, decoding = last
        prev = self._last_x
        self._add(1.0, prev, seconds, sign=-1.0)
        x = (prev[0] + tokens, prev[1] + tokens * decoding / 100.0, prev[2] + 1.0)
        self._add(1.0, x, seconds)
        self._solve()

    def _add(
        self, keep: float, x: tuple[float, float, float], seconds: float, sign: float = 1.0
    ) -> None:
        # Each interval weighs by 1 / its tokens: with one feature the fit is then the
        # ratio of busy seconds to tokens over all intervals, each counting for its tokens.
        w = sign / max(1.0, x[0])
        sxx, sxy = self._sxx, self._sxy
        for i in range(3):
            row = sxx[i]
            for j in range(3):
                row[j] = row[j] * keep + w * x[i] * x[j]
            sxy[i] = sxy[i] * keep + w * x[i] * seconds
        if sign > 0:
            self._last_x = x

    def _solve(self) -> None:
        # The prior as pseudo-observations: the tokens the prior rate clears in _PRIOR_S
        # seconds (at 100 sequences decoding for beta, weakly held), and for gamma the
        # prompts of 1,000 tokens it clears in that time.
        a0, b0, g0 = self.alpha_prior, self.beta_prior, self.gamma_prior
        tokens = _PRIOR_S / max(a0, 1e-9)
        k_alpha = tokens
        k_beta = tokens * _WEAK
        k_gamma = _PRIOR_S / (1000.0 * max(a0 * 1000.0 + g0, 1e-6))
        m = [row[:] for row in self._sxx]
        v = self._sxy[:]
        for i, (k, prior) in enumerate(((k_alpha, a0), (k_beta, b0), (k_gamma, g0))):
            m[i][i] += k
            v[i] += k * prior
        theta = _solve3(m, v)
        if theta is None:
            return
        alpha, beta, gamma = theta
        # A fit that says decoding makes prefill faster, or that a token costs nothing,
        # is noise on too few intervals: the prior's share holds.
        self._theta = (max(alpha, 0.3 * a0), max(beta, 0.0), max(gamma, 0.0))

    # --- projections --------------------------------------------------------------------------

    def seconds_per_token(self, decoding: float) -> float:
        alpha, beta, _ = self._theta
        return min(_MAX_SECONDS_PER_TOKEN, alpha + beta * max(0.0, decoding) / 100.0)

    def censored(self, now: float, beside: int | None = None) -> float:
        """Seconds per token the waiting prompts show already (0 when none waits);
        `beside`: the tokens after the head that the head's last step may prefill too
        (None: any of those waiting)."""
        since = self._busy_since
        if since is None or not self._waiting:
            return 0.0
        head = next(iter(self._waiting.values()))
        # The head has not finished, so the engine has prefilled at most the head, and
        # in the step that finishes it, what that step has room for beside it.
        others = self._waiting_tokens - head
        if beside is not None:
            others = min(others, max(0, beside))
        return max(0.0, now - since) / (self._done + head + others)

    def ahead(self, now: float, beside: int | None = None) -> float:
        """Prompt tokens still to prefill before a prompt placed now could start."""
        if not self._waiting:
            return 0.0
        since = self._busy_since
        assert since is not None
        head = next(iter(self._waiting.values()))
        per_token = max(self.seconds_per_token(self._decoding), self.censored(now, beside))
        progress = max(0.0, now - since) / per_token - self._done
        return self._waiting_tokens - min(max(0.0, progress), head - 1)

    def projection(
        self, tokens: int, now: float, decoding: float, beside: int | None = None
    ) -> float:
        """Seconds until a prompt of `tokens` placed now is prefilled, by the fit alone:
        its tokens and those ahead at the decode batch there will be by then. `beside`
        as for `censored`."""
        batch = min(float(self.max_sequences), decoding + len(self._waiting))
        per_token = max(self.seconds_per_token(batch), self.censored(now, beside))
        prompts = len(self._waiting) + 1
        return (self.ahead(now, beside) + max(1, tokens)) * per_token + prompts * self._theta[2]

    def view(self) -> dict[str, float]:
        alpha, beta, gamma = self._theta
        return {
            "seconds_per_1k_tokens": alpha * 1000.0,
            "per_100_decoding": beta * 1000.0,
            "per_prompt_s": gamma,
            "busy_s": self._weight,
        }

    def __len__(self) -> int:
        return len(self._waiting)


def _zeros(rows: int, cols: int) -> list[list[float]]:
    return [[0.0] * cols for _ in range(rows)]


def _solve3(m: list[list[float]], v: list[float]) -> tuple[float, float, float] | None:
    """Gaussian elimination with partial pivoting (3 x 3); None when singular."""
    a = [[*row, v[i]] for i, row in enumerate(m)]
    for col in range(3):
        pivot = max(range(col, 3), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-300:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(col + 1, 3):
            f = a[r][col] / a[col][col]
            for c in range(col, 4):
                a[r][c] -= f * a[col][c]
    x = [0.0, 0.0, 0.0]
    for r in (2, 1, 0):
        x[r] = (a[r][3] - sum(a[r][c] * x[c] for c in range(r + 1, 3))) / a[r][r]
    return x[0], x[1], x[2]
