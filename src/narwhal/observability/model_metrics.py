"""The models' Prometheus series, read from the models when /metrics is scraped.

Nothing is updated on the request path: a collector walks the engine models at scrape
time (a handful of engines), so the models stay plain objects and cost nothing extra.

    narwhal_engine_profiled{engine}                       1 once profiled, else 0
    narwhal_engine_backlog_seconds{engine}                prefill work ahead of a new request
    narwhal_engine_tpot_predicted_seconds{engine}         TPOT for one more request there
    narwhal_engine_tpot_observed_seconds{engine}          average TPOT requests saw there
    narwhal_engine_drift{engine,quantity}                 log(observed / profile), > 0 slower
    narwhal_engine_reprofiles_total{engine}               re-profiles (drift, a restart)
    narwhal_engine_profile_attempts_total{engine}         profiling runs started
    narwhal_engine_probe_tokens_total{engine}             tokens the probes had it serve
    narwhal_engine_idle_probes_total{engine}              probes of an engine refused while idle
    narwhal_ttft_projection_factor{quantile}              measured / projected TTFT (0.5, 0.99)
    narwhal_engine_ttft_bound_factor{engine}              the ratio the engine's bound applies
    narwhal_ttft_bound_total{outcome}                     admitted requests whose first token
                                                          came within / after their bound
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from narwhal.models.book import ModelBook


class ModelCollector(Collector):
    def __init__(
        self,
        book: ModelBook,
        decoding: Callable[[str], float],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`decoding(name)`: the engine's decode batch now (for its TPOT prediction)."""
        self._book = book
        self._decoding = decoding
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        now = self._clock()
        engines = self._book.engines
        profiled = GaugeMetricFamily(
            "narwhal_engine_profiled", "1 once the engine is profiled, else 0.", labels=["engine"]
        )
        backlog = GaugeMetricFamily(
            "narwhal_engine_backlog_seconds",
            "Prefill work Narwhal has placed on the engine, left ahead of a new request.",
            labels=["engine"],
        )
        predicted = GaugeMetricFamily(
            "narwhal_engine_tpot_predicted_seconds",
            "TPOT the engine's model predicts for one more request there.",
            labels=["engine"],
        )
        observed = GaugeMetricFamily(
            "narwhal_engine_tpot_observed_seconds",
            "Average TPOT requests decoding on the engine saw (from validated token IDs).",
            labels=["engine"],
        )
        drift = GaugeMetricFamily(
            "narwhal_engine_drift",
            "Drift from the engine's profile: mean log(observed / profile); > 0 is slower.",
            labels=["engine", "quantity"],
        )
        reprofiles = CounterMetricFamily(
            "narwhal_engine_reprofiles",
            "Re-profiles: after drift, or of a new process (a restart, a new max_model_len).",
            labels=["engine"],
        )
        attempts = CounterMetricFamily(
            "narwhal_engine_profile_attempts", "Profiling runs started.", labels=["engine"]
        )
        probe_tokens = CounterMetricFamily(
            "narwhal_engine_probe_tokens",
            "Prompt and output tokens the profiling probes had the engine serve (never "
            "counted as client traffic).",
            labels=["engine"],
        )
        idle_probes = CounterMetricFamily(
            "narwhal_engine_idle_probes",
            "Probes sent to the engine because its bound refused requests while it sat "
            "idle, to learn from (narwhal.models.idle_refusals).",
            labels=["engine"],
        )
        for name, model in engines.items():
            profiled.add_metric([name], 1.0 if model.profiled else 0.0)
            decoding = self._decoding(name)
            backlog.add_metric([name], model.backlog(now, decoding))
            predicted.add_metric([name], model.tpot(decoding + 1.0, now))
            observed.add_metric([name], model.tpot_observed or 0.0)
            drift.add_metric([name, "prefill"], model.prefill_drift.score)
            drift.add_metric([name, "tpot"], model.tpot_drift.score)
            reprofiles.add_metric([name], model.profiling.reprofiles)
            attempts.add_metric([name], model.profiling.attempts)
            probe_tokens.add_metric([name], model.profiling.probe_tokens)
            idle_probes.add_metric([name], model.idle_refusals.probes)
        factor = GaugeMetricFamily(
            "narwhal_ttft_projection_factor",
            "Measured / projected TTFT of admitted requests, by quantile: 0.5 corrects the "
            "projection, 0.99 is the margin admission applies.",
            labels=["quantile"],
        )
        factor.add_metric(["0.5"], self._book.bias.value)
        factor.add_metric(["0.99"], self._book.margin.value)
        bound_factor = GaugeMetricFamily(
            "narwhal_engine_ttft_bound_factor",
            "The ratio the engine's TTFT bound applies to its projections, as they have "
            "turned out there (its calibration's 99.5th percentile, over all projections).",
            labels=["engine"],
        )
        for name, model in engines.items():
            bound_factor.add_metric([name], model.calibration.factor)
        bound = CounterMetricFamily(
            "narwhal_ttft_bound",
            "Admitted requests with a projection, by whether their first token came within "
            "the upper bound admission held the projection to.",
            labels=["outcome"],
        )
        bound.add_metric(["within"], self._book.bound_within)
        bound.add_metric(["exceeded"], self._book.bound_exceeded)
        yield from (
            profiled,
            backlog,
            predicted,
            observed,
            drift,
            reprofiles,
            attempts,
            probe_tokens,
            idle_probes,
            factor,
            bound_factor,
            bound,
        )
