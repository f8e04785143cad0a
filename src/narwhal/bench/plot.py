"""PNG plots of a run (`--plot DIR`), drawn with matplotlib, an optional extra.

matplotlib is imported only here and only when plotting, with the Agg backend
(no display needed). `require()` runs before any traffic is sent, so a missing
extra fails the command at once instead of after a long run.

Files, one curve or point per stage:

- `ttft_cdf.png`: TTFT of the successful requests, on a log time axis (a light
  stage's tens of milliseconds stay readable next to an overloaded one's seconds);
- `tpot_itl_cdf.png`: TPOT per request (solid) and the inter-token gaps (ITL,
  dashed), both milliseconds on a log axis. Gaps of 0 (events that came in one
  read) cannot sit on a log axis: the ITL curve starts at their share, which the
  legend gives;
- `latency_over_time.png`: each request's end-to-end latency against its start,
  errors marked;
- for a sweep (open-loop stages at several rates), `sweep.png` (goodput and SLO
  attainment against offered load) and `latency_throughput.png` (TTFT p50 and
  p99 and E2E latency p50 against the output tokens per second achieved, each
  point named by its stage).

Each figure's title (`Figure.get_suptitle()`) is the run's context from
`context.plot_title`: targets and endpoint, model, workload and lengths, SLO,
start time and narwhal's version; each axes' title says what is plotted.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from narwhal.bench.context import plot_title
from narwhal.bench.session import BenchResult
from narwhal.bench.stats import StageSummary, record_tpot

INSTALL_HINT = "plotting needs matplotlib: pip install '.[plot]' (from Narwhal's checkout)"
TITLE_SIZE = 8


class PlotUnavailable(Exception):
    pass


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable(INSTALL_HINT) from None
    return plt


def require() -> None:
    """Raise `PlotUnavailable` (with the install hint) when matplotlib is missing."""
    _pyplot()


def _figure(plt: Any, result: BenchResult, size: tuple[float, float], columns: int = 1) -> Any:
    fig, axes = plt.subplots(1, columns, figsize=size)
    fig.suptitle(plot_title(result), fontsize=TITLE_SIZE)
    return fig, axes


def _cdf(ax: Any, values: list[float], **style: Any) -> None:
    values = sorted(values)
    ys = [(i + 1) / len(values) for i in range(len(values))]
    ax.step(values, ys, where="post", **style)


def _ttft_cdf(plt: Any, result: BenchResult, sums: list[StageSummary]) -> Any:
    fig, ax = _figure(plt, result, (7.5, 5))
    for stage in result.stages:
        values = [r.ttft * 1e3 for r in stage.records if r.ok and not math.isnan(r.ttft)]
        if values:
            _cdf(ax, values, label=stage.plan.name)
    if result.config.slo.ttft_s is not None:
        ax.axvline(result.config.slo.ttft_s * 1e3, color="grey", linestyle="--", label="TTFT SLO")
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (ms, log scale)")
    ax.set_ylabel("fraction of successful requests")
    ax.set_title("TTFT CDF")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right")
    return fig


def _tpot_itl_cdf(plt: Any, result: BenchResult, sums: list[StageSummary]) -> Any:
    fig, ax = _figure(plt, result, (7.5, 5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, stage in enumerate(result.stages):
        color = colors[i % len(colors)]
        tpots = [record_tpot(r) * 1e3 for r in stage.records if r.ok]
        tpots = [t for t in tpots if t > 0]  # NaN (fewer than two tokens) fails too
        if tpots:
            _cdf(ax, tpots, color=color, label=f"{stage.plan.name} TPOT")
        itl = stage.itl
        if not itl.count:
            continue
        zero_share = itl.zeros / itl.count
        label = f"{stage.plan.name} ITL ({zero_share:.0%} of gaps 0)"
        points = itl.cumulative()
        if points:
            xs = [points[0][0] * 1e3] + [x * 1e3 for x, _ in points]
            ys = [zero_share] + [y for _, y in points]
            ax.step(xs, ys, where="post", color=color, linestyle="--", label=label)
        else:  # every gap 0: nothing to draw on a log axis, but the legend says so
            ax.plot([], [], color=color, linestyle="--", label=label)
    if result.config.slo.tpot_s is not None:
        ax.axvline(result.config.slo.tpot_s * 1e3, color="grey", linestyle=":", label="TPOT SLO")
    ax.set_xscale("log")
    ax.set_xlabel("ms per output token (log scale)")
    ax.set_ylabel("fraction of requests (TPOT) or of gaps (ITL)")
    ax.set_title("TPOT (per request) and ITL (per inter-token gap) CDF")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    return fig


def _latency_over_time(plt: Any, result: BenchResult, sums: list[StageSummary]) -> Any:
    fig, ax = _figure(plt, result, (8, 5))
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
    ax.set_xlabel("request start (s)")
    ax.set_ylabel("end-to-end latency (ms)")
    ax.set_title("Latency over time (x: errors)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", markerscale=3)
    return fig


def _sweep(plt: Any, result: BenchResult, sums: list[StageSummary]) -> Any:
    rates = [s.plan.rate or 0.0 for s in result.stages]
    fig, (left, right) = _figure(plt, result, (10, 4.8), columns=2)
    left.plot(rates, rates, color="grey", linestyle=":", label="offered")
    left.plot(rates, [s.goodput_per_s for s in sums], marker="o", label="goodput")
    left.plot(rates, [s.requests_per_s for s in sums], marker=".", label="successful")
    left.set_xlabel("offered load (req/s)")
    left.set_ylabel("req/s")
    left.set_title("Goodput against offered load")
    left.grid(True, alpha=0.3)
    left.legend()
    right.plot(rates, [s.attainment * 100 for s in sums], marker="o")
    right.set_ylim(0, 105)
    right.set_xlabel("offered load (req/s)")
    right.set_ylabel("SLO attainment (%)")
    right.set_title("SLO attainment against offered load")
    right.grid(True, alpha=0.3)
    return fig


def _latency_throughput(plt: Any, result: BenchResult, sums: list[StageSummary]) -> Any:
    fig, ax = _figure(plt, result, (7.5, 5))
    xs = [s.output_tokens_per_s for s in sums]
    lines = (
        ("TTFT p50", [s.ttft.p50 for s in sums], "o"),
        ("TTFT p99", [s.ttft.p99 for s in sums], "^"),
        ("E2E latency p50", [s.latency.p50 for s in sums], "s"),
    )
    for label, values, marker in lines:
        ax.plot(xs, [v * 1e3 for v in values], marker=marker, label=label)
    for stage, x, y in zip(result.stages, xs, (s.ttft.p99 for s in sums), strict=True):
        if not (math.isnan(x) or math.isnan(y)):
            ax.annotate(
                stage.plan.name, (x, y * 1e3), textcoords="offset points", xytext=(4, 4), fontsize=7
            )
    if result.config.slo.ttft_s is not None:
        ax.axhline(result.config.slo.ttft_s * 1e3, color="grey", linestyle="--", label="TTFT SLO")
    ax.set_yscale("log")
    ax.set_xlabel("achieved output throughput (tokens/s)")
    ax.set_ylabel("latency (ms, log scale)")
    ax.set_title("Latency against achieved throughput")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="best")
    return fig


Drawing = Callable[[Any, BenchResult, list[StageSummary]], Any]


def _is_sweep(result: BenchResult) -> bool:
    return len(result.stages) > 1 and all(s.plan.rate is not None for s in result.stages)


def figures(result: BenchResult, sums: list[StageSummary]) -> dict[str, Any]:
    """Each plot's file name and its matplotlib Figure (the caller closes them)."""
    plt = _pyplot()
    drawings: list[tuple[str, Drawing]] = [
        ("ttft_cdf.png", _ttft_cdf),
        ("tpot_itl_cdf.png", _tpot_itl_cdf),
        ("latency_over_time.png", _latency_over_time),
    ]
    if _is_sweep(result):
        drawings += [("sweep.png", _sweep), ("latency_throughput.png", _latency_throughput)]
    return {name: draw(plt, result, sums) for name, draw in drawings}


def write_plots(result: BenchResult, sums: list[StageSummary], directory: Path) -> list[Path]:
    """Write the PNGs into `directory` (created if needed); return their paths."""
    plt = _pyplot()
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for name, fig in figures(result, sums).items():
        path = directory / name
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
