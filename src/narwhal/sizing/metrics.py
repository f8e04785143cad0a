"""Prompt sizing on /metrics, read from the sizer at scrape time.

    narwhal_prompt_sizing_total{source}                    requests, by the size their
        admission acted on: local (tokenizer.json or token IDs), engine (an engine's
        count, cached or waited for), calibrated (the estimate, decided at once),
        fallback (waited for an engine's count and decided on the estimate without it),
        estimate (open admission: the estimate as it is)
    narwhal_prompt_size_estimate_error_ratio{route,bound}   the calibrated estimate's
        bounds, engine count over estimate (low, high); only while estimates are calibrated
    narwhal_tokenize_calls_total{result}                   calls to engines' tokenize
        endpoints: answered, cache_hit, no_engine, or the failure's kind

Computed when /metrics is rendered, so nothing is updated on the request path.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from narwhal.protocol.requests import Route
from narwhal.sizing import SOURCES, WorkloadSizer
from narwhal.sizing.remote import FAILURE_KINDS

_ROUTES: tuple[Route, ...] = ("chat", "completion")
_CALL_RESULTS = (("answered", "answered"), ("cache_hit", "cache_hits"), ("no_engine", "no_engine"))


class SizingCollector(Collector):
    def __init__(self, sizer: WorkloadSizer) -> None:
        self._sizer = sizer

    def describe(self) -> Iterator[Metric]:
        # Names only, so registering does not have to collect.
        sizing, bounds, calls = _families()
        return iter((sizing, bounds, calls) if self._sizer.calibrating else (sizing,))

    def collect(self) -> Iterator[Metric]:
        sizer = self._sizer
        sizing, bounds, calls = _families()
        for source in SOURCES:
            sizing.add_metric([source], float(sizer.sizes[source]))
        if not sizer.calibrating:
            return iter((sizing,))
        for route in _ROUTES:
            low, high = sizer.bounds(route)
            bounds.add_metric([route, "low"], low)
            bounds.add_metric([route, "high"], high)
        stats = sizer.stats()
        for result, key in _CALL_RESULTS:
            calls.add_metric([result], float(stats.get(f"tokenize_{key}", 0)))
        for kind in FAILURE_KINDS:
            calls.add_metric([kind], float(stats.get(f"tokenize_failed_{kind}", 0)))
        return iter((sizing, bounds, calls))


def _families() -> tuple[CounterMetricFamily, GaugeMetricFamily, CounterMetricFamily]:
    return (
        CounterMetricFamily(
            "narwhal_prompt_sizing",
            "Requests by the prompt size their admission acted on: local (tokenizer.json or "
            "token IDs), engine (an engine's count), calibrated (the estimate, decided at "
            "once), fallback (no engine count within admission.sizing_wait_s), estimate "
            "(open admission).",
            labels=["source"],
        ),
        GaugeMetricFamily(
            "narwhal_prompt_size_estimate_error_ratio",
            "Bounds of the calibrated prompt estimate: the engines' count over the estimate, "
            "as it falls for 99% of prompts (wide defaults until learned).",
            labels=["route", "bound"],
        ),
        CounterMetricFamily(
            "narwhal_tokenize_calls",
            "Prompt counts asked of engines' tokenize endpoints, by result: answered, "
            "cache_hit (not asked), no_engine, or the failure's kind.",
            labels=["result"],
        ),
    )
