"""One /metrics for several processes (`observability/merged.py`), sans-IO: real
registries of `RouterMetrics`, merged as the decision process merges its workers'."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from narwhal.observability.merged import MergedRegistry, families_of
from narwhal.observability.metrics import RouterMetrics


def values(merged: MergedRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The merged exposition as Prometheus would read it."""
    text = generate_latest(merged).decode()  # type: ignore[arg-type]
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def served(metrics: RouterMetrics, offered: int, completed: int) -> None:
    for _ in range(offered):
        metrics.offered.inc()
    for _ in range(completed):
        metrics.count_outcome("completed")


def test_counters_sum_across_processes_and_gauges_are_the_decision_processs() -> None:
    decision, a, b = RouterMetrics(), RouterMetrics(), RouterMetrics()
    served(a, 5, 5)
    served(b, 3, 2)
    decision.queue_depth.set(7)
    a.queue_depth.set(99)  # a worker's view of the queue: never the one shown
    merged = MergedRegistry(decision.registry)
    merged.update("a", families_of(a.registry))
    merged.update("b", families_of(b.registry))
    got = values(merged)
    assert got["narwhal_offered_total", ()] == 8
    assert got["narwhal_outcomes_total", (("outcome", "completed"),)] == 7
    assert got["narwhal_admission_queue_depth", ()] == 7


def test_a_gone_worker_stays_counted_and_its_held_requests_end_once_as_errors() -> None:
    decision, a = RouterMetrics(), RouterMetrics()
    served(a, 5, 3)  # two in flight when it dies
    merged = MergedRegistry(decision.registry)
    merged.update("a", families_of(a.registry))
    merged.retire("a")
    merged.retire("a")  # a second end of the same worker counts nothing more
    restarted = RouterMetrics()
    served(restarted, 1, 1)
    merged.update("a2", families_of(restarted.registry))
    got = values(merged)
    assert got["narwhal_offered_total", ()] == 6
    assert got["narwhal_outcomes_total", (("outcome", "completed"),)] == 4
    assert got["narwhal_outcomes_total", (("outcome", "internal_error"),)] == 2
