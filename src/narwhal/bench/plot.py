"""PNG plots of a run (`--plot DIR`), drawn with matplotlib, an optional extra.

matplotlib is imported only here and only when plotting, with the Agg backend
(no display needed). `require()` runs before any traffic is sent, so a missing
extra fails the command at once instead of after a long run.

Files:

- every run (`plot_requests`): `ttft_cdf.png`, `tpot_itl_cdf.png` and
  `latency_over_time.png`, one curve or point set per stage;
- a sweep (open-loop stages at several rates), against its stages' offered load
  (`plot_sweep`): `sweep.png` (goodput and SLO attainment) and
  `latency_throughput.png` (latency percentiles against the output tokens per second
  achieved); and Narwhal's story (`plot_load`): `admission_outcomes.png` (admitted,
  refused and rejected stacked), `attainment.png` (admitted attainment beside offered
  attainment, against the 99% target) and `goodput.png` (request goodput beside token
  goodput).

Latency and rate axes are linear unless their values span more than a factor of 100
(`plot_axes.axis_scale`). Each figure's title (`Figure.get_suptitle()`) is the run's
context from `context.plot_title`: targets and endpoint, model, workload and lengths,
SLO, start time and narwhal's version; each axes' title says what is plotted.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from narwhal.bench import plot_load, plot_requests, plot_sweep
from narwhal.bench.session import BenchResult
from narwhal.bench.stats import StageSummary

INSTALL_HINT = "plotting needs matplotlib: pip install '.[plot]' (from Narwhal's checkout)"


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


Drawing = Callable[[Any, BenchResult, list[StageSummary]], Any]

EVERY_RUN: tuple[tuple[str, Drawing], ...] = (
    ("ttft_cdf.png", plot_requests.ttft_cdf),
    ("tpot_itl_cdf.png", plot_requests.tpot_itl_cdf),
    ("latency_over_time.png", plot_requests.latency_over_time),
)
SWEEP: tuple[tuple[str, Drawing], ...] = (
    ("sweep.png", plot_sweep.sweep),
    ("latency_throughput.png", plot_sweep.latency_throughput),
    ("admission_outcomes.png", plot_load.admission_outcomes),
    ("attainment.png", plot_load.attainment),
    ("goodput.png", plot_load.goodput),
)


def _is_sweep(result: BenchResult) -> bool:
    return len(result.stages) > 1 and all(s.plan.rate is not None for s in result.stages)


def figures(result: BenchResult, sums: list[StageSummary]) -> dict[str, Any]:
    """Each plot's file name and its matplotlib Figure (the caller closes them)."""
    plt = _pyplot()
    drawings = EVERY_RUN + (SWEEP if _is_sweep(result) else ())
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
