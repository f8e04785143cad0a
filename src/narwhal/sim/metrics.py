"""The sim's Prometheus metrics, with vLLM's (or SGLang's) names and labels.

Each sim owns a `CollectorRegistry` (several sims may share one process). Recording is
on the engine's hot path, once per token, so it uses plain lists instead of
prometheus_client's locked metric objects; a custom collector turns them into metric
families at scrape time, and reads the load gauges and the prefix-cache counters live
from the scheduler.

Prefix caching, as each engine reports it:
- vLLM: `vllm:prefix_cache_queries` and `vllm:prefix_cache_hits` (tokens looked up and
  found, counted at admission; `_total` in the exposition), and `vllm:cache_config_info`,
  an info-style gauge (value 1) whose labels are the cache config as strings, plus
  `engine` and no `model_name` (vllm/v1/metrics/loggers.py `log_metrics_info`). vLLM
  puts every CacheConfig field there; the sim sets the ones it has a meaning for.
- SGLang: `sglang:cache_hit_rate`, the hit share of the last prefill batch (a gauge, not
  a running ratio), and `sglang:cached_tokens_total`, the cached prompt tokens of
  finished requests (python/sglang/srt/metrics/collector.py).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import Final

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from narwhal.sim.options import SimOptions
from narwhal.sim.prefix_cache import CacheCounters

# vLLM's bucket boundaries (vllm/v1/metrics/loggers.py), rounded to what matters here.
_TTFT_BUCKETS: Final = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_ITL_BUCKETS: Final = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
_E2E_BUCKETS: Final = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip

# Our name -> (vLLM name, SGLang name); None: that engine has no such metric.
_NAMES: Final[dict[str, tuple[str | None, str | None]]] = {
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs"),
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs"),
    "kv": ("vllm:kv_cache_usage_perc", "sglang:token_usage"),
    "ttft": ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds"),
    "itl": ("vllm:inter_token_latency_seconds", "sglang:inter_token_latency_seconds"),
    "tpot": ("vllm:request_time_per_output_token_seconds", None),
    "e2e": ("vllm:e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds"),
    "prompt": ("vllm:prompt_tokens", "sglang:prompt_tokens"),
    "generation": ("vllm:generation_tokens", "sglang:generation_tokens"),
    "success": ("vllm:request_success", "sglang:num_requests"),
    "preemptions": ("vllm:num_preemptions", None),
    "cache_queries": ("vllm:prefix_cache_queries", None),
    "cache_hits": ("vllm:prefix_cache_hits", None),
    "cached": (None, "sglang:cached_tokens"),
    "hit_rate": (None, "sglang:cache_hit_rate"),
    "cache_config": ("vllm:cache_config_info", None),
}
_HELP: Final = {
    "running": "Number of requests in model execution batches.",
    "waiting": "Number of requests waiting to be processed.",
    "kv": "KV-cache usage. 1 means 100 percent usage.",
    "ttft": "Histogram of time to first token in seconds.",
    "itl": "Histogram of inter-token latency in seconds.",
    "tpot": "Histogram of time_per_output_token_seconds per request.",
    "e2e": "Histogram of e2e request latency in seconds.",
    "prompt": "Number of prefill tokens processed.",
    "generation": "Number of generation tokens processed.",
    "success": "Count of successfully processed requests.",
    "preemptions": "Cumulative number of preemption from the engine.",
    "cache_queries": "Prefix cache queries, in terms of number of queried tokens.",
    "cache_hits": "Prefix cache hits, in terms of number of cached tokens.",
    "cached": "Number of cached prompt tokens.",
    "hit_rate": "The prefix cache hit rate.",
    "cache_config": "Information of the LLMEngine CacheConfig",
}


class _Histogram:
    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip(self.bounds, self.counts, strict=False):
            running += count
            out.append((repr(bound), running))
        out.append(("+Inf", self.count))
        return out


Gauges = Callable[[], tuple[int, int, float]]  # running, waiting, kv usage 0-1


def cache_config_labels(options: SimOptions) -> dict[str, str]:
    """vllm:cache_config_info's labels: CacheConfig fields as `str()` prints them, in order."""
    return {
        "block_size": str(options.block_size),
        "gpu_memory_utilization": "0.92",
        "cache_dtype": "auto",
        "is_attention_free": "False",
        "num_gpu_blocks_override": "None",
        "sliding_window": "None",
        "enable_prefix_caching": str(options.enable_prefix_caching),
        "prefix_caching_hash_algo": "sha256",
        "num_gpu_blocks": str(options.num_gpu_blocks),
        "num_cpu_blocks": "None",
    }


