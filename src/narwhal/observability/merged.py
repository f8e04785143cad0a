"""One `/metrics` for several processes: the decision process's series and its relay
workers', merged (Step 16).

Each worker sends its registry's families as plain values (`families_of`), when the
decision process asks (`narwhal.transport`, before each scrape of `/metrics` and every
second). `MergedRegistry.collect()` then yields one family per name:

- counters, histograms and summaries: every process's samples summed by sample name
  and labels, so `narwhal_offered_total` is the router's, as the seed counts it;
- gauges and info: the decision process's where it has the family (the queue, slots,
  retention, engines: what it decides), else the workers' summed (what only workers
  hold).

A worker that is gone keeps counting what it had counted (`retire`): its counters and
histograms as last sent stay in every sum, so no counter goes backwards when a worker
dies or restarts (a restarted one counts from zero again beside them). A request the gone
worker held then had been offered and had no outcome yet; each such request is counted
once as an `internal_error` outcome, so offered still equals the sum of outcomes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Final

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

Labels = tuple[tuple[str, str], ...]
# A family as plain values: name, type, help, and its samples (sample name, labels, value).
Family = tuple[str, str, str, tuple[tuple[str, Labels, float], ...]]

_SUMMED: Final = frozenset({"counter", "histogram", "summary", "gaugehistogram", "unknown"})
_OUTCOMES: Final = "narwhal_outcomes"
_OFFERED: Final = "narwhal_offered"


def families_of(registry: CollectorRegistry) -> tuple[Family, ...]:
    """The registry's families as plain values, to send to the decision process."""
    return tuple(
        (
            metric.name,
            metric.type,
            metric.documentation,
            tuple(
                (s.name, tuple(sorted(s.labels.items())), float(s.value)) for s in metric.samples
            ),
        )
        for metric in registry.collect()
    )


class MergedRegistry:
    """What `Exposition` renders in the decision process: its own registry and its
    workers' families (`update`, `retire`), merged as the module says."""

    def __init__(self, own: CollectorRegistry) -> None:
        self._own = own
        self._workers: dict[str, tuple[Family, ...]] = {}
        self._retired: dict[str, dict[tuple[str, Labels], float]] = {}  # by family name
        self._types: dict[str, tuple[str, str]] = {}  # a retired family's type and help

    def update(self, worker: str, families: tuple[Family, ...]) -> None:
        self._workers[worker] = families

    def retire(self, worker: str) -> None:
        """The worker is gone: what it counted stays counted, and each request it held
        (offered, without an outcome) is counted once as an internal error."""
        families = self._workers.pop(worker, ())
        for name, kind, documentation, samples in families:
            if kind not in _SUMMED:
                continue
            kept = self._retired.setdefault(name, {})
            self._types.setdefault(name, (kind, documentation))
            for sample, labels, value in samples:
                kept[sample, labels] = kept.get((sample, labels), 0.0) + value
        held = _offered(families) - _ended(families)
        if held > 0:
            outcomes = self._retired.setdefault(_OUTCOMES, {})
            key = (f"{_OUTCOMES}_total", (("outcome", "internal_error"),))
            outcomes[key] = outcomes.get(key, 0.0) + held

    def collect(self) -> Iterator[Metric]:
        own = {metric.name: metric for metric in self._own.collect()}
        workers: dict[str, list[Family]] = {}
        for families in self._workers.values():
            for family in families:
                workers.setdefault(family[0], []).append(family)
        # The decision process's families in its order, then those only workers have.
        names = dict.fromkeys([*own, *workers, *self._retired])
        for name in names:
            yield self._merged(name, own.get(name), workers.get(name, []))

    def _merged(self, name: str, own: Metric | None, workers: Sequence[Family]) -> Metric:
        kind, documentation = (
            (own.type, own.documentation)
            if own is not None
            else (workers[0][1], workers[0][2])
            if workers
            else self._types[name]
        )
        merged = Metric(name, documentation, kind)
        if kind not in _SUMMED and own is not None:
            merged.samples = list(own.samples)
            return merged
        sums: dict[tuple[str, Labels], float] = {}
        if own is not None:
            for s in own.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                sums[key] = sums.get(key, 0.0) + float(s.value)
        sources: Iterable[tuple[str, Labels, float]] = (s for f in workers for s in f[3])
        for sample, labels, value in sources:
            sums[sample, labels] = sums.get((sample, labels), 0.0) + value
        if kind in _SUMMED:
            for key, value in self._retired.get(name, {}).items():
                sums[key] = sums.get(key, 0.0) + value
        merged.samples = [Sample(s, dict(labels), value) for (s, labels), value in sums.items()]
        return merged


def _offered(families: Iterable[Family]) -> float:
    return _total(families, _OFFERED)


def _ended(families: Iterable[Family]) -> float:
    return _total(families, _OUTCOMES)


def _total(families: Iterable[Family], name: str) -> float:
    """The counter's count: its `_total` samples (not `_created`, where they are kept)."""
    total = f"{name}_total"
    return sum(v for n, _, _, samples in families if n == name for s, _, v in samples if s == total)
