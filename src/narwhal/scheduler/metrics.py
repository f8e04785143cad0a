"""Each engine's place in placement on /metrics, read from the registry at scrape time.

    narwhal_engine_eligible{engine}        1 when placement may send it new work, else 0
    narwhal_engine_drained{engine}         1 while an operator has it drained, else 0
    narwhal_engine_in_maintenance{engine}  1 while its maintenance wave is active, else 0

Computed when /metrics is rendered, so they cannot go stale and nothing is updated on the
admin routes or the fleet monitor's probes. Drained and in maintenance are independent
(an engine may be both); eligible is the registry's own answer, which also needs the
engine healthy, serving the model and (predictive admission) profiled, so an engine that
is neither drained nor in maintenance and still not eligible is down or unprofiled.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from narwhal.scheduler.registry import EngineRegistry


class EngineStateCollector(Collector):
    def __init__(self, engines: EngineRegistry) -> None:
        self._engines = engines

    def describe(self) -> Iterator[Metric]:
        # Names only, so registering does not have to collect.
        return iter(_families())

    def collect(self) -> Iterator[Metric]:
        eligible, drained, maintenance = _families()
        engines = self._engines
        waves = engines.active_waves
        for name, entry in engines.entries.items():
            wave = entry.config.wave
            eligible.add_metric([name], 1.0 if engines.eligible(entry) else 0.0)
            drained.add_metric([name], 1.0 if entry.drained else 0.0)
            maintenance.add_metric([name], 1.0 if wave is not None and wave in waves else 0.0)
        return iter((eligible, drained, maintenance))


def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
    def gauge(name: str, doc: str) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, doc, labels=["engine"])

    return (
        gauge(
            "narwhal_engine_eligible",
            "1 when placement may send the engine new work (healthy, serving the model, "
            "profiled in predictive mode, not drained, not in maintenance), else 0.",
        ),
        gauge("narwhal_engine_drained", "1 while an operator has the engine drained, else 0."),
        gauge(
            "narwhal_engine_in_maintenance",
            "1 while the engine's maintenance wave is active, else 0.",
        ),
    )
