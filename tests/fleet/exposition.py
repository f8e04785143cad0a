"""Engine /metrics pages for the fleet tests, written after PROTOCOL.md §5.1 and §6.1.

`VLLM_PAGE` and `SGLANG_PAGE` are short hand-written pages with known totals.
`vllm_page()` builds a full-size page the way vLLM does, with prometheus_client: every
V1 metric family (histograms with vLLM's bucket counts), `model_name`/`engine` labels
for several data-parallel engines, `_created` samples, and the process/GC/platform
collectors vLLM's default registry adds. It feeds the cross-check and the benchmark.
"""

from __future__ import annotations

import random

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _cache_info(engine: str) -> str:
    """The label set of one engine's vllm:cache_config_info line on VLLM_PAGE."""
    return (
        'block_size="16",cache_dtype="auto",enable_prefix_caching="True",'
        f'engine="{engine}",gpu_memory_utilization="0.9",num_cpu_blocks="None",'
        'num_gpu_blocks="58000",num_gpu_blocks_override="None"'
    )


VLLM_PAGE = f"""\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} 3.0
vllm:num_requests_running{{engine="1",model_name="{MODEL}"}} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="{MODEL}"}} 4.0
vllm:num_requests_waiting{{engine="1",model_name="{MODEL}"}} 1.0
# HELP vllm:num_requests_waiting_by_reason Number of requests waiting, by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{{engine="0",model_name="{MODEL}",reason="capacity"}} 3.0
vllm:num_requests_waiting_by_reason{{engine="0",model_name="{MODEL}",reason="deferred"}} 1.0
vllm:num_requests_waiting_by_reason{{engine="1",model_name="{MODEL}",reason="capacity"}} 1.0
vllm:num_requests_waiting_by_reason{{engine="1",model_name="{MODEL}",reason="deferred"}} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="{MODEL}"}} 0.5
vllm:kv_cache_usage_perc{{engine="1",model_name="{MODEL}"}} 0.25
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{engine="0",model_name="{MODEL}"}} 123456.0
vllm:prompt_tokens_total{{engine="1",model_name="{MODEL}"}} 98765.0
# HELP vllm:prompt_tokens_created Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_created gauge
vllm:prompt_tokens_created{{engine="0",model_name="{MODEL}"}} 1.7180000012e+09
vllm:prompt_tokens_created{{engine="1",model_name="{MODEL}"}} 1.7180000013e+09
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.001",model_name="{MODEL}"}} 0.0
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="{MODEL}"}} 41.0
vllm:time_to_first_token_seconds_count{{engine="0",model_name="{MODEL}"}} 41.0
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="{MODEL}"}} 6.25
"""

# VLLM_PAGE with the prefix-cache series of a vLLM V1 engine: queries 5000+3000 and hits
# 2048+1024 tokens; 58000 blocks of 16 tokens (the server's total, on every engine's line).
VLLM_CACHE_PAGE = (
    VLLM_PAGE
    + f"""\
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{engine="0",model_name="{MODEL}"}} 5000.0
vllm:prefix_cache_queries_total{{engine="1",model_name="{MODEL}"}} 3000.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{{engine="0",model_name="{MODEL}"}} 1.7180000012e+09
vllm:prefix_cache_queries_created{{engine="1",model_name="{MODEL}"}} 1.7180000013e+09
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{{engine="0",model_name="{MODEL}"}} 2048.0
vllm:prefix_cache_hits_total{{engine="1",model_name="{MODEL}"}} 1024.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{{_cache_info("0")}}} 1.0
vllm:cache_config_info{{{_cache_info("1")}}} 1.0
"""
)

SGLANG_PAGE = f"""\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{model_name="{MODEL}"}} 7.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{model_name="{MODEL}"}} 2.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{{model_name="{MODEL}"}} 0.42
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{{model_name="{MODEL}"}} 5000.0
"""

# vLLM's bucket boundaries, by count (vllm/v1/metrics/loggers.py): what matters for
# the cost of reading a page is how many lines there are.
_TTFT = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_ITL = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
_LATENCY = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
_TOKENS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)


