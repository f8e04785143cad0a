"""The figures of a sweep that compare its stages' figures (see `plot`).

- `sweep.png`: goodput and SLO attainment (every SLO set, over all requests) against
  offered load;
- `latency_throughput.png`: TTFT p50 and p99 and E2E latency p50 against the output
  tokens per second achieved, each point named by its stage.

Offered load is each stage's nominal rate (`--sweep`), requests per second. Rate and
latency axes are linear or log by `plot_axes.axis_scale`.
"""

from __future__ import annotations

import math
from typing import Any

from narwhal.bench.plot_axes import figure, scale_x, scale_y
from narwhal.bench.session import BenchResult
from narwhal.bench.stats import StageSummary

OFFERED = "offered load"


def offered_loads(result: BenchResult) -> list[float]:
    """Each stage's offered load, requests per second: its rate (NaN for a closed loop)."""
    return [math.nan if s.plan.rate is None else s.plan.rate for s in result.stages]


def sweep(plt: Any, result: BenchResult, sums: list[StageSummary]) -> Any:
    rates = offered_loads(result)
    fig, (left, right) = figure(plt, result, (10, 4.8), columns=2)
    goodput = [s.goodput_per_s for s in sums]
    successful = [s.requests_per_s for s in sums]
    left.plot(rates, rates, color="grey", linestyle=":", label="offered")
    left.plot(rates, goodput, marker="o", label="goodput")
    left.plot(rates, successful, marker=".", label="successful")
    scale_x(left, rates, OFFERED, "req/s")
    scale_y(left, rates + goodput + successful, "requests", "req/s")
    left.set_title("Goodput against offered load")
    left.grid(True, which="both", alpha=0.3)
    left.legend()
    right.plot(rates, [s.attainment * 100 for s in sums], marker="o")
    right.set_ylim(0, 105)
    scale_x(right, rates, OFFERED, "req/s")
    right.set_ylabel("SLO attainment (%)")
    right.set_title("SLO attainment against offered load")
    right.grid(True, which="both", alpha=0.3)
    return fig


def latency_throughput(plt: Any, result: BenchResult, sums: list[StageSummary]) -> Any:
    fig, ax = figure(plt, result, (7.5, 5))
    xs = [s.output_tokens_per_s for s in sums]
    lines = (
        ("TTFT p50", [s.ttft.p50 * 1e3 for s in sums], "o"),
        ("TTFT p99", [s.ttft.p99 * 1e3 for s in sums], "^"),
        ("E2E latency p50", [s.latency.p50 * 1e3 for s in sums], "s"),
    )
    for label, values, marker in lines:
        ax.plot(xs, values, marker=marker, label=label)
    for stage, x, y in zip(result.stages, xs, lines[1][1], strict=True):
        if not (math.isnan(x) or math.isnan(y)):
            ax.annotate(
                stage.plan.name, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7
            )
    shown = [v for _, values, _ in lines for v in values]
    slo = result.config.slo.ttft_s
    if slo is not None:
        ax.axhline(slo * 1e3, color="grey", linestyle="--", label="TTFT SLO")
        shown.append(slo * 1e3)
    scale_x(ax, xs, "achieved output throughput", "tokens/s")
    scale_y(ax, shown, "latency", "ms")
    ax.set_title("Latency against achieved throughput")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="best")
    return fig
