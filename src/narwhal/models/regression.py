"""Online linear regression with forgetting, anchored to a prior (sans-IO).

The models of prefill time and TPOT are linear in a few features (prompt length, its
square, the decode batch). They are fitted online from every served request, and must
follow an engine that changes (drift, another model loaded) while never running off
when the data say little: a fleet that only sends 1,000-token prompts says nothing
about the slope in prompt length, and a plain recursive least-squares fit with
forgetting would let that direction's uncertainty grow without bound ("covariance
windup") and the slope wander.

So the fit is weighted least squares with exponential forgetting plus a ridge term
that pulls each coefficient toward its prior (the engine's profile):

    minimise  sum_i w_i λ^(n-i) (y_i - θ·x_i)²  +  sum_j k_j (θ_j - θ0_j)²

Directions the data excite follow the data (their weight grows to about the forgetting
window, 1/(1-λ) samples); directions they do not stay at the prior. The prior's weight
starts at `strength` and fades with the data to a tenth of it, so that once data have
come the fit is not held back toward a stale profile (a constant ridge against a
bounded window would keep it a few percent short of the truth for ever), while every
direction keeps some anchor. The normal
equations are kept as decayed sums (a d x d matrix and a d-vector, d ≤ 4) and solved
by Gaussian elimination after each update while the fit is young, then every few
updates: constant time and memory per sample.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

_PRIOR_FLOOR = 0.1  # the share of the prior's weight left once data have come
_SETTLED = 50  # samples after which the solve is batched
_SOLVE_EVERY = 8  # then: one solve per this many updates (predictions use the last one)


class AnchoredLeastSquares:
    __slots__ = (
        "_decay",
        "_dim",
        "_prior",
        "_stale",
        "_strength",
        "_sxx",
        "_sxy",
        "_theta",
        "samples",
        "version",
    )

    def __init__(
        self,
        prior: Sequence[float],
        strength: Sequence[float],
        *,
        half_life: float = 200.0,
    ) -> None:
        """`prior`: the coefficients before any data; `strength`: how many samples' worth
        of weight each prior coefficient has (per unit of its feature squared);
        `half_life`: after this many samples, a sample counts half."""
        if len(prior) != len(strength):
            raise ValueError("prior and strength differ in length")
        self._dim = len(prior)
        self._prior = [float(p) for p in prior]
        self._strength = [float(s) for s in strength]
        self._decay = 0.5 ** (1.0 / half_life)
        self._sxx = [[0.0] * self._dim for _ in range(self._dim)]
        self._sxy = [0.0] * self._dim
        self._theta = list(self._prior)
        self._stale = 0  # updates since the last solve
        self.samples = 0
        self.version = 0  # changes whenever the coefficients may have: a cache key

    @property
    def theta(self) -> list[float]:
        """The coefficients. Solving costs tens of microseconds, so once the fit has
        settled it is redone every few updates (or when asked), not after each one."""
        if self._stale:
            self._solve()
        return self._theta

    def predict(self, x: Sequence[float]) -> float:
        if self._stale >= _SOLVE_EVERY or (self._stale and self.samples < _SETTLED):
            self._solve()
        theta = self._theta
        return sum(theta[j] * x[j] for j in range(self._dim))

    def update(self, x: Sequence[float], y: float, weight: float = 1.0) -> bool:
        """Add one sample; False (and nothing changed) when it is not a finite number."""
        if not (math.isfinite(y) and math.isfinite(weight) and weight > 0):
            return False
        if not all(math.isfinite(v) for v in x):
            return False
        decay = self._decay
        sxx, sxy, dim = self._sxx, self._sxy, self._dim
        for i in range(dim):
            row = sxx[i]
            xi = x[i] * weight
            for j in range(dim):
                row[j] = row[j] * decay + xi * x[j]
            sxy[i] = sxy[i] * decay + xi * y
        self.samples += 1
        self._stale += 1
        self.version += 1
        return True

    def reset(self, prior: Sequence[float]) -> None:
        """Forget the data and start again from a new prior (a fresh profile)."""
        self._prior = [float(p) for p in prior]
        self._sxx = [[0.0] * self._dim for _ in range(self._dim)]
        self._sxy = [0.0] * self._dim
        self._theta = list(self._prior)
        self._stale = 0
        self.samples = 0
        self.version += 1

    def _solve(self) -> None:
        self._stale = 0
        dim = self._dim
        # (Sxx + K) θ = Sxy + K θ0, K = diag(strength) faded: the ridge toward the prior.
        fade = _PRIOR_FLOOR + (1.0 - _PRIOR_FLOOR) * self._decay**self.samples
        strength = [k * fade for k in self._strength]
        a = [
            [self._sxx[i][j] + (strength[i] if i == j else 0.0) for j in range(dim)]
            + [self._sxy[i] + strength[i] * self._prior[i]]
            for i in range(dim)
        ]
        for col in range(dim):
            pivot = max(range(col, dim), key=lambda r: abs(a[r][col]))
            if abs(a[pivot][col]) < 1e-12:
                return  # singular (no strength, no data): keep the last solution
            a[col], a[pivot] = a[pivot], a[col]
            lead = a[col][col]
            for r in range(col + 1, dim):
                factor = a[r][col] / lead
                if factor:
                    row, top = a[r], a[col]
                    for c in range(col, dim + 1):
                        row[c] -= factor * top[c]
        theta = [0.0] * dim
        for r in range(dim - 1, -1, -1):
            total = a[r][dim] - sum(a[r][c] * theta[c] for c in range(r + 1, dim))
            theta[r] = total / a[r][r]
        if all(math.isfinite(t) for t in theta):
            self._theta = theta
