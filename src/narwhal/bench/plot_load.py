"""Narwhal's story against offered load: what became of the requests offered, whether
the admitted ones got the TTFT they were promised, and the goodput that came of it.

One point or bar per stage of a sweep, at its offered load (`plot_sweep.offered_loads`):

- `admission_outcomes.png`: stacked bars of each stage's requests by outcome (see
  `admission`): admitted and succeeded, admitted and failed (only where some did),
  refused (429 `ttft_budget_exceeded` or `prompt_exceeds_ttft_budget`: the predictive
  admission's refusals) and rejected (any other 429: no capacity). The bars' heights
  are counts, so each stack's top is the stage's offered requests;
- `attainment.png`: admitted attainment (the share of admitted requests that succeeded
  with TTFT within `--slo-ttft`) beside offered attainment (the share of all offered
  requests that were admitted and met it), against the `ATTAINMENT_TARGET` line;
- `goodput.png`: request goodput (requests within every SLO set, per second, the
  offered load dotted) beside token goodput (those requests' prompt plus output tokens
  per second), two panels as their units differ; a linear goodput axis starts at 0.

The offered load and the rates are linear or log by `plot_axes.axis_scale` (a bar on a
log axis spans the same ratio on either side of its load); shares are linear.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from narwhal.bench.plot_axes import LINEAR, LOG, figure, scale_x, scale_y
from narwhal.bench.plot_sweep import OFFERED, offered_loads
from narwhal.bench.session import BenchResult
from narwhal.bench.stats import StageSummary

ATTAINMENT_TARGET = 0.99  # the share of admitted requests a TTFT admission aims to keep
BAR_SHARE = 0.6  # of the closest two loads' gap (or ratio, on a log axis) a bar covers

ADMITTED_OK = "admitted, succeeded"
ADMITTED_FAILED = "admitted, failed"
REFUSED = "refused (429 predictive)"
REJECTED = "rejected (429 capacity)"
COLORS = {
    ADMITTED_OK: "tab:green",
    ADMITTED_FAILED: "tab:purple",
    REFUSED: "tab:orange",
    REJECTED: "tab:red",
}


def outcome_counts(sums: list[StageSummary]) -> dict[str, list[int]]:
    """Each outcome's requests per stage, bottom of the stack first; they add up to the
    offered requests. `ADMITTED_FAILED` only where an admitted request failed."""
    counts = {ADMITTED_OK: [s.ok for s in sums]}  # every success was admitted
    failed = [s.admission.admitted - s.ok for s in sums]
    if any(failed):
        counts[ADMITTED_FAILED] = failed
    counts[REFUSED] = [s.admission.refused for s in sums]
    counts[REJECTED] = [s.admission.rejected for s in sums]
    return counts


def _bar_extents(loads: list[float], scale: str) -> tuple[list[float], list[float]]:
    """Each bar's left edge and width, centred on its load (geometrically on a log axis)."""
    distinct = sorted(set(loads))
    if scale == LOG:
        ratios = [b / a for a, b in pairwise(distinct)]
        k = min(ratios) ** (BAR_SHARE / 2) if ratios else 1.25
        return [x / k for x in loads], [x * k - x / k for x in loads]
    gaps = [b - a for a, b in pairwise(distinct)]
    width = BAR_SHARE * min(gaps) if gaps else BAR_SHARE * max(max(map(abs, loads)), 1.0)
    return [x - width / 2 for x in loads], [width] * len(loads)


def admission_outcomes(plt: Any, result: BenchResult, sums: list[StageSummary]) -> Any:
    fig, ax = figure(plt, result, (7.5, 5))
    loads = offered_loads(result)
    scale = scale_x(ax, loads, OFFERED, "req/s")
    lefts, widths = _bar_extents(loads, scale)
    bottom = [0] * len(sums)
    for label, counts in outcome_counts(sums).items():
        ax.bar(lefts, counts, widths, bottom=bottom, align="edge", label=label, color=COLORS[label])
        bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
    ax.set_ylabel("requests")
    ax.set_title("Admission outcomes against offered load")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    return fig


def attainment(plt: Any, result: BenchResult, sums: list[StageSummary]) -> Any:
    fig, ax = figure(plt, result, (7.5, 5))
    loads = offered_loads(result)
    admitted = [s.admission.admitted_attainment * 100 for s in sums]
    offered = [s.admission.offered_attainment * 100 for s in sums]
    ax.plot(loads, admitted, marker="o", label="of admitted requests")
    ax.plot(loads, offered, marker="s", label="of all offered requests (admitted and within)")
    ax.axhline(
        ATTAINMENT_TARGET * 100,
        color="grey",
        linestyle="--",
        label=f"{ATTAINMENT_TARGET:.0%} target",
    )
    scale_x(ax, loads, OFFERED, "req/s")
    ax.set_ylim(0, 105)
    ttft = result.config.slo.ttft_s
    if ttft is None:
        ax.set_ylabel("succeeded (%)")
        ax.set_title("Attainment against offered load (no --slo-ttft: success only)")
    else:
        ax.set_ylabel(f"TTFT <= {ttft:g} s (%)")
        ax.set_title("TTFT budget attainment: admitted requests beside all offered")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower left", fontsize=8)
    return fig


def goodput(plt: Any, result: BenchResult, sums: list[StageSummary]) -> Any:
    fig, (left, right) = figure(plt, result, (10, 4.8), columns=2)
    loads = offered_loads(result)
    requests = [s.goodput_per_s for s in sums]
    tokens = [s.token_goodput_per_s for s in sums]
    left.plot(loads, loads, color="grey", linestyle=":", label="offered")
    left.plot(loads, requests, marker="o", label="request goodput")
    scale_x(left, loads, OFFERED, "req/s")
    left_scale = scale_y(left, loads + requests, "requests within the SLOs", "req/s")
    left.set_title("Request goodput")
    left.legend(loc="upper left")
    right.plot(loads, tokens, marker="o", color="tab:green", label="token goodput")
    scale_x(right, loads, OFFERED, "req/s")
    right_scale = scale_y(right, tokens, "prompt + output tokens within the SLOs", "tokens/s")
    right.set_title("Token goodput")
    right.legend(loc="upper left")
    for ax, scale in ((left, left_scale), (right, right_scale)):
        ax.grid(True, which="both", alpha=0.3)
        if scale == LINEAR:
            ax.set_ylim(bottom=0)  # a fall in goodput reads against none at all
    return fig
