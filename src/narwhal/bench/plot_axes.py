"""What every figure shares: the run's context as its title, and one rule for linear or log.

A log axis earns its place when the values span orders of magnitude (a light stage's
tens of milliseconds next to an overloaded one's seconds); over a narrow range it only
squeezes the differences together and leaves few ticks to read. Every axis that carries
a latency or a rate (requests, tokens per second, offered load) is set by
`axis_scale` over the values it shows, reference lines (an SLO) included:

- log when every finite value is above 0 and the largest is more than `LOG_RANGE`
  (100) times the smallest: more than two decades;
- linear otherwise: fewer than two finite values, a range within 100x, or a value of 0
  or below, which a log axis cannot show (it would hide, say, a stage whose goodput
  fell to 0).

NaN and infinities (figures not observed) take no part. Shares (a CDF's fraction, an
attainment) and times since the run's start are always linear.

matplotlib is not imported here: the axes are passed in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from narwhal.bench.context import plot_title
from narwhal.bench.session import BenchResult

LINEAR = "linear"
LOG = "log"
LOG_RANGE = 100.0  # largest over smallest value beyond which an axis is logarithmic
TITLE_SIZE = 8


def axis_scale(values: Iterable[float]) -> str:
    """LINEAR or LOG for an axis showing `values` (the rule in the module docstring)."""
    finite = [v for v in values if math.isfinite(v)]
    if len(finite) < 2 or min(finite) <= 0:
        return LINEAR
    return LOG if max(finite) > LOG_RANGE * min(finite) else LINEAR


def axis_label(name: str, unit: str, scale: str) -> str:
    """`TTFT (ms)`, or `TTFT (ms, log scale)` on a log axis."""
    return f"{name} ({unit}, log scale)" if scale == LOG else f"{name} ({unit})"


def scale_x(ax: Any, values: Iterable[float], name: str, unit: str) -> str:
    """Set the x axis' scale from `values` and label it; return the scale."""
    scale = axis_scale(values)
    ax.set_xscale(scale)
    ax.set_xlabel(axis_label(name, unit, scale))
    return scale


def scale_y(ax: Any, values: Iterable[float], name: str, unit: str) -> str:
    """Set the y axis' scale from `values` and label it; return the scale."""
    scale = axis_scale(values)
    ax.set_yscale(scale)
    ax.set_ylabel(axis_label(name, unit, scale))
    return scale


def figure(plt: Any, result: BenchResult, size: tuple[float, float], columns: int = 1) -> Any:
    """A figure of `columns` axes side by side, titled with the run's context."""
    fig, axes = plt.subplots(1, columns, figsize=size)
    fig.suptitle(plot_title(result), fontsize=TITLE_SIZE)
    return fig, axes
