"""The figures `--plot` draws, read back through matplotlib: which there are, their axes'
scales and titles, and the run's context in every figure's title."""

from __future__ import annotations

import argparse
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from narwhal.bench import cli
from narwhal.bench.config import from_args
from narwhal.bench.histogram import LogHistogram
from narwhal.bench.record import HTTP, Record
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


def test_every_figure_is_titled_with_the_runs_context() -> None:
    import matplotlib.pyplot as plt

    res = result(stage("rate=1/s", 1.0, 1.0), stage("rate=8/s", 8.0, 30.0))
    figures = drawn(res)
    try:
        assert sorted(figures) == [
            "latency_over_time.png", "latency_throughput.png", "sweep.png",
            "tpot_itl_cdf.png", "ttft_cdf.png",
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
        labels = [t.get_text() for t in ttft.get_legend().get_texts()]
        assert labels == ["rate=1/s", "rate=8/s", "TTFT SLO"]
        # the light stage's 20-210 ms sit on the same axis as the heavy one's 0.6-6.3 s
        low, high = ttft.get_xlim()
        assert low < 20 and high > 6300

        (tokens,) = figures["tpot_itl_cdf.png"].axes
        assert tokens.get_xscale() == "log" and "ITL" in tokens.get_title()
        labels = [t.get_text() for t in tokens.get_legend().get_texts()]
        assert "rate=1/s TPOT" in labels and "rate=1/s ITL (48% of gaps 0)" in labels
        itl_line = next(line for line in tokens.get_lines() if line.get_label().endswith("0)"))
        ys = list(itl_line.get_ydata())
        assert ys[0] == pytest.approx(600 / 1260) and ys[-1] == pytest.approx(1.0)

        (latency,) = figures["latency_throughput.png"].axes
        assert latency.get_title() == "Latency against achieved throughput"
        assert latency.get_yscale() == "log"
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