# A cache config's fields as vLLM's CacheConfig.metrics_info() gives them (a selection).
CACHE_CONFIG = {
    "block_size": "16",
    "gpu_memory_utilization": "0.9",
    "cache_dtype": "auto",
    "is_attention_free": "False",
    "num_gpu_blocks_override": "None",
    "sliding_window": "None",
    "enable_prefix_caching": "True",
    "prefix_caching_hash_algo": "sha256",
    "num_gpu_blocks": "27000",
    "num_cpu_blocks": "None",
    "kv_cache_dtype_skip_layers": "[]",
}


def vllm_page(dp_engines: int = 2, seed: int = 0, *, legacy_kv_name: bool = False) -> str:
    """A full vLLM V1 /metrics page with random values; returns the text."""
    rng = random.Random(seed)
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    GCCollector(registry=registry)
    PlatformCollector(registry=registry)
    labels = ["model_name", "engine"]

    def gauge(name: str, extra: tuple[str, ...] = ()) -> Gauge:
        return Gauge(name, f"{name} gauge.", [*labels, *extra], registry=registry)

    def counter(name: str, extra: tuple[str, ...] = ()) -> Counter:
        return Counter(name, f"{name} counter.", [*labels, *extra], registry=registry)

    def histogram(name: str, buckets: tuple[float, ...]) -> Histogram:
        return Histogram(name, f"{name} histogram.", labels, buckets=buckets, registry=registry)

    gauges = {
        "running": gauge("vllm:num_requests_running"),
        "waiting": gauge("vllm:num_requests_waiting"),
        "kv": gauge("vllm:gpu_cache_usage_perc" if legacy_kv_name else "vllm:kv_cache_usage_perc"),
    }
    by_reason = gauge("vllm:num_requests_waiting_by_reason", ("reason",))
    sleep_state = gauge("vllm:engine_sleep_state", ("sleep_state",))
    counters = [
        counter(name)
        for name in (
            "vllm:num_preemptions",
            "vllm:prompt_tokens",
            "vllm:generation_tokens",
            "vllm:prefix_cache_queries",
            "vllm:prefix_cache_hits",
        )
    ]
    success = counter("vllm:request_success", ("finished_reason",))
    # An info metric: no model_name, the engine label last (loggers.py log_metrics_info).
    cache_info = Gauge(
        "vllm:cache_config_info",
        "Information of the LLMEngine CacheConfig",
        [*CACHE_CONFIG, "engine"],
        registry=registry,
    )
    histograms = [
        histogram("vllm:iteration_tokens_total", _TOKENS),
        histogram("vllm:request_prompt_tokens", _TOKENS),
        histogram("vllm:request_generation_tokens", _TOKENS),
        histogram("vllm:request_max_num_generation_tokens", _TOKENS),
        histogram("vllm:request_params_n", (1, 2, 5, 10, 20)),
        histogram("vllm:request_params_max_tokens", _TOKENS),
        histogram("vllm:time_to_first_token_seconds", _TTFT),
        histogram("vllm:inter_token_latency_seconds", _ITL),
        histogram("vllm:request_time_per_output_token_seconds", _ITL),
        histogram("vllm:e2e_request_latency_seconds", _LATENCY),
        histogram("vllm:request_queue_time_seconds", _LATENCY),
        histogram("vllm:request_inference_time_seconds", _LATENCY),
        histogram("vllm:request_prefill_time_seconds", _LATENCY),
        histogram("vllm:request_decode_time_seconds", _LATENCY),
    ]
    for dp in range(dp_engines):
        values = [MODEL, str(dp)]
        gauges["running"].labels(*values).set(rng.randint(0, 256))
        gauges["waiting"].labels(*values).set(rng.randint(0, 64))
        gauges["kv"].labels(*values).set(rng.random())
        for reason in ("capacity", "deferred"):
            by_reason.labels(*values, reason).set(rng.randint(0, 32))
        for state in ("awake", "weights_offloaded", "discard_all"):
            sleep_state.labels(*values, state).set(1 if state == "awake" else 0)
        for c in counters:
            c.labels(*values).inc(rng.randint(0, 10**6))
        cache_info.labels(*CACHE_CONFIG.values(), str(dp)).set(1)
        for reason in ("stop", "length", "abort", "error", "repetition"):
            success.labels(*values, reason).inc(rng.randint(0, 10**4))
        for h in histograms:
            child = h.labels(*values)
            for _ in range(20):
                child.observe(rng.expovariate(0.5))
    return generate_latest(registry).decode()