class SimMetrics:
    def __init__(
        self,
        model: str,
        dialect: str,
        gauges: Gauges,
        cache: CacheCounters | None = None,
        cache_config: dict[str, str] | None = None,
    ) -> None:
        self.ttft = _Histogram(_TTFT_BUCKETS)
        self.itl = _Histogram(_ITL_BUCKETS)
        self.tpot = _Histogram(_ITL_BUCKETS)
        self.e2e = _Histogram(_E2E_BUCKETS)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.preemptions = 0
        self.cached_tokens = 0  # of finished requests (SGLang's count)
        self.cache = cache if cache is not None else CacheCounters()
        self.cache_config = cache_config or {}
        self.success: dict[str, int] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self, model, dialect, gauges))

    def finished(self, reason: str) -> None:
        self.success[reason] = self.success.get(reason, 0) + 1

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Collector(Collector):
    def __init__(self, metrics: SimMetrics, model: str, dialect: str, gauges: Gauges) -> None:
        self.metrics = metrics
        self.sglang = dialect == "sglang"
        self.labels = ["model_name"] if self.sglang else ["model_name", "engine"]
        self.values = [model] if self.sglang else [model, "0"]
        self.gauges = gauges

    def _name(self, key: str) -> str | None:
        vllm_name, sglang_name = _NAMES[key]
        return sglang_name if self.sglang else vllm_name

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        running, waiting, kv = self.gauges()
        for key, value in (("running", running), ("waiting", waiting), ("kv", kv)):
            name = self._name(key)
            if name is not None:
                gauge = GaugeMetricFamily(name, _HELP[key], labels=self.labels)
                gauge.add_metric(self.values, float(value))
                yield gauge
        for key, hist in (("ttft", m.ttft), ("itl", m.itl), ("tpot", m.tpot), ("e2e", m.e2e)):
            name = self._name(key)
            if name is not None:
                family = HistogramMetricFamily(name, _HELP[key], labels=self.labels)
                family.add_metric(self.values, hist.buckets(), sum_value=hist.total)
                yield family
        cache = m.cache
        name = self._name("hit_rate")
        if name is not None:
            gauge = GaugeMetricFamily(name, _HELP["hit_rate"], labels=self.labels)
            rate = cache.batch_hits / cache.batch_queries if cache.batch_queries else 0.0
            gauge.add_metric(self.values, rate)
            yield gauge
        name = self._name("cache_config")
        if name is not None and m.cache_config:
            labels = [*m.cache_config, "engine"]
            info = GaugeMetricFamily(name, _HELP["cache_config"], labels=labels)
            info.add_metric([*m.cache_config.values(), self.values[-1]], 1.0)
            yield info
        for key, total in (
            ("prompt", m.prompt_tokens),
            ("generation", m.generation_tokens),
            ("preemptions", m.preemptions),
            ("cache_queries", cache.queries),
            ("cache_hits", cache.hits),
            ("cached", m.cached_tokens),
        ):
            name = self._name(key)
            if name is not None:
                counter = CounterMetricFamily(name, _HELP[key], labels=self.labels)
                counter.add_metric(self.values, float(total))
                yield counter
        name = self._name("success")
        if name is not None:
            extra = [] if self.sglang else ["finished_reason"]
            counter = CounterMetricFamily(name, _HELP["success"], labels=self.labels + extra)
            if self.sglang:
                counter.add_metric(self.values, float(sum(m.success.values())))
            else:
                for reason in ("stop", "length", "abort"):
                    counter.add_metric([*self.values, reason], float(m.success.get(reason, 0)))
            yield counter
