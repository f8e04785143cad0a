"""The figures of every request, one curve or point set per stage (see `plot`).

- `ttft_cdf.png`: TTFT of the successful requests;
- `tpot_itl_cdf.png`: TPOT per request (solid) and the inter-token gaps (ITL, dashed),
  milliseconds. Gaps of 0 (events that came in one read) are the ITL curve's start, its
  share given in the legend: at 0 on a linear axis; on a log axis, which cannot show 0,
  the curve starts at that share;
- `latency_over_time.png`: each request's end-to-end latency against its start, errors
  marked.

Their latency axes are linear or log by `plot_axes.axis_scale`, the SLO lines included.
"""

from __future__ import annotations

import math
from typing import Any

from narwhal.bench.plot_axes import LOG, figure, scale_x, scale_y
from narwhal.bench.runner import StageResult
from narwhal.bench.session import BenchResult
from narwhal.bench.stats import StageSummary, record_tpot


def _cdf(ax: Any, values: list[float], **style: Any) -> None:
    values = sorted(values)
    ys = [(i + 1) / len(values) for i in range(len(values))]
    ax.step(values, ys, where="post", **style)


def ttft_cdf(plt: Any, result: BenchResult, sums: list[StageSummary]) -> Any:
    fig, ax = figure(plt, result, (7.5, 5))
    shown: list[float] = []
    for stage in result.stages:
        values = [r.ttft * 1e3 for r in stage.records if r.ok and not math.isnan(r.ttft)]
        if values:
            _cdf(ax, values, label=stage.plan.name)
            shown += values
    slo = result.config.slo.ttft_s
    if slo is not None:
        ax.axvline(slo * 1e3, color="grey", linestyle="--", label="TTFT SLO")
        shown.append(slo * 1e3)
    scale_x(ax, shown, "TTFT", "ms")
    ax.set_ylabel("fraction of successful requests")
    ax.set_title("TTFT CDF")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right")
    return fig


def _itl_points(stage: StageResult) -> tuple[list[float], list[float], float]:
    """The ITL curve's x (ms, positive) and y after its start, and the share of 0 gaps."""
    itl = stage.itl
    points = itl.cumulative()
    return [x * 1e3 for x, _ in points], [y for _, y in points], itl.zeros / itl.count


def tpot_itl_cdf(plt: Any, result: BenchResult, sums: list[StageSummary]) -> Any:
    fig, ax = figure(plt, result, (7.5, 5))
    tpots = []
    for stage in result.stages:
        values = [record_tpot(r) * 1e3 for r in stage.records if r.ok]
        tpots.append([t for t in values if t > 0])  # NaN (fewer than two tokens) fails too
    itls = [_itl_points(stage) if stage.itl.count else None for stage in result.stages]
    shown = [t for values in tpots for t in values]
    shown += [x for curve in itls if curve is not None for x in curve[0]]
    slo = result.config.slo.tpot_s
    if slo is not None:
        shown.append(slo * 1e3)
    scale = scale_x(ax, shown, "ms per output token", "ms")
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, stage in enumerate(result.stages):
        color = colors[i % len(colors)]
        if tpots[i]:
            _cdf(ax, tpots[i], color=color, label=f"{stage.plan.name} TPOT")
        curve = itls[i]
        if curve is None:
            continue
        xs, ys, zero_share = curve
        label = f"{stage.plan.name} ITL ({zero_share:.0%} of gaps 0)"
        if xs:
            start = xs[0] if scale == LOG else 0.0
            style = {"color": color, "linestyle": "--", "label": label}
            ax.step([start, *xs], [zero_share, *ys], where="post", **style)
        else:  # every gap 0: nothing to draw on a log axis, but the legend says so
            ax.plot([], [], color=color, linestyle="--", label=label)
    if slo is not None:
        ax.axvline(slo * 1e3, color="grey", linestyle=":", label="TPOT SLO")
    ax.set_ylabel("fraction of requests (TPOT) or of gaps (ITL)")
    ax.set_title("TPOT (per request) and ITL (per inter-token gap) CDF")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    return fig


def latency_over_time(plt: Any, result: BenchResult, sums: list[StageSummary]) -> Any:
    fig, ax = figure(plt, result, (8, 5))
    for stage in result.stages:
        ok = [r for r in stage.records if r.ok]
        ax.scatter([r.start for r in ok], [r.latency * 1e3 for r in ok], s=4, label=stage.plan.name)
        failed = [r for r in stage.records if not r.ok]
        if failed:
            ax.scatter(
                [r.start for r in failed],
                [r.latency * 1e3 for r in failed],
                s=12,
                marker="x",
                color="red",
            )
    latencies = [r.latency * 1e3 for stage in result.stages for r in stage.records]
    scale_y(ax, latencies, "end-to-end latency", "ms")
    ax.set_xlabel("request start (s)")
    ax.set_title("Latency over time (x: errors)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", markerscale=3)
    return fig
