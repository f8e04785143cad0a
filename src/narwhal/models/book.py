"""Everything Narwhal has learned (sans-IO): every engine's model, output lengths, and how
its TTFT projections turn out.

The projection of a request's TTFT (`narwhal.admission.predictive`) is built from the
engines' models; what it turns into is measured at the request's first token. The ratio
measured / projected is followed by two quantile trackers:

- `bias` (the median ratio) corrects the projection reported to operators and used as the
  expected TTFT: a lane model that is systematically a little slow or fast is corrected;
- `margin` (the 99th percentile ratio, over projections large enough to matter against
  the budget) is the factor the admission check multiplies projections by, so that a
  request is admitted when its projection, as projections have been turning out, fits
  the budget 99 times in 100. It starts at `INITIAL_MARGIN` and learns both ways.

Both are one float each and O(1) per request.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Final

from narwhal.models.calibration import Calibration
from narwhal.models.engine import DEFAULT_MAX_SEQUENCES, DEFAULT_STEP_BUDGET, EngineModel
from narwhal.models.histogram import QuantileTracker
from narwhal.models.lengths import OutputLengths

INITIAL_MARGIN: Final = 1.25
TARGET_QUANTILE: Final = 0.99
# Projections below this share of the budget do not teach the margin: at low load the
# relative error of a 50 ms projection says little about one of 1.5 s.
_MARGIN_FROM: Final = 0.2


class ModelBook:
    def __init__(
        self,
        engines: Iterable[str],
        *,
        ttft_budget_s: float,
        step_budgets: Mapping[str, int] | None = None,
        max_sequences: Mapping[str, int] | None = None,
        prediction_error: Callable[[float], None] | None = None,
    ) -> None:
        """`step_budgets`, `max_sequences`: each engine's prefill token budget per step
        and its sequence slots, by name."""
        budgets = step_budgets or {}
        slots = max_sequences or {}
        self.lengths = OutputLengths()
        self.engines: dict[str, EngineModel] = {
            name: EngineModel(
                name,
                step_budget=budgets.get(name, DEFAULT_STEP_BUDGET),
                max_sequences=slots.get(name, DEFAULT_MAX_SEQUENCES),
                lengths=self.lengths,
                calibration=self._calibration(ttft_budget_s),
            )
            for name in engines
        }
        self.budget = ttft_budget_s
        self.bias = QuantileTracker(0.5, initial=1.0, step=0.05, lowest=0.2, highest=5.0)
        self.margin = QuantileTracker(
            TARGET_QUANTILE, initial=INITIAL_MARGIN, step=0.05, lowest=0.5, highest=10.0
        )
        self._prediction_error = prediction_error
        # Admitted requests whose first token came within / after the projection's bound.
        self.bound_within = 0
        self.bound_exceeded = 0

    def model(self, name: str) -> EngineModel:
        return self.engines[name]

    def add(self, name: str, *, step_budget: int, max_sequences: int) -> EngineModel:
        """A model for an engine added while running (a reload): unprofiled."""
        model = self.engines[name] = EngineModel(
            name,
            step_budget=step_budget,
            max_sequences=max_sequences,
            lengths=self.lengths,
            calibration=self._calibration(self.budget),
        )
        return model

    def set_budget(self, ttft_budget_s: float) -> None:
        """A new TTFT budget (a reload): each engine's bound is calibrated afresh for it.
        Its errors are kept relative to shares of the budget and classed by shares of
        it, so samples taken under the old budget do not read under the new one (kept,
        a budget cut from 2 s to 0.18 s bounded an idle engine's 50 ms prefill at 0.21
        s, and refused it)."""
        if ttft_budget_s == self.budget:
            return
        self.budget = ttft_budget_s
        for model in self.engines.values():
            model.calibration = self._calibration(ttft_budget_s)

    @staticmethod
    def _calibration(budget: float) -> Calibration:
        return Calibration(budget_s=max(1e-2, budget))

    def remove(self, name: str) -> None:
        self.engines.pop(name, None)

    def ttft_measured(self, projected: float, measured: float, bound: float = math.inf) -> None:
        """A projection (raw seconds) and the TTFT it turned into (seconds, same origin);
        `bound`: the upper bound admission held it to (counted: within or exceeded)."""
        if not (math.isfinite(projected) and math.isfinite(measured)):
            return
        if measured > bound:
            self.bound_exceeded += 1
        else:
            self.bound_within += 1
        if projected <= 0 or measured <= 0:
            return
        ratio = measured / projected
        expected = projected * self.bias.value
        self.bias.add(ratio)
        if projected >= _MARGIN_FROM * self.budget:
            self.margin.add(ratio)
        if self._prediction_error is not None:
            self._prediction_error(abs(measured - expected) / measured)

    def expected(self, projected: float) -> float:
        """The TTFT a raw projection is expected to turn into."""
        return projected * self.bias.value

    def upper(self, projected: float) -> float:
        """The TTFT a raw projection stays under 99 times in 100 (as seen so far)."""
        return projected * max(self.margin.value, self.bias.value)
