"""PNG plots of a run (`--plot DIR`), drawn with matplotlib, an optional extra.

matplotlib is imported only here and only when plotting, with the Agg backend
(no display needed). `require()` runs before any traffic is sent, so a missing
extra fails the command at once instead of after a long run.

Files: `ttft_cdf.png` (one curve per stage), `latency_over_time.png`
(end-to-end latency of each request against its start, errors marked), and for
a sweep `sweep.png` (goodput and SLO attainment against offered load).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from narwhal.bench.session import BenchResult
from narwhal.bench.stats import StageSummary

INSTALL_HINT = "plotting needs matplotlib: pip install 'narwhal[plot]'"


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


def _ttft_cdf(plt: Any, result: BenchResult, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for stage in result.stages:
        values = sorted(r.ttft * 1e3 for r in stage.records if r.ok and not math.isnan(r.ttft))
        if values:
            ys = [(i + 1) / len(values) for i in range(len(values))]
            ax.step(values, ys, where="post", label=stage.plan.name)
    if result.config.slo.ttft_s is not None:
        ax.axvline(result.config.slo.ttft_s * 1e3, color="grey", linestyle="--", label="TTFT SLO")
    ax.set_xlabel("TTFT (ms)")
    ax.set_ylabel("fraction of successful requests")
    ax.set_title("TTFT CDF")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _latency_over_time(plt: Any, result: BenchResult, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 4.5))
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
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _sweep(plt: Any, result: BenchResult, sums: list[StageSummary], path: Path) -> None:
    rates = [s.plan.rate or 0.0 for s in result.stages]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
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
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_plots(result: BenchResult, sums: list[StageSummary], directory: Path) -> list[Path]:
    """Write the PNGs into `directory` (created if needed); return their paths."""
    plt = _pyplot()
    directory.mkdir(parents=True, exist_ok=True)
    written = [directory / "ttft_cdf.png", directory / "latency_over_time.png"]
    _ttft_cdf(plt, result, written[0])
    _latency_over_time(plt, result, written[1])
    if len(result.stages) > 1 and all(s.plan.rate is not None for s in result.stages):
        written.append(directory / "sweep.png")
        _sweep(plt, result, sums, written[-1])
    return written
