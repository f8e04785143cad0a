"""Linear or log for a plot's axis: the one rule every latency and rate axis follows.
Pure, so it runs without matplotlib."""

from __future__ import annotations

import math

import pytest

from narwhal.bench.plot_axes import LINEAR, LOG, LOG_RANGE, axis_label, axis_scale


@pytest.mark.parametrize(
    ("values", "scale"),
    [
        ([], LINEAR),  # nothing to show
        ([5.0], LINEAR),  # one value has no range
        ([20.0, 210.0, 500.0], LINEAR),  # 25x: a light stage and its SLO
        ([1.0, LOG_RANGE], LINEAR),  # exactly 100x: still linear
        ([1.0, 100.5], LOG),  # more than two decades
        ([20.0, 6300.0], LOG),  # tens of milliseconds beside seconds
        ([0.0, 1.0, 1000.0], LINEAR),  # a 0 (a goodput that fell to 0) a log axis would hide
        ([-1.0, 1000.0], LINEAR),
        ([math.nan, 1.0, 1000.0], LOG),  # NaN (not observed) takes no part
        ([math.nan, 5.0], LINEAR),
        ([math.inf, 1.0, 2.0], LINEAR),
        ((v for v in (0.002, 0.5)), LOG),  # any iterable; 250x
    ],
)
def test_axis_scale(values: list[float], scale: str) -> None:
    assert axis_scale(values) == scale


def test_axis_label_says_log_only_on_a_log_axis() -> None:
    assert axis_label("TTFT", "ms", LINEAR) == "TTFT (ms)"
    assert axis_label("TTFT", "ms", LOG) == "TTFT (ms, log scale)"
