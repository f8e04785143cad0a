"""The fleet's series on the router's Prometheus registry (`narwhal_engine_*`).

The gauges are produced by a collector that reads each engine's `EngineHealth` when
/metrics is rendered, so `narwhal_engine_scrape_age_seconds` is the age at that moment
and nothing has to be kept in sync on every probe. A gauge whose value is unknown (no
good scrape yet, or the engine's page lacked that metric) is left out rather than
shown as 0, which would read as an idle engine. The failure counter is an ordinary
Counter with every series created at start.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Final

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from narwhal.fleet.state import EngineHealth

PROBES: Final = ("health", "metrics")


class FleetMetrics:
    def __init__(
        self,
        registry: CollectorRegistry,
        states: Mapping[str, EngineHealth],
        clock: Callable[[], float],
    ) -> None:
        """`states`: every engine's live health, read at each scrape (the monitor's own
        mapping, which follows engines added and removed)."""
        self._registry = registry
        self.probe_failures = Counter(
            "narwhal_engine_probe_failures",
            "Failed engine probes, by engine and probe (health or metrics).",
            ["engine", "probe"],
            registry=registry,
        )
        # Resolved once: a label lookup takes a lock and a dict probe on every call.
        self._failures = {
            (name, probe): self.probe_failures.labels(name, probe)
            for name in states
            for probe in PROBES
        }
        self._collector = _EngineCollector(states, clock)
        registry.register(self._collector)

    def count_failure(self, engine: str, probe: str) -> None:
        self._failures[engine, probe].inc()

    def add(self, engine: str) -> None:
        """Series for an engine added while running (its gauges follow `states`)."""
        for probe in PROBES:
            self._failures[engine, probe] = self.probe_failures.labels(engine, probe)

    def remove(self, engine: str) -> None:
        """An engine removed from the fleet: its series go."""
        for probe in PROBES:
            if self._failures.pop((engine, probe), None) is not None:
                self.probe_failures.remove(engine, probe)

    def unregister(self) -> None:
        """Take the fleet's series off the registry, so a new monitor can register."""
        self._registry.unregister(self._collector)
        self._registry.unregister(self.probe_failures)


class _EngineCollector(Collector):
    def __init__(self, states: Mapping[str, EngineHealth], clock: Callable[[], float]) -> None:
        self._states = states
        self._clock = clock

    def describe(self) -> Iterator[Metric]:
        # Names only, so registering does not have to collect.
        return iter(_families())

    def collect(self) -> Iterator[Metric]:
        up, age, running, waiting, kv = _families()
        now = self._clock()
        for name, state in self._states.items():
            up.add_metric([name], 1.0 if state.healthy else 0.0)
            scrape_age = state.scrape_age(now)
            if scrape_age is not None:
                age.add_metric([name], scrape_age)
            scrape = state.last_scrape
            if scrape is None:
                continue
            for family, value in (
                (running, scrape.running),
                (waiting, scrape.waiting),
                (kv, scrape.kv_usage),
            ):
                if value is not None:
                    family.add_metric([name], value)
        return iter((up, age, running, waiting, kv))


def _families() -> tuple[
    GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily
]:
    def gauge(name: str, doc: str) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, doc, labels=["engine"])

    return (
        gauge("narwhal_engine_up", "1 when the engine's last health checks passed, else 0."),
        gauge(
            "narwhal_engine_scrape_age_seconds",
            "Seconds since the engine's metrics were last read successfully.",
        ),
        gauge("narwhal_engine_running", "Requests running on the engine (last good scrape)."),
        gauge("narwhal_engine_waiting", "Requests waiting on the engine (last good scrape)."),
        gauge(
            "narwhal_engine_kv_usage",
            "Fraction of the engine's KV cache in use, 0-1 (last good scrape).",
        ),
    )
