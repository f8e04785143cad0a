"""narwhal_engine_eligible / _drained / _in_maintenance, read from the registry when scraped."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from narwhal.config import EngineConfig
from narwhal.scheduler.metrics import EngineStateCollector
from narwhal.scheduler.registry import EngineRegistry
from tests.metrics_text import samples


def gauges(registry: CollectorRegistry) -> dict[str, dict[str, float]]:
    """{engine: {"eligible": v, "drained": v, "in_maintenance": v}}"""
    out: dict[str, dict[str, float]] = {}
    for key, value in samples(generate_latest(registry).decode()).items():
        name, _, labels = key.partition("{")
        engine = labels.removeprefix('engine="').removesuffix('"}')
        out.setdefault(engine, {})[name.removeprefix("narwhal_engine_")] = value
    return out


def test_each_gauge_follows_the_registry_at_every_scrape() -> None:
    down: set[str] = set()
    engines = EngineRegistry(
        [
            EngineConfig(name="a", url="http://127.0.0.1:1", wave=1),
            EngineConfig(name="b", url="http://127.0.0.1:2"),
        ],
        healthy=lambda name: name not in down,
    )
    registry = CollectorRegistry()
    registry.register(EngineStateCollector(engines))
    up = {"eligible": 1.0, "drained": 0.0, "in_maintenance": 0.0}
    assert gauges(registry) == {"a": up, "b": up}

    engines.set_drained("b", True)
    assert gauges(registry)["b"] == {"eligible": 0.0, "drained": 1.0, "in_maintenance": 0.0}
    engines.set_wave(1, True)
    assert gauges(registry)["a"] == {"eligible": 0.0, "drained": 0.0, "in_maintenance": 1.0}
    engines.set_drained("a", True)  # both at once: each gauge says its own
    assert gauges(registry)["a"] == {"eligible": 0.0, "drained": 1.0, "in_maintenance": 1.0}

    engines.set_wave(1, False)
    engines.set_drained("a", False)
    engines.set_drained("b", False)
    down.add("b")  # neither drained nor in maintenance, and still not eligible: down
    engines.invalidate()
    assert gauges(registry) == {
        "a": up,
        "b": {"eligible": 0.0, "drained": 0.0, "in_maintenance": 0.0},
    }
