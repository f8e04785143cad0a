"""The fleet's `narwhal_engine_*` series on the router's registry."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from narwhal.config import EngineConfig, FleetConfig
from narwhal.fleet.metrics import FleetMetrics
from narwhal.fleet.scrape import EngineScrape
from narwhal.fleet.state import EngineHealth, HealthCheck
from narwhal.observability.metrics import RouterMetrics
from tests.fleet.conftest import MonitorFactory
from tests.fleet.fake_engine import FakeEngine
from tests.metrics_text import samples

SLOW = FleetConfig(probe_interval_s=10.0, stale_after_s=30.0, probe_timeout_s=0.2)


def read(registry: CollectorRegistry) -> dict[str, float]:
    return samples(generate_latest(registry).decode())


def test_gauges_are_read_at_collection_time() -> None:
    now = [100.0]
    states = {"a": EngineHealth(stale_after_s=5.0), "b": EngineHealth(stale_after_s=5.0)}
    registry = CollectorRegistry(auto_describe=True)
    metrics = FleetMetrics(registry, states, lambda: now[0])

    values = read(registry)
    assert values['narwhal_engine_up{engine="a"}'] == 0.0
    assert values['narwhal_engine_probe_failures_total{engine="b",probe="metrics"}'] == 0.0
    # Unknown values are absent, not zero (zero would read as an idle engine).
    assert not any(k.startswith("narwhal_engine_scrape_age_seconds") for k in values)
    assert not any(k.startswith("narwhal_engine_running") for k in values)

    states["a"].record_health(HealthCheck.OK, 100.0)
    states["a"].record_scrape(EngineScrape(running=3.0, waiting=None, kv_usage=0.5), 98.5)
    metrics.count_failure("b", "health")
    now[0] = 101.0
    values = read(registry)
    assert values['narwhal_engine_up{engine="a"}'] == 1.0
    assert values['narwhal_engine_scrape_age_seconds{engine="a"}'] == 2.5
    assert values['narwhal_engine_running{engine="a"}'] == 3.0
    assert values['narwhal_engine_kv_usage{engine="a"}'] == 0.5
    assert 'narwhal_engine_waiting{engine="a"}' not in values
    assert values['narwhal_engine_probe_failures_total{engine="b",probe="health"}'] == 1.0
    now[0] = 104.0
    assert read(registry)['narwhal_engine_scrape_age_seconds{engine="a"}'] == 5.5

    metrics.unregister()
    assert not any(k.startswith("narwhal_engine_") for k in read(registry))


async def test_monitor_series_on_the_router_registry(
    make_monitor: MonitorFactory, fake_engine: FakeEngine, closed_port: int
) -> None:
    router = RouterMetrics()
    engines = [
        EngineConfig(name="e0", url=fake_engine.url),
        EngineConfig(name="gone", url=f"http://127.0.0.1:{closed_port}"),
    ]
    monitor = make_monitor(engines, SLOW, registry=router.registry)
    await monitor.start()
    values = samples(router.render().decode())
    assert values['narwhal_engine_up{engine="e0"}'] == 1.0
    assert values['narwhal_engine_up{engine="gone"}'] == 0.0
    assert values['narwhal_engine_running{engine="e0"}'] == 5.0
    assert values['narwhal_engine_waiting{engine="e0"}'] == 5.0
    assert values['narwhal_engine_kv_usage{engine="e0"}'] == 0.375
    assert 0 <= values['narwhal_engine_scrape_age_seconds{engine="e0"}'] < 5
    assert values['narwhal_engine_probe_failures_total{engine="e0",probe="health"}'] == 0.0
    assert values['narwhal_engine_probe_failures_total{engine="gone",probe="health"}'] == 1.0
    assert values['narwhal_engine_probe_failures_total{engine="gone",probe="metrics"}'] == 1.0
    assert "narwhal_offered_total" in values  # the router's own series are untouched

    # close() takes the series off, so a new monitor can take the same registry.
    await monitor.close()
    assert not any(k.startswith("narwhal_engine_") for k in samples(router.render().decode()))
    again = make_monitor(engines[:1], SLOW, registry=router.registry)
    await again.start()
    assert samples(router.render().decode())['narwhal_engine_up{engine="e0"}'] == 1.0


async def test_unsupported_metrics_are_not_counted_as_failures(
    make_monitor: MonitorFactory, fake_engine: FakeEngine
) -> None:
    fake_engine.metrics = "404"
    registry = CollectorRegistry(auto_describe=True)
    monitor = make_monitor(
        [EngineConfig(name="hf", url=fake_engine.url, dialect="openai")], SLOW, registry=registry
    )
    await monitor.start()
    values = read(registry)
    assert values['narwhal_engine_probe_failures_total{engine="hf",probe="metrics"}'] == 0.0
    assert values['narwhal_engine_up{engine="hf"}'] == 1.0


def test_two_monitors_cannot_share_a_registry_at_once() -> None:
    registry = CollectorRegistry(auto_describe=True)
    states = {"a": EngineHealth(stale_after_s=5.0)}
    FleetMetrics(registry, states, lambda: 0.0)
    with pytest.raises(ValueError, match="Duplicated"):
        FleetMetrics(registry, states, lambda: 0.0)
