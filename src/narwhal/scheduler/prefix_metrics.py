"""The prefix indexes' Prometheus series, read from them when /metrics is scraped
(`fleet.policy: cache_aware` only), so an operator sees when the approximation drifts:

    narwhal_prefix_index_blocks{engine}                  blocks the engine's index holds
    narwhal_prefix_index_capacity_blocks{engine}         what it may hold (engine's KV, capped)
    narwhal_prefix_predicted_hit_ratio{engine}           Narwhal's predicted hits / prompt
                                                         tokens placed, recent window
    narwhal_prefix_engine_hit_ratio{engine}              the engine's own (vLLM's prefix-cache
                                                         counters), same window
    narwhal_prefix_predicted_hit_tokens_total{engine}    prompt tokens predicted cached
    narwhal_prefix_placed_prompt_tokens_total{engine}    prompt tokens placed there
    narwhal_prefix_index_resets_total{engine}            indexes forgotten (restart, drift)

A ratio without a window's traffic (or, for the engine's, without its counters) is not
exported rather than exported as zero.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from narwhal.scheduler.prefix_cache import PrefixCache
from narwhal.scheduler.registry import EngineEntry


class PrefixCollector(Collector):
    def __init__(self, prefix: PrefixCache, entries: Callable[[], list[EngineEntry]]) -> None:
        self._prefix = prefix
        self._entries = entries

    def collect(self) -> Iterator[Metric]:
        labels = ["engine"]
        blocks = GaugeMetricFamily(
            "narwhal_prefix_index_blocks",
            "Prompt blocks Narwhal's prefix index holds for the engine.",
            labels=labels,
        )
        capacity = GaugeMetricFamily(
            "narwhal_prefix_index_capacity_blocks",
            "Blocks the engine's index may hold: its KV cache as scraped, within "
            "fleet.prefix_index.max_blocks.",
            labels=labels,
        )
        predicted = GaugeMetricFamily(
            "narwhal_prefix_predicted_hit_ratio",
            "Prompt tokens Narwhal predicted cached on the engine, over those it placed there "
            "(recent window).",
            labels=labels,
        )
        engine = GaugeMetricFamily(
            "narwhal_prefix_engine_hit_ratio",
            "The engine's own prefix-cache hit ratio (its hit and query counters), same window.",
            labels=labels,
        )
        hit_tokens = CounterMetricFamily(
            "narwhal_prefix_predicted_hit_tokens",
            "Prompt tokens Narwhal predicted the engine would find cached.",
            labels=labels,
        )
        placed = CounterMetricFamily(
            "narwhal_prefix_placed_prompt_tokens",
            "Prompt tokens of the requests Narwhal placed on the engine (their prefill).",
            labels=labels,
        )
        resets = CounterMetricFamily(
            "narwhal_prefix_index_resets",
            "Times the engine's index was forgotten (engine restart, or drift from its counters).",
            labels=labels,
        )
        prefix = self._prefix
        for entry in self._entries():
            state = prefix.engines.get(entry.name)
            if state is None:
                continue
            prefix.follow(entry)
            name = [entry.name]
            blocks.add_metric(name, len(state.index))
            capacity.add_metric(name, state.index.capacity)
            ratio = state.accuracy.predicted_ratio()
            if ratio is not None:
                predicted.add_metric(name, ratio)
            ratio = state.accuracy.engine_ratio()
            if ratio is not None:
                engine.add_metric(name, ratio)
            hit_tokens.add_metric(name, state.predicted_hit_tokens)
            placed.add_metric(name, state.placed_tokens)
            resets.add_metric(name, state.resets)
        yield from (blocks, capacity, predicted, engine, hit_tokens, placed, resets)
