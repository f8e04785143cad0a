"""Fleet monitoring: engine health checks and metrics scrapes (DESIGN.md §2, §4)."""

from narwhal.fleet.monitor import FleetMonitor
from narwhal.fleet.scrape import EngineScrape, parse_engine_metrics
from narwhal.fleet.state import EngineHealth, HealthCheck, MetricsFailure

__all__ = [
    "EngineHealth",
    "EngineScrape",
    "FleetMonitor",
    "HealthCheck",
    "MetricsFailure",
    "parse_engine_metrics",
]
