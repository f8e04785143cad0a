"""The figures `--plot` draws, read back through matplotlib: which there are, their axes'
scales and titles, the run's context in every figure's title, and the data the sweep's
admission figures draw against hand-counted outcomes."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from narwhal.bench import cli
from narwhal.bench.admission import PROMPT_OVER_BUDGET, RATE_LIMIT, TTFT_BUDGET
from narwhal.bench.config import from_args
from narwhal.bench.histogram import LogHistogram
from narwhal.bench.plot_axes import axis_scale
from narwhal.bench.record import HTTP, TIMEOUT, Record
from narwhal.bench.report import summaries
from narwhal.bench.runner import StageResult
from narwhal.bench.session import BenchResult
from narwhal.bench.stats import Slo

matplotlib = pytest.importorskip("matplotlib", minversion="3.8")  # Figure.get_suptitle

URLS = ["http://10.0.0.7:8000", "http://10.0.0.8:8000", "http://10.0.0.9:8000"]


def config(*flags: str) -> Any:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    argv = [a for url in URLS for a in ("--url", url)]
    argv += ["--prompt-tokens", "512", "--max-tokens", "64:128", "--ignore-eos", *flags]
    return from_args(parser.parse_args(argv))


def stage(name: str, rate: float, scale: float) -> StageResult:
    records = []
    for i in range(20):
        r = Record(i, i % 3, 512, 64)
        r.start, r.status, r.tokens, r.events = i * 0.1, 200, 64, 66
        r.ttft, r.last_token = scale * (0.02 + i * 0.01), scale * (0.02 + i * 0.01) + 0.63
        r.latency = r.last_token + 0.001
        records.append(r)
    refused = Record(20, 0, 512, 64)
    refused.start, refused.status, refused.error, refused.latency = 2.0, 429, HTTP, 0.003
    records.append(refused)
    itl = LogHistogram()
    itl.add_all([0.01] * 600 + [0.02] * 60, zeros=600)
    plan = replace(config("--rate", "1").stages[0], name=name, rate=rate)
    return StageResult(plan, records, 0.0, 3.0, 0.01, 21, False, itl=itl)


def result(*stages: StageResult) -> BenchResult:
    started = datetime(2025, 6, 1, 12, 0, 3, tzinfo=UTC)
    c = replace(config("--sweep", "1,8"), slo=Slo(ttft_s=0.5, tpot_s=0.05))
    return BenchResult(c, "qwen-7b", list(stages), False, {}, started_at=started)


def drawn(res: BenchResult) -> dict[str, Any]:
    from narwhal.bench import plot

    return plot.figures(res, summaries(res))


@contextmanager
def drawing(res: BenchResult) -> Iterator[dict[str, Any]]:
    """Every figure of the run, each closed afterwards."""
    import matplotlib.pyplot as plt

    figures = drawn(res)
    try:
        yield figures
    finally:
        for fig in figures.values():
            plt.close(fig)


def test_every_figure_is_titled_with_the_runs_context() -> None:
    import matplotlib.pyplot as plt

    res = result(stage("rate=1/s", 1.0, 1.0), stage("rate=8/s", 8.0, 30.0))
    figures = drawn(res)
    try:
        assert sorted(figures) == [
            "admission_outcomes.png", "attainment.png", "goodput.png", "latency_over_time.png",
            "latency_throughput.png", "sweep.png", "tpot_itl_cdf.png", "ttft_cdf.png",
        ]  # fmt: skip
        for name, fig in figures.items():
            title = fig.get_suptitle()
            for part in (
                "http://10.0.0.7:8000, http://10.0.0.8:8000 (+1 more) /v1/chat/completions",
                "model qwen-7b",
                "prompt 512 tokens, max 64:128 output tokens (ignore_eos)",
                "SLO TTFT <= 0.5 s and TPOT <= 0.05 s",
                "2025-06-01 12:00:03 UTC",
            ):
                assert part in title, (name, part, title)
            assert all(ax.get_title() for ax in fig.axes), name  # each says what it plots
    finally:
        for fig in figures.values():
            plt.close(fig)


def test_axes_scales_and_curves() -> None:
    import matplotlib.pyplot as plt

    res = result(stage("rate=1/s", 1.0, 1.0), stage("rate=8/s", 8.0, 30.0))
    figures = drawn(res)
    try:
        (ttft,) = figures["ttft_cdf.png"].axes
        assert ttft.get_title() == "TTFT CDF" and ttft.get_xscale() == "log"
        assert ttft.get_xlabel() == "TTFT (ms, log scale)"
        labels = [t.get_text() for t in ttft.get_legend().get_texts()]
        assert labels == ["rate=1/s", "rate=8/s", "TTFT SLO"]
        # the light stage's 20-210 ms sit on the same axis as the heavy one's 0.6-6.3 s
        low, high = ttft.get_xlim()
        assert low < 20 and high > 6300

        # TPOT 10 ms, gaps of 10 and 20 ms, the SLO at 50 ms: within 100x, so linear, and
        # the ITL curve starts at 0 with the share of the gaps that were 0
        (tokens,) = figures["tpot_itl_cdf.png"].axes
        assert tokens.get_xscale() == "linear" and "ITL" in tokens.get_title()
        assert tokens.get_xlabel() == "ms per output token (ms)"
        labels = [t.get_text() for t in tokens.get_legend().get_texts()]
        assert "rate=1/s TPOT" in labels and "rate=1/s ITL (48% of gaps 0)" in labels
        itl_line = next(line for line in tokens.get_lines() if line.get_label().endswith("0)"))
        ys = list(itl_line.get_ydata())
        assert ys[0] == pytest.approx(600 / 1260) and ys[-1] == pytest.approx(1.0)
        assert itl_line.get_xdata()[0] == 0.0

        # refusals' 3 ms beside successes' seconds
        (over_time,) = figures["latency_over_time.png"].axes
        assert over_time.get_yscale() == "log"
        assert over_time.get_ylabel() == "end-to-end latency (ms, log scale)"

        # TTFT p50 115 ms to p99 6.2 s (54x), the SLO at 500 ms: linear
        (latency,) = figures["latency_throughput.png"].axes
        assert latency.get_title() == "Latency against achieved throughput"
        assert latency.get_yscale() == "linear" and latency.get_ylabel() == "latency (ms)"
        assert latency.get_xscale() == "linear"
        assert "tokens/s" in latency.get_xlabel()
        lines = {line.get_label(): line for line in latency.get_lines()}
        assert {"TTFT p50", "TTFT p99", "E2E latency p50"} <= set(lines)
        sums = summaries(res)
        assert list(lines["TTFT p99"].get_xdata()) == [s.output_tokens_per_s for s in sums]
        assert list(lines["TTFT p99"].get_ydata()) == [s.ttft.p99 * 1e3 for s in sums]
    finally:
        for fig in figures.values():
            plt.close(fig)


def test_a_single_stage_has_no_sweep_figures_and_no_slo_says_so() -> None:
    import matplotlib.pyplot as plt

    res = result(stage("rate=1/s", 1.0, 1.0))
    res.config = replace(res.config, slo=Slo())
    res.started_at = None
    figures = drawn(res)
    try:
        assert sorted(figures) == ["latency_over_time.png", "tpot_itl_cdf.png", "ttft_cdf.png"]
        title = figures["ttft_cdf.png"].get_suptitle()
        assert "SLO none" in title and "UTC" not in title
    finally:
        for fig in figures.values():
            plt.close(fig)


def test_latency_axes_turn_log_only_past_two_decades() -> None:
    light = result(stage("rate=1/s", 1.0, 1.0), stage("rate=2/s", 2.0, 1.5))
    with drawing(light) as figures:
        # 20-315 ms of TTFT and the 500 ms SLO: 25x
        (ttft,) = figures["ttft_cdf.png"].axes
        assert ttft.get_xscale() == "linear" and ttft.get_xlabel() == "TTFT (ms)"
    heavy = result(stage("rate=1/s", 1.0, 1.0), stage("rate=8/s", 8.0, 100.0))
    with drawing(heavy) as figures:
        sums = summaries(heavy)
        (latency,) = figures["latency_throughput.png"].axes
        shown = [v * 1e3 for s in sums for v in (s.ttft.p50, s.ttft.p99, s.latency.p50)]
        assert max(shown) / min(shown) > 100  # 115 ms to 20.8 s
        assert axis_scale([*shown, 500.0]) == "log"
        assert latency.get_yscale() == "log" and latency.get_ylabel() == "latency (ms, log scale)"


# -- the sweep's admission figures, against outcomes counted by hand --------------------------

WINDOW_S = 2.0
PROMPT, OUTPUT = 512, 64


def story_stage(
    rate: float,
    ttfts: list[float],
    *,
    failed: int = 0,
    refused: int = 0,
    over_prompt: int = 0,
    rejected: int = 0,
) -> StageResult:
    """`ttfts`: successes (TPOT 10 ms); `failed`: admitted, then timed out; `refused` and
    `over_prompt`: 429s of either refusal code; `rejected`: 429 rate_limit_exceeded."""
    records: list[Record] = []
    for ttft in ttfts:
        r = Record(len(records), 0, PROMPT, OUTPUT)
        r.start, r.status, r.tokens, r.events = len(records) * 0.01, 200, OUTPUT, OUTPUT + 2
        r.ttft, r.last_token = ttft, ttft + 0.63
        r.latency = r.last_token + 0.001
        records.append(r)
    for _ in range(failed):
        r = Record(len(records), 0, PROMPT, OUTPUT)
        r.start, r.error, r.latency = len(records) * 0.01, TIMEOUT, 1.9
        records.append(r)
    for code, n in (
        (TTFT_BUDGET, refused),
        (PROMPT_OVER_BUDGET, over_prompt),
        (RATE_LIMIT, rejected),
    ):
        for _ in range(n):
            r = Record(len(records), 0, PROMPT, OUTPUT)
            r.start, r.status, r.error, r.code = len(records) * 0.01, 429, HTTP, code
            r.latency = 0.003
            records.append(r)
    plan = replace(config("--rate", "1").stages[0], name=f"rate={rate:g}/s", rate=rate)
    return StageResult(plan, records, 0.0, WINDOW_S, 0.01, len(records), False)


def story(rates: tuple[float, ...] = (2.0, 4.0, 8.0, 16.0)) -> BenchResult:
    """Four stages of rising load: all admitted and within the 0.5 s budget; then refusals
    and one TTFT miss; then failures after admission and rejections too; then mostly 429s."""
    stages = [
        story_stage(rates[0], [0.1] * 10),
        story_stage(rates[1], [0.2] * 9 + [0.8], refused=3, over_prompt=1),
        story_stage(rates[2], [0.3] * 8, failed=2, refused=6, rejected=4),
        story_stage(rates[3], [0.4] * 5, refused=10, rejected=15),
    ]
    return result(*stages)


OFFERED = [10, 14, 20, 30]
ADMITTED_OK = [10, 10, 8, 5]
ADMITTED_FAILED = [0, 0, 2, 0]
REFUSED = [0, 4, 6, 10]
REJECTED = [0, 0, 4, 15]
MET = [10, 9, 8, 5]  # admitted, succeeded with TTFT <= 0.5 s (and TPOT 10 ms <= 50 ms)


def test_outcomes_are_stacked_bars_of_the_counts_against_offered_load() -> None:
    from narwhal.bench import plot_load

    res = story()
    with drawing(res) as figures:
        (ax,) = figures["admission_outcomes.png"].axes
        assert ax.get_title() == "Admission outcomes against offered load"
        assert ax.get_xlabel() == "offered load (req/s)" and ax.get_xscale() == "linear"
        assert ax.get_ylabel() == "requests"
        bars = {c.get_label(): c for c in ax.containers}
        assert list(bars) == [
            "admitted, succeeded", "admitted, failed", "refused (429 predictive)",
            "rejected (429 capacity)",
        ]  # fmt: skip
        expected = [ADMITTED_OK, ADMITTED_FAILED, REFUSED, REJECTED]
        bottom = [0, 0, 0, 0]
        for container, counts in zip(bars.values(), expected, strict=True):
            assert [p.get_height() for p in container.patches] == counts
            assert [p.get_y() for p in container.patches] == bottom  # stacked
            bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
        assert bottom == OFFERED  # each stack's top: the stage's offered requests
        assert bottom == [s.admission.offered for s in summaries(res)]
        centres = [p.get_x() + p.get_width() / 2 for p in bars["refused (429 predictive)"].patches]
        assert centres == pytest.approx([2.0, 4.0, 8.0, 16.0])
        assert all(p.get_width() == pytest.approx(0.6 * 2.0) for p in ax.patches)
        assert set(bars) == set(plot_load.COLORS)  # every outcome drawn here

    # without failures after admission, no bar for them
    calm = result(story_stage(1.0, [0.1] * 4, rejected=1), story_stage(2.0, [0.1] * 3, refused=2))
    with drawing(calm) as figures:
        (ax,) = figures["admission_outcomes.png"].axes
        labels = [c.get_label() for c in ax.containers]
        assert labels == [
            "admitted, succeeded",
            "refused (429 predictive)",
            "rejected (429 capacity)",
        ]


def test_attainment_of_the_admitted_beside_that_of_all_offered() -> None:
    res = story()
    with drawing(res) as figures:
        (ax,) = figures["attainment.png"].axes
        assert ax.get_title() == "TTFT budget attainment: admitted requests beside all offered"
        assert ax.get_ylabel() == "TTFT <= 0.5 s (%)"
        assert ax.get_xlabel() == "offered load (req/s)" and ax.get_xscale() == "linear"
        assert ax.get_yscale() == "linear" and ax.get_ylim() == (0, 105)
        lines = {line.get_label(): line for line in ax.get_lines()}
        admitted = lines["of admitted requests"]
        offered = lines["of all offered requests (admitted and within)"]
        target = lines["99% target"]
        assert list(admitted.get_xdata()) == [2.0, 4.0, 8.0, 16.0]
        admitted_counts = [a + f for a, f in zip(ADMITTED_OK, ADMITTED_FAILED, strict=True)]
        assert list(admitted.get_ydata()) == pytest.approx(
            [100 * m / a for m, a in zip(MET, admitted_counts, strict=True)]
        )  # 100, 90, 80, 100
        assert list(offered.get_ydata()) == pytest.approx(
            [100 * m / o for m, o in zip(MET, OFFERED, strict=True)]
        )  # 100, 64.3, 40, 16.7
        assert list(target.get_ydata()) == [99.0, 99.0]

    res.config = replace(res.config, slo=Slo())
    with drawing(res) as figures:
        # no --slo-ttft: success only, so the 0.8 s success counts
        (ax,) = figures["attainment.png"].axes
        assert ax.get_ylabel() == "succeeded (%)" and "success only" in ax.get_title()
        (admitted, *_) = ax.get_lines()
        assert list(admitted.get_ydata()) == pytest.approx([100, 100, 80, 100])


def test_token_goodput_beside_request_goodput() -> None:
    with drawing(story()) as figures:
        left, right = figures["goodput.png"].axes
        assert (left.get_title(), right.get_title()) == ("Request goodput", "Token goodput")
        assert left.get_ylabel() == "requests within the SLOs (req/s)"
        assert right.get_ylabel() == "prompt + output tokens within the SLOs (tokens/s)"
        for ax in (left, right):
            assert ax.get_xlabel() == "offered load (req/s)"
            assert ax.get_xscale() == ax.get_yscale() == "linear"
        requests = {line.get_label(): line for line in left.get_lines()}
        assert list(requests["offered"].get_ydata()) == [2.0, 4.0, 8.0, 16.0]
        assert list(requests["request goodput"].get_ydata()) == pytest.approx(
            [m / WINDOW_S for m in MET]
        )  # 5, 4.5, 4, 2.5
        (tokens,) = right.get_lines()
        assert tokens.get_label() == "token goodput"
        assert list(tokens.get_xdata()) == [2.0, 4.0, 8.0, 16.0]
        assert list(tokens.get_ydata()) == pytest.approx(
            [m * (PROMPT + OUTPUT) / WINDOW_S for m in MET]
        )  # 2880, 2592, 2304, 1440
        assert left.get_ylim()[0] == right.get_ylim()[0] == 0  # linear goodput from 0


def test_offered_load_over_two_decades_is_a_log_axis_with_bars_centred_on_it() -> None:
    with drawing(story((1.0, 10.0, 100.0, 1000.0))) as figures:
        (outcomes,) = figures["admission_outcomes.png"].axes
        assert outcomes.get_xscale() == "log"
        assert outcomes.get_xlabel() == "offered load (req/s, log scale)"
        (admitted, *_) = outcomes.containers
        for patch, load in zip(admitted.patches, (1.0, 10.0, 100.0, 1000.0), strict=True):
            low, high = patch.get_x(), patch.get_x() + patch.get_width()
            assert (low * high) ** 0.5 == pytest.approx(load)  # centred on a log axis
            assert high / low == pytest.approx(10**0.6)  # 60% of the decade between loads
        (attainment,) = figures["attainment.png"].axes
        assert attainment.get_xscale() == "log" and attainment.get_yscale() == "linear"
        left, right = figures["goodput.png"].axes
        assert left.get_xscale() == right.get_xscale() == "log"
        assert left.get_yscale() == "log"  # offered 1 to 1000 req/s beside 2.5 to 5
        assert right.get_yscale() == "linear"  # 1440 to 2880 tokens/s
        sweep_left, sweep_right = figures["sweep.png"].axes
        assert sweep_left.get_xscale() == sweep_right.get_xscale() == "log"
        assert sweep_left.get_xlabel() == "offered load (req/s, log scale)"
